package relay

import (
	"bufio"
	"bytes"
	"net/http"
	"strings"
	"testing"
)

// The scanner finds the end of a chunked body wherever the reads split it,
// and not a byte before.
func TestChunkScannerFindsTheEnd(t *testing.T) {
	for _, body := range []string{
		"0\r\n\r\n",
		"5\r\nhello\r\n0\r\n\r\n",
		"5;ext=1\r\nhello\r\n1A\r\n" + strings.Repeat("x", 26) + "\r\n0\r\n\r\n",
		"3\r\n0\r\n\r\n0\r\n\r\n", // data that looks like the last chunk
		"5\r\nhello\r\n0\r\nX-Trailer: 1\r\nY: 2\r\n\r\n",
		"5\nhello\n0\n\n", // bare LFs, as lenient readers accept
		"12\r\ndata: 1\n\ndata: 2\n\r\n0\r\n\r\n",
	} {
		for split := 0; split <= len(body); split++ {
			var sc chunkScanner
			end, err := sc.scan([]byte(body[:split]))
			if err != nil {
				t.Fatalf("%q split at %d: %v", body, split, err)
			}
			if end >= 0 {
				if split != len(body) || end != len(body) {
					t.Fatalf("%q split at %d: end %d in the first part", body, split, end)
				}
				continue
			}
			end, err = sc.scan([]byte(body[split:] + "garbage"))
			if err != nil || split+end != len(body) {
				t.Fatalf("%q split at %d: end %d (%v), want %d", body, split, split+end, err, len(body))
			}
		}
		if !Ends([]byte(body)) || Ends([]byte(body[:len(body)-1])) {
			t.Fatalf("Ends(%q) wrong", body)
		}
	}
	for _, bad := range []string{"x\r\n", "\r\n", "1000000000000000\r\n"} {
		var sc chunkScanner
		if _, err := sc.scan([]byte(bad)); err == nil {
			t.Fatalf("%q: no error", bad)
		}
	}
}

// The head says what ReverseProxy would, with the upstream's framing and
// Connection: close, and a client parses it.
func TestHead(t *testing.T) {
	resp := &http.Response{
		StatusCode: 200, Status: "200 OK", ProtoMajor: 1, ProtoMinor: 1,
		TransferEncoding: []string{"chunked"}, ContentLength: -1,
		Trailer: http.Header{"X-Done": nil},
	}
	h := http.Header{"Content-Type": {"text/event-stream"}, "X-A": {"1", "2"}}
	head := Head(resp, h)
	if h.Get("Connection") != "" {
		t.Fatal("Head changed the caller's header")
	}
	got, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(append(head, "0\r\nX-Done: yes\r\n\r\n"...))), nil)
	if err != nil {
		t.Fatalf("%s: %v", head, err)
	}
	if got.StatusCode != 200 || !got.Close || got.Header.Get("Content-Type") != "text/event-stream" ||
		len(got.Header["X-A"]) != 2 || got.Header.Get("Date") == "" || len(got.TransferEncoding) != 1 {
		t.Fatalf("parsed head %+v from\n%s", got, head)
	}
	if _, err := bufio.NewReader(got.Body).ReadString('\n'); err == nil || got.Trailer.Get("X-Done") != "yes" {
		t.Fatalf("body/trailer: %v %v", err, got.Trailer)
	}

	plain := Head(&http.Response{StatusCode: 299, Status: "299 Custom Words", ContentLength: -1}, nil)
	if !strings.HasPrefix(string(plain), "HTTP/1.1 299 Custom Words\r\n") || strings.Contains(string(plain), "Transfer-Encoding") {
		t.Fatalf("close-delimited head:\n%s", plain)
	}
}
