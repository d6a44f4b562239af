// Package relay is the front door's fast path: HTTP/1.1 connections
// served from event loops (epoll, Linux only; Supported says whether this
// platform has them) instead of net/http's two goroutines per connection.
// It has two loops, both behind narrow types its one caller (package
// the front door's forwarder) drives:
//
//   - Loop carries held response streams (server-sent events, long polls)
//     that a proxy took out of net/http: it copies each stream's body from
//     the upstream connection to the client's as it arrives, byte for byte
//     (chunked or close-delimited), and ends with both connections closed.
//     It never reads from the client.
//   - Conns serves kept-alive client connections: it reads each next
//     request, asks a Router where it goes (a Forward: an upstream address
//     and the request's bytes), sends it over pooled upstream connections
//     and relays the response; whatever the Router does not take goes back
//     to net/http unread (HandBack).
//
// Neither interprets more of a message than framing needs, and both
// refuse (hand back, or fail) anything they cannot frame exactly as
// net/http would. A client connection that holds a slot under a
// connection cap (it answers Detach) keeps it while a loop holds its
// socket (slot.go).
package relay

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"
)

// Errors of the relay.
var (
	// ErrClosed: the loop has shut down; it takes no more streams.
	ErrClosed = errors.New("relay closed")
	// ErrUnsupported: this platform has no relay loop.
	ErrUnsupported = errors.New("relay not supported on this platform")
	// ErrNotSocket: a connection has no file descriptor to hand over.
	ErrNotSocket = errors.New("connection is not a socket")
	// errMalformedChunk: the upstream's chunked framing is broken.
	errMalformedChunk = errors.New("malformed chunked body")
	// errNotAdoptable: a TLS connection given to Conns.Adopt is not
	// net/http's to give: its handshake is not done, a loop holds it, or
	// it is closed.
	errNotAdoptable = errors.New("tls connection not adoptable")
)

// Reason says why a relayed stream ended.
type Reason int

// Reasons a stream ends.
const (
	// Complete: the body ended (its last chunk, or upstream EOF for a
	// close-delimited body) and all of it reached the client's socket.
	Complete Reason = iota
	// ClientGone: the client hung up or its connection failed; the
	// upstream connection is closed so the owner sees it too.
	ClientGone
	// UpstreamFailed: the upstream connection failed, or cut a chunked
	// body short, or framed it wrongly; the client connection is closed.
	UpstreamFailed
	// Shutdown: the loop closed with the stream open.
	Shutdown
)

func (r Reason) String() string {
	switch r {
	case Complete:
		return "complete"
	case ClientGone:
		return "client-gone"
	case UpstreamFailed:
		return "upstream-failed"
	case Shutdown:
		return "shutdown"
	}
	return fmt.Sprintf("reason(%d)", int(r))
}

// Stream is one held response, taken from net/http and handed to Loop.Add.
type Stream struct {
	// Client is the hijacked client connection; Upstream the connection
	// the response arrives on. Both must be plain sockets.
	Client, Upstream net.Conn
	// Head goes to the client first (see Head); Body follows: the raw
	// body bytes already read from the upstream.
	Head, Body []byte
	// Chunked: the body is chunked and ends at its last chunk; otherwise
	// it ends when the upstream closes.
	Chunked bool
	// Done, if set, runs on the loop's goroutine when the stream ends,
	// with both connections closed. It must be quick and must not call
	// into the Loop.
	Done func(Reason)
}

// Head renders the response head a relayed stream starts with: the
// status, header (already stripped of hop-by-hop fields, as
// httputil.ReverseProxy does before ModifyResponse), the body's framing
// as the upstream sent it, and Connection: close, since a connection taken
// from net/http cannot go back to it for another request.
func Head(resp *http.Response, header http.Header) []byte {
	var b strings.Builder
	text := http.StatusText(resp.StatusCode)
	if s, ok := strings.CutPrefix(resp.Status, fmt.Sprintf("%03d ", resp.StatusCode)); ok && s != "" {
		text = s
	}
	fmt.Fprintf(&b, "HTTP/1.1 %03d %s\r\n", resp.StatusCode, text)
	h := header.Clone()
	if h == nil {
		h = http.Header{}
	}
	if _, ok := h["Date"]; !ok {
		h.Set("Date", time.Now().UTC().Format(http.TimeFormat))
	}
	if Chunked(resp) {
		h.Set("Transfer-Encoding", "chunked")
		if len(resp.Trailer) > 0 {
			keys := make([]string, 0, len(resp.Trailer))
			for k := range resp.Trailer {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			h.Set("Trailer", strings.Join(keys, ", "))
		}
	}
	h.Set("Connection", "close")
	_ = h.Write(&b)
	b.WriteString("\r\n")
	return []byte(b.String())
}

// Chunked reports whether resp's body is chunked on the wire.
func Chunked(resp *http.Response) bool {
	return len(resp.TransferEncoding) > 0 && resp.TransferEncoding[0] == "chunked"
}

// Ends reports whether a chunked body is complete within raw, its first
// bytes on the wire: such a response is not held, and is better left to a
// plain proxy that keeps both connections alive.
func Ends(raw []byte) bool {
	var sc chunkScanner
	end, err := sc.scan(raw)
	return err == nil && end >= 0
}

// chunkScanner finds where a chunked body ends, fed its bytes as they
// pass, without changing them.
type chunkScanner struct {
	state  uint8
	digits uint8
	size   uint64 // of the chunk being read; then what is left of it
}

const (
	csSize        = iota // chunk-size hex digits
	csExt                // rest of the size line (extensions, CR) up to LF
	csData               // chunk data
	csDataEnd            // CRLF after the data, up to LF
	csTrailer            // start of a trailer line, or the final CRLF
	csTrailerCR          // CR at the start of a line: the end, once LF follows
	csTrailerLine        // inside a trailer field, up to LF
	csDone
)

// scan consumes p and returns the index just past the body's last byte if
// the body ends within p, else -1.
func (c *chunkScanner) scan(p []byte) (int, error) {
	for i := 0; i < len(p); i++ {
		b := p[i]
		switch c.state {
		case csSize:
			if v, ok := unhex(b); ok {
				if c.digits == 15 { // a chunk of 2^60 bytes is a broken stream
					return -1, errMalformedChunk
				}
				c.size, c.digits = c.size<<4|uint64(v), c.digits+1
				continue
			}
			if c.digits == 0 {
				return -1, errMalformedChunk
			}
			if b == '\n' {
				c.endSizeLine()
			} else {
				c.state = csExt
			}
		case csExt:
			if b == '\n' {
				c.endSizeLine()
			}
		case csData:
			n := min(uint64(len(p)-i), c.size)
			c.size -= n
			i += int(n) - 1
			if c.size == 0 {
				c.state = csDataEnd
			}
		case csDataEnd:
			if b == '\n' {
				c.state, c.digits = csSize, 0
			}
		case csTrailer:
			switch b {
			case '\n':
				c.state = csDone
				return i + 1, nil
			case '\r':
				c.state = csTrailerCR
			default:
				c.state = csTrailerLine
			}
		case csTrailerCR:
			if b == '\n' {
				c.state = csDone
				return i + 1, nil
			}
			c.state = csTrailerLine
		case csTrailerLine:
			if b == '\n' {
				c.state = csTrailer
			}
		case csDone:
			return i, nil
		}
	}
	if c.state == csDone {
		return 0, nil
	}
	return -1, nil
}

func (c *chunkScanner) endSizeLine() {
	if c.size == 0 {
		c.state = csTrailer
	} else {
		c.state = csData
	}
}

func unhex(b byte) (byte, bool) {
	switch {
	case '0' <= b && b <= '9':
		return b - '0', true
	case 'a' <= b && b <= 'f':
		return b - 'a' + 10, true
	case 'A' <= b && b <= 'F':
		return b - 'A' + 10, true
	}
	return 0, false
}
