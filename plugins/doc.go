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
// # Least privilege (protocol 2)
//
// A plugin runs instance code, not the node, and gets only what that needs:
//
//   - Its environment is built, not inherited: AllowedEnv from pinnedd's
//     own (PATH, HOME, LANG, LC_*, TZ, TMPDIR), what the operator passes
//     per plugin (pinnedd agent --plugin-env), and what pinnedd and
//     go-plugin set (Env*, the handshake cookie, PLUGIN_*). Never
//     PINBOARD_*, DATABASE_URL (SecretEnv) or a cluster-call token.
//   - go-plugin's control and broker sockets run mutual TLS (AutoMTLS):
//     only the pinnedd that started the process can call it.
//   - DescribeRequest hands each process two random secrets, new for every
//     process: socket_secret, which pinnedd sends in HeaderSocketSecret on
//     every request it writes to the data socket (the SDK answers any
//     request without it 403, before routing, and strips it), and
//     cluster_call_token, which instance code sends as
//     ClusterCallValue(namespace, token) in HeaderClusterCall; the front
//     door honours it only for a namespace that process serves on the node,
//     and only while it lives.
//   - Sockets live in a 0700 directory of pinnedd's (the data dir's run/ or
//     $RUNTIME_DIRECTORY).
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
