package relay

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"net/textproto"
	"strings"
	"testing"
)

// Differential fuzzing of the loop's parsers against net/http's: whatever
// the loop takes itself, net/http reads the same way (method, target,
// host, fields, body length); what the loop is unsure of it leaves to
// net/http (the request goes back unread, the response is refused), which
// is always safe. Seeds: request-smuggling shapes (CL.TE, TE.CL, odd lengths, bare LF/CR/NUL, ...).

var smuggleSeeds = []string{
	"GET / HTTP/1.1\r\nHost: h\r\n\r\n",
	"GET /a?b=1 HTTP/1.1\r\nHost: h:1\r\nUser-Agent: u\r\nX-Empty:\r\n\r\n",
	"POST /p HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabcGET / HTTP/1.1\r\n",
	// CL.TE and TE.CL
	"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nG",
	"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n8\r\nSMUGGLED\r\n0\r\n\r\n",
	// duplicate and odd lengths
	"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
	"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1, 1\r\n\r\na",
	"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: +1\r\n\r\na",
	"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 0x1\r\n\r\na",
	"POST / HTTP/1.1\r\nHost: h\r\nContent-Length:  01 \r\n\r\na",
	"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 99999999999999999999\r\n\r\n",
	// odd Transfer-Encodings
	"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding : chunked\r\n\r\n0\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding:\tchunked\r\n\r\n0\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: xchunked\r\n\r\n0\r\n\r\n",
	// obs-fold, bare LF/CR/NUL
	"GET / HTTP/1.1\r\nHost: h\r\nX-A: 1\r\n 2\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: h\r\n Content-Length: 5\r\n\r\n",
	"GET / HTTP/1.1\nHost: h\n\n",
	"GET / HTTP/1.1\r\nHost: h\r\n\n",
	"GET / HTTP/1.1\r\nHost: h\rX-A: 1\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: h\r\nX-A: 1\x002\r\n\r\n",
	"GET /\x00 HTTP/1.1\r\nHost: h\r\n\r\n",
	"\n\n\n\n",
	"\r\nGET / HTTP/1.1\r\nHost: h\r\n\r\n",
	// over-long heads, odd targets and hosts
	"GET / HTTP/1.1\r\nHost: h\r\nX-Big: " + strings.Repeat("a", maxHead) + "\r\n\r\n",
	"GET /a%zz HTTP/1.1\r\nHost: h\r\n\r\n",
	"GET http://h/ HTTP/1.1\r\nHost: h\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: h\r\nHost: i\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: a@b\r\n\r\n",
	"POST /p HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\nz",
	"GET / HTTP/1.1\r\nHost: h\r\nConnection: keep-alive, Upgrade\r\nUpgrade: websocket\r\n\r\n",
}

func FuzzParseRequest(f *testing.F) {
	for _, s := range smuggleSeeds {
		f.Add([]byte(s), uint16(len(s)/2))
	}
	f.Fuzz(func(t *testing.T, in []byte, split uint16) {
		var h ReqHead
		n, need, ok := parseRequest(in, &headScan{}, &h, maxLoopBody)
		// The same verdict however the bytes arrive: in two reads.
		var h2 ReqHead
		var s headScan
		cut := min(int(split), len(in))
		n2, need2, ok2 := parseRequest(in[:cut], &s, &h2, maxLoopBody)
		if ok2 && (need2 || n2 == 0) {
			n2, need2, ok2 = parseRequest(in, &s, &h2, maxLoopBody)
		} else if ok2 && cut < len(in) {
			n2, need2, ok2 = n, need, ok // whole within the first read: done
		}
		if ok2 != ok || need2 != need || n2 != n {
			t.Fatalf("in two reads (cut at %d): n %d need %v ok %v; whole: %d %v %v", cut, n2, need2, ok2, n, need, ok)
		}
		if !ok || need {
			return // net/http reads it, or more bytes are due
		}
		req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(in)))
		if err != nil {
			t.Fatalf("the loop takes %q, net/http refuses it: %v", in[:n], err)
		}
		if req.Method != h.Method || req.RequestURI != h.Target || req.Host != h.Host {
			t.Fatalf("%q: loop %q %q %q, net/http %q %q %q", in[:n], h.Method, h.Target, h.Host, req.Method, req.RequestURI, req.Host)
		}
		body, err := io.ReadAll(req.Body)
		if err != nil || !bytes.Equal(body, h.Body) {
			t.Fatalf("%q: body %q (%v), loop %q", in[:n], body, err, h.Body)
		}
		if req.Close || len(req.TransferEncoding) > 0 {
			t.Fatalf("%q: net/http reads close %v, transfer-encoding %v", in[:n], req.Close, req.TransferEncoding)
		}
		got := map[string][]string{}
		for _, fl := range h.Fields {
			k := textproto.CanonicalMIMEHeaderKey(fl.Name)
			got[k] = append(got[k], fl.Value)
		}
		for k, vs := range req.Header {
			if k == "Expect" || k == "Connection" {
				continue // the loop answers 100-continue and keeps alive itself
			}
			if strings.Join(got[k], "\x00") != strings.Join(vs, "\x00") {
				t.Fatalf("%q: field %s: loop %q, net/http %q", in[:n], k, got[k], vs)
			}
			delete(got, k)
		}
		if len(got) > 0 {
			t.Fatalf("%q: fields only the loop saw: %q", in[:n], got)
		}
	})
}

var responseSeeds = []string{
	"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n{\"value\":1}",
	"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\nConnection: close, X-Hop\r\nX-Hop: 1\r\n\r\n0\r\n\r\n",
	"HTTP/1.1 204\r\n\r\n",
	"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
	"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
	"HTTP/1.1 200 OK\r\nContent-Length: 1, 1\r\n\r\n",
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
	"HTTP/1.1 200 OK\nContent-Length: 0\n\n",
	"HTTP/1.1 200 OK\r\nX-A: 1\n2\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nX-A: 1\r2\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nX-A: 1\x002\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nX-A: 1\r\n 2\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nX: " + strings.Repeat("a", maxRespHead) + "\r\n\r\n",
	"HTTP/1.0 200 OK\r\n\r\n",
	"HTTP/1.1 2000 OK\r\n\r\n",
}

func FuzzParseResponse(f *testing.F) {
	for _, s := range responseSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		r, need, ok := parseResponse(in, &headScan{}, "X-Refused", nil)
		if !ok || need {
			return // refused (an upstream failure), or more bytes are due
		}
		resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(in)), nil)
		if err != nil {
			t.Fatalf("the loop relays %q, net/http refuses it: %v", in[:r.headLen], err)
		}
		if resp.StatusCode != r.status {
			t.Fatalf("%q: status %d, net/http %d", in[:r.headLen], r.status, resp.StatusCode)
		}
		if r.status < 200 || r.status == 204 || r.status == 304 {
			return // no body, whatever the fields say
		}
		chunked := len(resp.TransferEncoding) == 1 && resp.TransferEncoding[0] == "chunked"
		if chunked != r.chunked || !chunked && resp.ContentLength != r.clen {
			t.Fatalf("%q: chunked %v length %d, net/http %v %d", in[:r.headLen], r.chunked, r.clen, resp.TransferEncoding, resp.ContentLength)
		}
		// The head the loop sends on reads as the same response.
		again, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(r.head)), nil)
		if err != nil || again.StatusCode != r.status || again.ContentLength != resp.ContentLength ||
			strings.Join(again.TransferEncoding, ",") != strings.Join(resp.TransferEncoding, ",") {
			t.Fatalf("%q: the head sent on, %q, reads differently: %v", in[:r.headLen], r.head, err)
		}
	})
}

func FuzzChunkScanner(f *testing.F) {
	for _, s := range []string{
		"0\r\n\r\n",
		"5\r\nhello\r\n0\r\n\r\n",
		"5;ext=1\r\nhello\r\n1A\r\n" + strings.Repeat("x", 26) + "\r\n0\r\n\r\n",
		"3\r\n0\r\n\r\n0\r\n\r\n",
		"5\r\nhello\r\n0\r\nX-Trailer: 1\r\nY: 2\r\n\r\n",
		"5\nhello\n0\n\n",
		"5\r\nhello\n0\r\n\r\n",
		"5\rhello\r\n0\r\n\r\n",
		"fffffffffffffffff\r\n",
		"0\r\nX: 1\n\r\n",
		"0\r\n\r\nGET / HTTP/1.1\r\n",
		"-1\r\n\r\n",
		" 5\r\nhello\r\n0\r\n\r\n",
	} {
		f.Add([]byte(s), uint16(len(s)/2))
	}
	head := "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
	f.Fuzz(func(t *testing.T, body []byte, split uint16) {
		var sc chunkScanner
		end, err := sc.scan(body)
		// Fed in two pieces, the scanner ends at the same place.
		var sc2 chunkScanner
		cut := min(int(split), len(body))
		end2, err2 := sc2.scan(body[:cut])
		if err2 == nil && end2 < 0 {
			end2, err2 = sc2.scan(body[cut:])
			if end2 >= 0 {
				end2 += cut
			}
		}
		if (err == nil) != (err2 == nil) || err == nil && end != end2 {
			t.Fatalf("%q cut at %d: end %d (%v), whole %d (%v)", body, cut, end2, err2, end, err)
		}
		in := bytes.NewReader(append([]byte(head), body...))
		br := bufio.NewReader(in)
		resp, rerr := http.ReadResponse(br, nil)
		if rerr != nil {
			t.Fatal(rerr)
		}
		if _, rerr = io.Copy(io.Discard, resp.Body); rerr != nil {
			// net/http refuses the body; the scanner passes bytes on
			// unchanged, so the client (net/http too) refuses it as well.
			return
		}
		consumed := len(head) + len(body) - br.Buffered() - in.Len() - len(head)
		if err != nil || end != consumed {
			t.Fatalf("%q: net/http reads a body of %d bytes; the scanner: end %d (%v)", body, consumed, end, err)
		}
	})
}
