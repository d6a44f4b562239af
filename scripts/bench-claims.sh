#!/usr/bin/env bash
# bench-claims.sh: new placements per second on a real 3-node cluster on this
# machine (every claim replicated and fsync'd), against Redis doing the same
# claim (EVAL of SET NX PX) in the same run, at the same concurrency (Redis
# clients = claim writers). Prints a markdown table.
# Needs redis-server on 127.0.0.1:6379 (the machine's default) and
# redis-benchmark.
set -euo pipefail
cd "$(dirname "$0")/.."

redis() { # clients requests -> requests per second
	redis-benchmark -q -n "$2" -c "$1" -r 1000000 \
		EVAL "return redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', 15000)" 1 'key:__rand_int__' v 2>/dev/null |
		tr '\r' '\n' | grep 'requests per second' | tail -1 | sed -E 's/.*: ([0-9.]+) requests per second.*/\1/'
}
r1=$(redis 1 20000)
r64=$(redis 64 200000)
r512=$(redis 512 200000)
r2048=$(redis 2048 200000)

out=$(go test -run XXX -bench 'BenchmarkClaims3Nodes' -benchtime 3s -count 1 ./pinboard/ 2>&1)
lookup=$(go test -run XXX -bench 'BenchmarkLookup$' -count 1 ./pinboard/directory/ 2>&1 | awk '/^BenchmarkLookup/{print $3}')

echo "| mode | writers | claims/s | p50 ms | p99 ms | Redis, same clients | vs Redis |"
echo "|---|---:|---:|---:|---:|---:|---:|"
echo "$out" | awk -v r1="$r1" -v r64="$r64" -v r512="$r512" -v r2048="$r2048" '/^BenchmarkClaims3Nodes/{
	split($1, a, "/"); mode=a[2]; w=a[3]; sub("writers=", "", w); sub("-[0-9]+$", "", w)
	for (i = 1; i <= NF; i++) { if ($(i+1) == "claims/s") c=$i; if ($(i+1) == "p50-ms") p50=$i; if ($(i+1) == "p99-ms") p99=$i }
	r = (w == 1) ? r1 : (w == 64) ? r64 : (w == 512) ? r512 : r2048
	printf "| %s | %s | %.0f | %s | %s | %.0f | %.2f |\n", mode, w, c, p50, p99, r, c / r
}'
echo
echo "Redis: redis-benchmark EVAL of SET NX PX on random keys, 1/64/512/2048 clients: $r1 / $r64 / $r512 / $r2048 requests/s."
echo "Local directory lookup: ${lookup} ns/op (BenchmarkLookup, 100k placements)."

# What mutual TLS on Raft costs a claim: two 3-node clusters side by side,
# one as every default node runs (mutual TLS) and one --insecure-cluster,
# alternating sub-benchmarks, three passes; the ratio of the means.
tls=$(go test -run XXX -bench 'BenchmarkClaimsTLS' -benchtime 3s -count 3 ./pinboard/ 2>&1)
echo
echo "| mode | writers | insecure claims/s | mutual TLS claims/s | TLS / insecure |"
echo "|---|---:|---:|---:|---:|"
echo "$tls" | awk '/^BenchmarkClaimsTLS/{
	split($1, a, "/"); mode=a[2]; w=a[3]; sub("writers=", "", w); tr=a[4]; sub("-[0-9]+$", "", tr)
	for (i = 1; i <= NF; i++) if ($(i+1) == "claims/s") c=$i
	k=mode " " w; sum[k, tr]+=c; n[k, tr]++; if (!(k in seen)) { seen[k]=1; order[++m]=k }
} END {
	for (j = 1; j <= m; j++) { k=order[j]; split(k, p, " ")
		ins=sum[k, "insecure"]/n[k, "insecure"]; t=sum[k, "tls"]/n[k, "tls"]
		printf "| %s | %s | %.0f | %.0f | %.2f |\n", p[1], p[2], ins, t, t/ins }
}'
