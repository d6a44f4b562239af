// Package hop holds the forwarding-hop benchmark (hop_test.go): a real
// two-node pinnedd fleet on loopback, measured in one run against a plain
// httputil.ReverseProxy and nginx doing the same hop, plus the memory a held
// proxied SSE stream costs on the forwarding node.
//
//	scripts/bench-hop.sh
//	go test -run XXX -bench BenchmarkHop -benchtime 1x ./bench/hop/
//
// It prints one markdown table and writes it, with the command and the date,
// to bench/hop/RESULTS.md. A plain go test ./... runs none of it. Besides
// latency and req/s, each row reports the CPU per request of the forwarding
// process and of the owner node (from /proc): on two shared cores the
// req/s of a row is mostly what those add up to, and the CPU figures move
// far less from run to run than req/s does.
//
// HOP_PROFILE=<dir> also loads the hop row while taking 5 s CPU profiles of
// both nodes (<dir>/entry.pprof, <dir>/owner.pprof), then the nginx row
// while profiling the owner (<dir>/owner-under-nginx.pprof: compare with
// go tool pprof -diff_base). HOP_AGENT_ENV adds environment to both nodes,
// e.g. HOP_AGENT_ENV=GOMAXPROCS=1. HOP_RATE=<req/s> adds a phase that offers
// the hop and nginx rows (in an A/B also the B build's hop) that one rate
// and reports CPU per request of the forwarder, the owner's pinnedd and its
// plugins apart, like for like. HOP_ROUNDS=<n> runs n throughput rounds
// instead of 8, for a narrower interval on the req/s ratio.
//
// Two rows come from a second fleet of this build started with
// --fast-path=false (its no-hop and hop rows): what the fast path buys.
// scripts/bench-hop-ab.sh REV compares two builds in one run: it builds
// pinnedd at REV and sets HOP_AB_BIN, which adds REV's no-hop and hop rows,
// from a third fleet, to the same interleaved rounds. Run to
// run, this VM's figures drift by more than most single changes move them;
// within one run both builds see the same drift.
package hop
