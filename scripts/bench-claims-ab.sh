#!/usr/bin/env bash
# bench-claims-ab.sh REV: new placements per second on a real 3-node
# cluster (BenchmarkClaims3Nodes), this tree against REV in one run. Both
# builds' benchmark binaries run in alternating rounds (CLAIMS_ROUNDS, 3 by
# default), so the machine's drift hits both alike; the table gives each
# build's mean claims/s per mode and writer count, and this tree's over
# REV's.
set -euo pipefail
cd "$(dirname "$0")/.."
rev="${1:?usage: scripts/bench-claims-ab.sh REV}"
rounds="${CLAIMS_ROUNDS:-3}"
tmp="$(mktemp -d)"
cleanup() { git worktree remove --force "$tmp/src" >/dev/null 2>&1 || true; rm -rf "$tmp"; }
trap cleanup EXIT
git worktree add --detach "$tmp/src" "$rev" >/dev/null
short="$(git rev-parse --short "$rev")"
go test -c -o "$tmp/head.test" ./pinboard/
(cd "$tmp/src" && go test -c -o "$tmp/base.test" ./pinboard/)
run() { # binary dir label
	(cd "$2" && "$1" -test.run XXX -test.bench 'BenchmarkClaims3Nodes' -test.benchtime 3s -test.count 1) |
		awk -v who="$3" '/^BenchmarkClaims3Nodes/{
			split($1, a, "/"); mode=a[2]; w=a[3]; sub("writers=", "", w); sub("-[0-9]+$", "", w)
			for (i = 1; i <= NF; i++) if ($(i+1) == "claims/s") print who, mode, w, $i }'
}
results="$tmp/results"
for _ in $(seq 1 "$rounds"); do
	run "$tmp/base.test" "$tmp/src/pinboard" base >>"$results"
	run "$tmp/head.test" pinboard head >>"$results"
done
echo "| mode | writers | $short claims/s | this tree claims/s | this tree / $short |"
echo "|---|---:|---:|---:|---:|"
awk '{ k=$2 " " $3; s[k, $1]+=$4; n[k, $1]++; if (!(k in seen)) { seen[k]=1; order[++m]=k } }
END { for (j = 1; j <= m; j++) { k=order[j]; split(k, p, " "); b=s[k, "base"]/n[k, "base"]; h=s[k, "head"]/n[k, "head"]
	printf "| %s | %s | %.0f | %.0f | %.3f |\n", p[1], p[2], b, h, h/b } }' "$results"
echo
echo "$rounds alternating rounds of 3 s per sub-benchmark; means of each build's rounds. Command: scripts/bench-claims-ab.sh $rev"
