// Package hop holds the forwarding-hop benchmark (hop_test.go): real
// two-node pinnedd fleets on loopback, measured in one run against a plain
// httputil.ReverseProxy and nginx doing the same hop, plus the memory a held
// proxied SSE stream costs on the forwarding node.
//
//	scripts/bench-hop.sh
//	go test -run XXX -bench BenchmarkHop -benchtime 1x ./bench/hop/
//
// It prints one markdown table and writes it, with the command and the date,
// to bench/hop/RESULTS.md. A plain go test ./... runs none of it. Besides
// latency and req/s, each row reports the CPU per request of the forwarding
// process and of the owner node (pinnedd and its plugins, from /proc): on
// two shared cores the req/s of a row is mostly what those add up to, and
// the CPU figures move far less from run to run than req/s does.
//
// The rows, all measured in the same interleaved rounds:
//
//   - Rows 1-4, from a fleet started with --insecure-cluster (node-to-node
//     HTTP in plain text): no hop, the pinnedd hop, httputil.ReverseProxy and
//     nginx to the owner's front door. Rows 2 and 4 are the plain gate (p50
//     within nginx's, at least 97% of its req/s).
//   - Rows 5-7, from a fleet with the default mutual TLS between nodes: no
//     hop, the pinnedd hop over mTLS, and nginx proxy_ssl to the owner's
//     cluster port (its --raft-addr). nginx presents the entry node's
//     certificate and key (<data-dir>/tls), trusts the cluster CA, verifies
//     the owner's certificate for its node id, TLS 1.3, session reuse,
//     upstream keepalive; an increment through it must reach the owner's
//     counter before anything is measured. Rows 6 and 7 are the mTLS gate
//     (req/s at least nginx's, p50 within nginx's).
//   - No hop and hop from a fleet of this build started with
//     --insecure-cluster --fast-path=false: what the fast path buys.
//   - The last two, no hop and hop from a fleet in hostname-aware mode
//     (--hostname-aware, the counter under 127.0.0.1, the Host the load
//     client sends) with 200 hostnames bound, 199 of them by an outside
//     worker that registers and heartbeats through the registry
//     (bind_test.go): what routing by Host costs next to rows 1 and 2.
//
// scripts/bench-hop-ab.sh REV compares two builds in one run: it builds
// pinnedd at REV and sets HOP_AB_BIN, which adds REV's plain no-hop and hop
// rows, from one more --insecure-cluster fleet, before the fast-path rows.
// Run to run, this VM's figures drift by more than most single changes move
// them; within one run both builds see the same drift.
//
// HOP_PROFILE=<dir> also loads each fleet's hop row while taking 5 s CPU
// profiles of both nodes (<dir>/entry.pprof, <dir>/owner.pprof; the mTLS
// fleet's prefixed tls-), then its nginx row while profiling the owner
// (<dir>/owner-under-nginx.pprof, tls-owner-under-nginx.pprof: compare with
// go tool pprof -diff_base). HOP_AGENT_ENV adds environment to every node,
// e.g. HOP_AGENT_ENV=GOMAXPROCS=1. HOP_RATE=<req/s> adds a phase that offers
// the hop and nginx rows of both fleets (in an A/B also the B build's hop)
// that one rate and reports CPU per request of the forwarder, the owner's
// pinnedd and its plugins apart, like for like. HOP_ROUNDS=<n> runs n
// throughput rounds instead of 8, for a narrower interval on the req/s
// ratios.
package hop
