// Package plugins is the contract between pinnedd and its host plugins:
// the go-plugin handshake (versioned, see ProtocolVersion), the gRPC
// services in package proto, the name rules both sides enforce, and the
// headers of the data socket. Host authors import package sdk, not this
// one. PROTOCOL.md in this directory is the whole contract, for a plugin
// in any language.
//
// # Control and data
//
// Control (Describe, Activate, Deactivate, Stats, Health, Shutdown, and a
// held-open Events stream whose end tells pinnedd at once that the plugin
// died) runs over go-plugin's gRPC connection; pinnedd serves the plugin
// its Store service back over go-plugin's broker.
//
// The data plane is HTTP/1.1 on a private unix socket the plugin serves
// (EnvDataSocket, in a 0700 directory): pinnedd writes each instance
// request there with the instance's namespace and id in headers
// (HeaderNamespace, HeaderID), and streams, SSE and Upgrade (WebSocket)
// pass through as net/http carries them.
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
package plugins
