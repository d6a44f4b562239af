package frontdoor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"net/url"
	"strings"
	"sync"

	"github.com/pinnedd/pinnedd/internal/httpx"
)

// outbound is one forward as a carrier sends it: the client's request r
// (its method, header, body and context), the buffered body (nil: r's
// body, if any, streams), the hop's rule, and where it goes: the owner's
// node (scheme, addr) and the escaped path of its owner-side route; the
// query is r's.
type outbound struct {
	r            *http.Request
	body         []byte
	hop          httpx.Hop
	scheme, addr string
	path         string
	got1xx       func(int, http.Header) // an informational answer, passed on
}

// carrier sends a forward's head and body to the owner's node and gives
// back the owner's answer: its head read, its body to follow. There are
// two, the wire carrier (the head written from the inbound request, no
// clones) and net/http's Transport; whichever sent it, writeAnswer
// writes the answer back and forwardError its failure.
type carrier interface {
	roundTrip(out outbound) (*http.Response, error)
}

var (
	_ carrier = wireCarrier{}
	_ carrier = stdCarrier{}
)

// errNotWire: the wire carrier sent nothing; the other carrier takes it.
var errNotWire = errors.New("not for the wire carrier")

// wireCarrier writes the request head itself, straight from the inbound
// request (no Request or Header clones), and reads the response head on
// this goroutine (httpx.SyncTransport.RoundTripHead). It takes a request
// with no body or a buffered one, no Upgrade, over its own transport
// (forwarder.fastForwardable); it sends nothing, and says errNotWire, if
// a field cannot be written safely.
type wireCarrier struct{ sync *httpx.SyncTransport }

var wireBufs = sync.Pool{New: func() any { b := make([]byte, 0, 2<<10); return &b }}

func (c wireCarrier) roundTrip(out outbound) (*http.Response, error) {
	hop := out.hop
	if hop.Host == "" {
		hop.Host = out.addr // as http.Request.Write does
	}
	bp := wireBufs.Get().(*[]byte)
	wire, ok := hop.AppendHeader((*bp)[:0], out.r.Method, withQuery(out.path, out.r.URL.RawQuery), out.r.Header, out.body)
	if !ok {
		*bp = wire[:0]
		wireBufs.Put(bp)
		return nil, errNotWire
	}
	resp, err := c.sync.RoundTripHead(out.addr, out.r, wire, len(out.body) == 0, out.got1xx)
	if cap(wire) <= 64<<10 {
		*bp = wire[:0]
		wireBufs.Put(bp)
	}
	return resp, err
}

// stdCarrier is net/http's Transport (the peer transport, or one a test
// supplied), for what the wire carrier does not take: an Upgrade, a
// streamed or large upload, an owner over TLS without the cluster's.
type stdCarrier struct{ rt http.RoundTripper }

func (c stdCarrier) roundTrip(out outbound) (*http.Response, error) {
	r := out.r
	ctx := r.Context()
	if out.got1xx != nil {
		ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
			if code != http.StatusSwitchingProtocols {
				out.got1xx(code, http.Header(h))
			}
			return nil
		}})
	}
	// A shallow copy: every field of r it changes is replaced, not written
	// through, so r is left as it was (its header is read, never cloned).
	req := r.WithContext(ctx)
	req.RequestURI, req.Close = "", false
	req.Host = r.Host
	req.Header = out.hop.Header(r.Header)
	req.URL = &url.URL{Scheme: out.scheme, Host: out.addr, Path: out.path, RawQuery: r.URL.RawQuery}
	if unescaped, err := url.PathUnescape(req.URL.Path); err == nil && unescaped != req.URL.Path {
		req.URL.RawPath, req.URL.Path = req.URL.Path, unescaped
	}
	if !cleanQuery(req.URL.RawQuery) {
		// What a reverse proxy sends for a query it cannot pass as it
		// is (a ';', a bad escape): the parsable parameters, encoded.
		v, _ := url.ParseQuery(req.URL.RawQuery)
		req.URL.RawQuery = v.Encode()
	}
	switch {
	case out.body != nil:
		req.Body, req.ContentLength = io.NopCloser(bytes.NewReader(out.body)), int64(len(out.body))
	case r.ContentLength == 0:
		req.Body = nil
	}
	return c.rt.RoundTrip(req)
}

// got1xx passes an owner's informational answer on to the client.
func got1xx(w http.ResponseWriter) func(int, http.Header) {
	return func(code int, h http.Header) {
		dst := w.Header()
		for k, vs := range h {
			dst[k] = append(dst[k], vs...)
		}
		w.WriteHeader(code)
		clear(dst)
	}
}

// writeAnswer writes the owner's answer resp to the client's request r,
// whichever carrier brought it: the one place for the response's
// hop-by-hop fields, the owner's refusals and held streams
// (checkResponse), the body's copy and flushes, trailers, a switch of
// protocols, and the connection's move to the kept-alive loop. An error
// is the forward's failure (forwardError answers it); a body cut short
// ends the client's connection too.
func (fw *forwarder) writeAnswer(w http.ResponseWriter, r *http.Request, info *fwdInfo, resp *http.Response) error {
	if resp.StatusCode == http.StatusSwitchingProtocols {
		return fw.switchProtocols(w, r, resp)
	}
	stripHopByHop(resp.Header)
	if err := fw.checkResponse(info, resp); err != nil {
		_ = resp.Body.Close()
		return err
	}
	dst := w.Header()
	for k, vs := range resp.Header {
		dst[k] = append(dst[k], vs...)
	}
	announced := len(resp.Trailer)
	if announced > 0 {
		keys := make([]string, 0, announced)
		for k := range resp.Trailer {
			keys = append(keys, k)
		}
		dst.Add("Trailer", strings.Join(keys, ", "))
	}
	w.WriteHeader(resp.StatusCode)
	if err := fw.copyBody(w, resp); err != nil {
		_ = resp.Body.Close()
		// The response is cut short, so the client's connection must
		// end too.
		panic(http.ErrAbortHandler)
	}
	_ = resp.Body.Close() // now, to read the trailers
	// A connection whose request the wire carrier took may move to the
	// loop, which carries the next ones alike; one whose owner the loop
	// cannot reach (advertised by name: the loop does not resolve names)
	// stays with net/http: the loop would give every request back.
	if info.wire && resp.ContentLength >= 0 && announced == 0 && len(resp.Trailer) == 0 && !info.rq.keyed &&
		fw.ownerBase(info.owner).host != "" && fw.keep.adopt(w, r) {
		return nil // the connection's next requests go to the kept-alive loop
	}
	if len(resp.Trailer) > 0 {
		// Chunked, so net/http does not compute a length for a short body.
		_ = http.NewResponseController(w).Flush()
	}
	if len(resp.Trailer) == announced {
		for k, vs := range resp.Trailer {
			dst[k] = append(dst[k], vs...)
		}
		return nil
	}
	for k, vs := range resp.Trailer {
		for _, v := range vs {
			dst.Add(http.TrailerPrefix+k, v)
		}
	}
	return nil
}

// stripHopByHop drops the response's hop-by-hop fields: those its
// Connection field names, and the standard ones.
func stripHopByHop(h http.Header) {
	for _, v := range h["Connection"] {
		for t := range strings.SplitSeq(v, ",") {
			if t = strings.TrimSpace(t); t != "" {
				h.Del(t)
			}
		}
	}
	for k := range httpx.HopByHop {
		delete(h, k)
	}
}

// copyBody copies the response body to w: a stream (unknown length, or
// server-sent events) flushed per write, the rest left to net/http's
// buffering.
func (fw *forwarder) copyBody(w http.ResponseWriter, resp *http.Response) error {
	stream := resp.ContentLength == -1
	if !stream {
		const sse = "text/event-stream"
		if ct := strings.TrimLeft(resp.Header.Get("Content-Type"), " \t"); len(ct) >= len(sse) && strings.EqualFold(ct[:len(sse)], sse) {
			base, _, _ := mime.ParseMediaType(ct)
			stream = base == "text/event-stream"
		}
	}
	rc := http.NewResponseController(w)
	if stream {
		_ = rc.Flush()
	}
	buf := fw.bufs.Get()
	defer fw.bufs.Put(buf)
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return werr
			}
			if stream {
				_ = rc.Flush()
			}
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			return rerr
		}
	}
}

// switchProtocols carries an owner's 101 to the client and then the
// switched connection both ways until either side ends it: only to the
// protocol the client asked for, over a connection the transport hands
// over whole (net/http's, for an Upgrade).
func (fw *forwarder) switchProtocols(w http.ResponseWriter, r *http.Request, resp *http.Response) error {
	asked, got := httpx.UpgradeType(r.Header), httpx.UpgradeType(resp.Header)
	if asked == "" || !strings.EqualFold(asked, got) {
		_ = resp.Body.Close()
		return fmt.Errorf("owner switched protocols to %q, asked %q", got, asked)
	}
	back, ok := resp.Body.(io.ReadWriteCloser)
	if !ok {
		_ = resp.Body.Close()
		return errors.New("owner switched protocols over a connection that cannot be carried")
	}
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		_ = back.Close()
		return fmt.Errorf("switch protocols: %w", err)
	}
	defer conn.Close()
	defer back.Close()
	// The client's request may end (a shutdown) before either side closes.
	stop := context.AfterFunc(r.Context(), func() { _ = back.Close() })
	defer stop()
	dst := w.Header()
	for k, vs := range resp.Header {
		dst[k] = append(dst[k], vs...)
	}
	resp.Header, resp.Body = dst, nil
	if err := resp.Write(brw); err != nil {
		return nil // the client left; nothing to answer
	}
	if err := brw.Flush(); err != nil {
		return nil
	}
	// Bounded as a kept-alive connection is: closed once quiet both ways.
	bounded := httpx.IdleConn(conn, fw.upgradeIdle)
	defer bounded.Close()
	client := io.MultiReader(io.LimitReader(brw, int64(brw.Reader.Buffered())), bounded)
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(back, client); done <- struct{}{} }()
	go func() { _, _ = io.Copy(bounded, back); done <- struct{}{} }()
	<-done
	return nil
}
