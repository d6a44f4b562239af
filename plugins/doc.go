// Package plugins is the contract between pinnedd and its host plugins:
// the go-plugin handshake (versioned, see ProtocolVersion), the gRPC
// services in package proto, the name rules both sides enforce, and the
// data-plane headers. Host authors import package sdk, not this one.
//
// # Control and data
//
// Control (Describe, Activate, Deactivate, Stats, Health, Shutdown, and a
// held-open Events stream whose end tells pinnedd at once that the plugin
// died) runs over go-plugin's gRPC connection. Instance requests do not:
// the plugin serves HTTP/1.1 on a private unix socket that pinnedd names
// (EnvDataSocket, in a 0700 directory), and pinnedd proxies each request
// there with its namespace and id in headers. Streaming both ways, SSE
// flush-through and Upgrade (WebSocket) come with net/http for free.
//
// # Why HTTP over a unix socket, not gRPC streams
//
// Measured with BenchmarkDataPlane (package supervisor) on this project's
// 2-core CI machines, one POST /increment on the counter host, 5000
// sequential requests, p50 (p99):
//
//	handler called in-process                           2.6 µs  (61 µs)
//	plain loopback HTTP, same process                  22 µs   (150 µs)
//	plain loopback HTTP to another process            106 µs   (235 µs)
//	go-plugin gRPC unary call alone (Control.Health)  146 µs   (335 µs)
//	front door -> unix socket -> plugin               186 µs   (995 µs)   <- chosen
//	front door -> one gRPC stream per request -> plugin 403 µs (1524 µs)
//	client on the plugin's socket directly            105 µs   (251 µs)
//
// A gRPC stream per request costs a stream setup, several frames and their
// goroutine hand-offs; HTTP on a pooled unix connection costs one write and
// one read, so the plugin hop itself is as cheap as any cross-process
// loopback request. The front door's own proxying adds the rest; its fast
// path writes and reads on the calling goroutine (see supervisor's
// unixTransport), which took the full path from ~245 µs to ~186 µs.
// GRPCTransport stays, measured and tested, as the alternative.
package plugins
