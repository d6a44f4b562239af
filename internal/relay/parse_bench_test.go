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
		if _, need, ok := parseRequest(in, &h); need || !ok {
			b.Fatal("not parsed")
		}
	}
}
