#!/usr/bin/env bash
# bench-hop-ab.sh REV: the forwarding-hop benchmark with an A/B in one run.
#
# Builds pinnedd at REV (a commit, tag or branch) in a temporary git
# worktree and runs bench/hop with HOP_AB_BIN pointing at it: the table
# gains REV's "no hop" and "pinnedd hop (plain)" rows, after this tree's mTLS
# rows, measured in the same interleaved rounds as this tree's rows 1 and 2,
# so the machine's drift hits both builds alike. REV's fleet runs with
# --insecure-cluster, as this tree's rows 1 and 2 do, so REV must know the
# flag (every build since c14e540, which brought mutual TLS). Each fleet runs
# its own build's plugins (the plugin protocol may differ between the two).
set -euo pipefail
cd "$(dirname "$0")/.."
rev="${1:?usage: scripts/bench-hop-ab.sh REV}"
tmp="$(mktemp -d)"
# Run as root, a pinnedd runs its plugins as another account (pinnedd-plugin
# or nobody), which must be able to execute the B build's plugins in here.
chmod 755 "$tmp"
cleanup() { git worktree remove --force "$tmp/src" >/dev/null 2>&1 || true; rm -rf "$tmp"; }
trap cleanup EXIT
git worktree add --detach "$tmp/src" "$rev" >/dev/null
short="$(git rev-parse --short "$rev")"
(cd "$tmp/src" && go build -o "$tmp/pinnedd-$short" ./pinnedd &&
	go build -o "$tmp/counter-$short" ./examples/counter/cmd/counter &&
	go build -o "$tmp/testhost-$short" ./internal/testhost)
export HOP_AB_BIN="$tmp/pinnedd-$short" HOP_AB_COUNTER="$tmp/counter-$short" HOP_AB_TESTHOST="$tmp/testhost-$short"
export HOP_BENCH_CMD="scripts/bench-hop-ab.sh $rev"
scripts/bench-hop.sh
