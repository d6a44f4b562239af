#!/usr/bin/env bash
# bench-frontdoor-tls.sh: what HTTPS at the front door costs a node, against
# plain HTTP with and without the kept-alive loop, in one run (bench/frontdoor).
set -euo pipefail
cd "$(dirname "$0")/.."
go test -run XXX -bench BenchmarkFrontDoorTLS -benchtime 1x -count 1 -timeout 10m ./bench/frontdoor/ 2>&1 | grep -v '^ *{'
