#!/usr/bin/env bash
# bench-hop.sh: the forwarding-hop benchmark table (bench/hop).
#
# Starts real two-node pinnedd fleets on loopback and measures, in one run:
# on a fleet started with --insecure-cluster, no hop, pinnedd's forwarding hop,
# a plain httputil.ReverseProxy and nginx doing the same hop; on a fleet with
# mutual TLS between nodes (the default), no hop, the hop over mTLS and nginx
# proxy_ssl to the owner's cluster port; plus the memory a held proxied SSE
# stream costs on the forwarding node. Prints the table and writes
# bench/hop/RESULTS.md. HOP_ROUNDS=<n> (at least 2) sets the throughput rounds.
#
# Installs nginx (nginx-light, else nginx; both have the ssl module the
# proxy_ssl row needs) with apt-get if it is missing; the package's own
# service is kept from starting while it installs.
set -euo pipefail
cd "$(dirname "$0")/.."

have_nginx() { command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ]; }

if ! have_nginx; then
	echo "bench-hop: nginx missing, installing it" >&2
	sudo=""
	if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
	policy=/usr/sbin/policy-rc.d
	made_policy=""
	if [ ! -e "$policy" ]; then
		# Debian's postinst would start nginx on :80; policy-rc.d 101 says no.
		printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null
		$sudo chmod 755 "$policy"
		made_policy=1
	fi
	trap 'if [ -n "$made_policy" ]; then $sudo rm -f "$policy"; fi' EXIT
	export DEBIAN_FRONTEND=noninteractive
	install() { $sudo apt-get install -y -q nginx-light || $sudo apt-get install -y -q nginx; }
	install || { $sudo apt-get update -q && install; } || true
	if [ -n "$made_policy" ]; then $sudo rm -f "$policy"; made_policy=""; fi
fi
if ! have_nginx; then
	echo "bench-hop: FAIL: nginx could not be installed (apt-get install -y nginx-light || nginx); the nginx baseline needs it" >&2
	exit 1
fi

export HOP_BENCH_CMD="${HOP_BENCH_CMD:-scripts/bench-hop.sh}"
if [ -n "${HOP_RATE:-}" ]; then HOP_BENCH_CMD="HOP_RATE=$HOP_RATE $HOP_BENCH_CMD"; fi
if [ -n "${HOP_ROUNDS:-}" ]; then HOP_BENCH_CMD="HOP_ROUNDS=$HOP_ROUNDS $HOP_BENCH_CMD"; fi
go test -run XXX -bench BenchmarkHop -benchtime 1x -count 1 -timeout 30m ./bench/hop/
echo
echo "bench-hop: numbers, command and date written to bench/hop/RESULTS.md"
