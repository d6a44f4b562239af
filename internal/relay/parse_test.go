package relay

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// parseRequest takes the plain case whole or asks for more; anything
// malformed or unusual is left to net/http (ok false), never half-parsed.
func TestParseRequest(t *testing.T) {
	type want struct {
		n        int
		need, ok bool
		method   string
		target   string
		host     string
		fields   []Field
		body     string
		expect   bool
	}
	long := "GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", maxHead) + "\r\n\r\n"
	cases := map[string]struct {
		in string
		want
	}{
		"plain": {"GET /a?b=1 HTTP/1.1\r\nHost: h:1\r\nUser-Agent: u\r\nX-Empty:\r\n\r\n",
			want{ok: true, method: "GET", target: "/a?b=1", host: "h:1", fields: []Field{{Name: "User-Agent", Value: "u"}, {Name: "X-Empty", Value: ""}}}},
		"values trimmed of spaces and tabs": {"GET / HTTP/1.1\r\nhost:  h \t\r\nX-A:\t 1 2 \r\n\r\n",
			want{ok: true, method: "GET", target: "/", host: "h", fields: []Field{{Name: "X-A", Value: "1 2"}}}},
		"obs-text in a value": {"GET / HTTP/1.1\r\nHost: h\r\nX-A: caf\xc3\xa9\r\n\r\n",
			want{ok: true, method: "GET", target: "/", host: "h", fields: []Field{{Name: "X-A", Value: "caf\xc3\xa9"}}}},
		"body and the next request": {"POST /p HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabcGET",
			want{ok: true, method: "POST", target: "/p", host: "h", fields: []Field{{Name: "Content-Length", Value: "3"}}, body: "abc"}},
		"expect 100-continue": {"POST /p HTTP/1.1\r\nHost: h\r\nExpect: 100-Continue\r\nContent-Length: 1\r\n\r\nz",
			want{ok: true, method: "POST", target: "/p", host: "h", fields: []Field{{Name: "Content-Length", Value: "1"}}, body: "z", expect: true}},
		"keep-alive": {"GET / HTTP/1.1\r\nConnection: Keep-Alive\r\nHost: h\r\n\r\n",
			want{ok: true, method: "GET", target: "/", host: "h"}},

		"head not whole":           {"GET / HTTP/1.1\r\nHost: h\r\n", want{need: true, ok: true}},
		"body not whole":           {"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nab", want{need: true, ok: true}},
		"head too long, not whole": {strings.Repeat("a", maxHead+1), want{}},
		"head too long":            {long, want{}},

		"empty":                  {"\r\n\r\n", want{}},
		"leading empty line":     {"\r\nGET / HTTP/1.1\r\nHost: h\r\n\r\n", want{}},
		"HTTP/1.0":               {"GET / HTTP/1.0\r\nHost: h\r\n\r\n", want{}},
		"lower-case method":      {"get / HTTP/1.1\r\nHost: h\r\n\r\n", want{}},
		"absolute target":        {"GET http://h/ HTTP/1.1\r\nHost: h\r\n\r\n", want{}},
		"space in target":        {"GET /a b HTTP/1.1\r\nHost: h\r\n\r\n", want{}},
		"no host":                {"GET / HTTP/1.1\r\n\r\n", want{}},
		"two hosts":              {"GET / HTTP/1.1\r\nHost: h\r\nHost: h\r\n\r\n", want{}},
		"host with a space":      {"GET / HTTP/1.1\r\nHost: h h\r\n\r\n", want{}},
		"bare LF in a field":     {"GET / HTTP/1.1\r\nHost: h\nX-A: 1\r\n\r\n", want{}},
		"head ends in a bare LF": {"GET / HTTP/1.1\r\nHost: h\r\n\n", want{}},
		"bare LF, not whole":     {"GET / HTTP/1.1\n", want{}},
		"a bare LF first":        {"\n", want{}},
		"bare CR in a value":     {"GET / HTTP/1.1\r\nHost: h\r\nX-A: 1\r2\r\n\r\n", want{}},
		"control in a value":     {"GET / HTTP/1.1\r\nHost: h\r\nX-A: 1\x002\r\n\r\n", want{}},
		"DEL in a value":         {"GET / HTTP/1.1\r\nHost: h\r\nX-A: 1\x7f\r\n\r\n", want{}},
		"obs-fold":               {"GET / HTTP/1.1\r\nHost: h\r\nX-A: 1\r\n 2\r\n\r\n", want{}},
		"space before colon":     {"GET / HTTP/1.1\r\nHost : h\r\n\r\n", want{}},
		"no colon":               {"GET / HTTP/1.1\r\nHost: h\r\nX-A\r\n\r\n", want{}},
		"two lengths":            {"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\na", want{}},
		"signed length":          {"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: +1\r\n\r\na", want{}},
		"body too long":          {"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 65537\r\n\r\n", want{}},
		"chunked":                {"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n", want{}},
		"upgrade":                {"GET / HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\n\r\n", want{}},
		"connection close":       {"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n", want{}},
		"expect something else":  {"POST / HTTP/1.1\r\nHost: h\r\nExpect: x\r\n\r\n", want{}},
	}
	for name, tc := range cases {
		var h ReqHead
		h.Fields = []Field{{Name: "Stale", Value: "field"}}
		n, need, ok := parseRequest([]byte(tc.in), &headScan{}, &h, maxLoopBody)
		got := want{n: n, need: need, ok: ok}
		if ok && !need {
			got.method, got.target, got.host, got.fields, got.body, got.expect = h.Method, h.Target, h.Host, h.Fields, string(h.Body), h.expect
			if len(got.fields) == 0 {
				got.fields = nil
			}
		}
		w := tc.want
		if w.ok && !w.need {
			w.n = strings.Index(tc.in, "\r\n\r\n") + 4 + len(w.body) // the head and body, not what follows
		}
		if !reflect.DeepEqual(got, w) {
			t.Errorf("%s: got %+v, want %+v", name, got, w)
		}
	}
}

// fieldValue's eight-bytes-at-a-time check agrees with the byte-by-byte
// rule for every byte at every place, alone and beside any other.
func TestFieldValue(t *testing.T) {
	base := []byte(strings.Repeat("a", 19))
	for c := range 256 {
		for at := range base {
			b := append([]byte(nil), base...)
			b[at] = byte(c)
			want := c >= ' ' && c != 0x7f || c == '\t'
			if got := fieldValue(string(b)); got != want {
				t.Fatalf("byte %#x at %d: %v, want %v", c, at, got, want)
			}
			for d := range 256 {
				if at+1 < len(b) {
					b[at+1] = byte(d)
					if got, want := fieldValue(string(b)), fieldBytes(string(b)); got != want {
						t.Fatalf("bytes %#x %#x at %d: %v, want %v", c, d, at, got, want)
					}
				}
			}
		}
	}
}

// parseResponse reads the framing and renders the head to pass on, with
// hop-by-hop fields (and those Connection names) dropped; a head it cannot
// relay safely is refused.
func TestParseResponse(t *testing.T) {
	cases := map[string]struct {
		in       string
		need, ok bool
		status   int
		clen     int64
		chunked  bool
		close    bool
		refused  bool
		head     string
	}{
		"fixed": {in: "HTTP/1.1 200 OK\r\nContent-Length: 11\r\nX-A:  1 \r\n\r\n{\"value\":1}", ok: true, status: 200, clen: 11,
			head: "HTTP/1.1 200 OK\r\nContent-Length: 11\r\nX-A: 1\r\n\r\n"},
		"chunked, hop-by-hop dropped": {in: "HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\nKeep-Alive: 5\r\nTe: x\r\nConnection: close, X-Hop\r\nX-Hop: 1\r\nX-B: 2\r\n\r\n",
			ok: true, status: 201, clen: -1, chunked: true, close: true,
			head: "HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\nX-B: 2\r\n\r\n"},
		"no reason phrase": {in: "HTTP/1.1 204\r\n\r\n", ok: true, status: 204, clen: -1, head: "HTTP/1.1 204\r\n\r\n"},
		"refusal": {in: "HTTP/1.1 503 Unavailable\r\nx-pinned-refused: draining\r\nContent-Length: 0\r\n\r\n", ok: true, status: 503, refused: true,
			head: "HTTP/1.1 503 Unavailable\r\nx-pinned-refused: draining\r\nContent-Length: 0\r\n\r\n"},
		"not whole":               {in: "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n", need: true, ok: true},
		"too long":                {in: "HTTP/1.1 200 OK\r\nX: " + strings.Repeat("a", maxRespHead), need: false, ok: false},
		"HTTP/1.0":                {in: "HTTP/1.0 200 OK\r\n\r\n"},
		"bad status":              {in: "HTTP/1.1 2x0 OK\r\n\r\n"},
		"two lengths":             {in: "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n"},
		"length too long":         {in: "HTTP/1.1 200 OK\r\nContent-Length: 1234567890123456789\r\n\r\n"},
		"length and chunked":      {in: "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n"},
		"other transfer-encoding": {in: "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n"},
		"space before colon":      {in: "HTTP/1.1 200 OK\r\nContent-Length : 1\r\n\r\n"},
		"bare LF in a field":      {in: "HTTP/1.1 200 OK\r\nX-A: 1\n2\r\nContent-Length: 0\r\n\r\n"},
		"bare LF ends the head":   {in: "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\n"},
		"bare LF, not whole":      {in: "HTTP/1.1 200 OK\n"},
		"bare CR in a value":      {in: "HTTP/1.1 200 OK\r\nX-A: 1\r2\r\nContent-Length: 0\r\n\r\n"},
		"NUL in a value":          {in: "HTTP/1.1 200 OK\r\nX-A: 1\x002\r\nContent-Length: 0\r\n\r\n"},
	}
	for name, tc := range cases {
		r, need, ok := parseResponse([]byte(tc.in), &headScan{}, "X-Pinned-Refused", nil)
		if need != tc.need || ok != tc.ok {
			t.Errorf("%s: need %v ok %v, want %v %v", name, need, ok, tc.need, tc.ok)
			continue
		}
		if !ok || need {
			continue
		}
		got := []any{r.status, r.clen, r.chunked, r.close, r.refusal != "", string(r.head), r.headLen}
		want := []any{tc.status, tc.clen, tc.chunked, tc.close, tc.refused, tc.head, strings.Index(tc.in, "\r\n\r\n") + 4}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: got %q, want %q", name, got, want)
		}
	}
}

// However a head trickles in, the loop's parse of it costs work linear in
// the bytes received: fed one byte at a time, the bytes looked at stay
// within a small multiple of the request's length, and a bare LF ends the
// wait at once (net/http gets the connection and refuses it).
func TestParseWorkIsLinear(t *testing.T) {
	var fields strings.Builder
	for i := 0; fields.Len() < maxHead-200; i++ {
		fmt.Fprintf(&fields, "X-Pad-%d: %s\r\n", i, strings.Repeat("v", 20))
	}
	body := strings.Repeat("b", 5000)
	cases := map[string]struct {
		in       string
		n        int  // bytes fed when the verdict comes
		ok       bool // the loop takes it
		response bool
	}{
		"long head, then a body": {in: "POST /p HTTP/1.1\r\nHost: h\r\nContent-Length: 5000\r\n" + fields.String() + "\r\n" + body, ok: true},
		"trickled LFs":           {in: strings.Repeat("\n", 1000), n: 1},
		"a line, then LFs":       {in: "GET / HTTP/1.1\r\n" + strings.Repeat("\n", 1000), n: len("GET / HTTP/1.1\r\n") + 1},
		"no line end at all":     {in: "GET /" + strings.Repeat("a", 2*maxHead), n: maxHead},
		"empty lines (CRLF)":     {in: strings.Repeat("\r\n", 1000), n: 4},
		"long response head":     {in: "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n" + fields.String() + "\r\n", ok: true, response: true},
		"response with LFs":      {in: "HTTP/1.1 200 OK\r\n" + strings.Repeat("\n", 1000), n: len("HTTP/1.1 200 OK\r\n") + 1, response: true},
	}
	for name, tc := range cases {
		var s headScan
		var h ReqHead
		fed, done, ok := 0, false, false
		for fed < len(tc.in) && !done {
			fed++
			in := []byte(tc.in[:fed])
			var need bool
			if tc.response {
				_, need, ok = parseResponse(in, &s, "", nil)
			} else {
				_, need, ok = parseRequest(in, &s, &h, maxLoopBody)
			}
			done = !need
		}
		if !done || ok != tc.ok {
			t.Errorf("%s: after %d bytes: done %v ok %v, want ok %v", name, fed, done, ok, tc.ok)
			continue
		}
		if tc.ok {
			tc.n = len(tc.in)
		}
		if fed != tc.n {
			t.Errorf("%s: the verdict came after %d bytes, want %d", name, fed, tc.n)
		}
		if s.scanned > 3*fed {
			t.Errorf("%s: %d bytes looked at for %d received (more than 3 a byte: the search starts over)", name, s.scanned, fed)
		}
	}
}
