package relay

import "testing"

// BenchmarkParseRequest: the loop's per-request head parse, on a request
// as the forwarding node sends it to an owner.
func BenchmarkParseRequest(b *testing.B) {
	in := []byte("GET /_pinned/i/counters/c1/value HTTP/1.1\r\nHost: 127.0.0.1:8081\r\nUser-Agent: Go-http-client/1.1\r\n" +
		"X-Forwarded-For: 127.0.0.1\r\nX-Forwarded-Host: 127.0.0.1:8081\r\nX-Forwarded-Proto: http\r\n" +
		"X-Pinned-Attestation: v1.w1.w2.42.1764494400000.AAAAAAAAAAAAAAAA.abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQ\r\n\r\n")
	var h ReqHead
	b.ReportAllocs()
	for b.Loop() {
		if _, need, ok := parseRequest(in, &headScan{}, &h, maxLoopBody); need || !ok {
			b.Fatal("not parsed")
		}
	}
}

// BenchmarkParseResponse: the loop's per-response head parse and render,
// on a response as a plugin sends it.
func BenchmarkParseResponse(b *testing.B) {
	in := []byte("HTTP/1.1 200 OK\r\nContent-Length: 11\r\nContent-Type: application/json\r\n" +
		"Date: Mon, 30 Nov 2026 18:00:00 GMT\r\n\r\n{\"value\":1}")
	dst := make([]byte, 0, 256)
	b.ReportAllocs()
	for b.Loop() {
		r, need, ok := parseResponse(in, &headScan{}, "X-Pinned-Refused", dst[:0])
		if need || !ok || r.clen != 11 {
			b.Fatal("not parsed")
		}
		dst = r.head[:0]
	}
}
