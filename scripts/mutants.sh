#!/usr/bin/env bash
# scripts/mutants.sh [PKG...]: mutation testing with gremlins, one package at
# a time, each bounded in time, and a survivors report.
#
# A mutant is a one-line change a plausible bug would make (a comparison
# flipped, a boundary moved, a sign or an increment changed). gremlins
# applies each to a copy of the module and runs that package's tests:
# KILLED when they fail, LIVED (a survivor) when they still pass. Survivors
# that matter get a test; the rest are listed as accepted in the report.
#
# PKG is a package directory (default: the five the suite is measured on).
# Each runs alone: its subpackages are excluded (-E /), and only its own
# tests count (gremlins runs `go test` of the mutated package).
#
# Environment:
#   MUTANTS_TIMEOUT  per-package bound (default 25m); a package cut short is
#                    reported from what finished, marked partial
#   MUTANTS_WORKERS  mutants tested at once (default 1); supervisor's tests
#                    mostly wait on plugin processes, so 2 fit two cores
#   MUTANTS_COEF     gremlins --timeout-coefficient (default 3): a mutant
#                    whose tests run this many times longer than the clean
#                    run is TIMED OUT (counted as killed by gremlins)
#   MUTANTS_REPORT   report file (default bench/mutants/REPORT.md); the
#                    sections of the packages run are replaced, others kept
#   MUTANTS_OUT      raw gremlins logs (default $TMPDIR/pinnedd-mutants)
#   GREMLINS         gremlins version (default v0.6.0)
#
# It mutates a snapshot of HEAD (git archive), never the work tree: commit
# the tests you want measured first. Not part of .ci/run: a package takes
# tens of minutes on two cores.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

GREMLINS=${GREMLINS:-v0.6.0}
timeout_per_pkg=${MUTANTS_TIMEOUT:-25m}
coef=${MUTANTS_COEF:-3}
workers=${MUTANTS_WORKERS:-1}
report=${MUTANTS_REPORT:-bench/mutants/REPORT.md}
out=${MUTANTS_OUT:-${TMPDIR:-/tmp}/pinnedd-mutants}
if [ $# -eq 0 ]; then
  set -- pinboard/directory supervisor statewire statestore pinboard frontdoor
fi
for pkg in "$@"; do
  if [ ! -d "$pkg" ] || ! ls "$pkg"/*.go >/dev/null 2>&1; then
    echo "mutants.sh: $pkg is not a package directory of this module" >&2
    exit 2
  fi
done

mkdir -p "$out" "$(dirname "$report")"
snap=$(mktemp -d "${TMPDIR:-/tmp}/pinnedd-mutants-src-XXXXXX")
# gremlins' work dirs, and whatever the tests under it leave in TMPDIR,
# go in a dir of this run's own: removed at the end, also after a package
# was cut at its bound (gremlins then cannot clean up).
gtmp=$(mktemp -d "${TMPDIR:-/tmp}/pinnedd-mutants-tmp-XXXXXX")
trap 'rm -rf "$snap" "$gtmp"' EXIT
git archive HEAD | tar -x -C "$snap"
rev=$(git rev-parse --short HEAD)

# Build gremlins once, outside the timed runs.
gbin=$out/gremlins-$GREMLINS
[ -x "$gbin" ] || GOBIN=$out go install "github.com/go-gremlins/gremlins/cmd/gremlins@$GREMLINS"
[ -x "$gbin" ] || mv "$out/gremlins" "$gbin"

[ -f "$report" ] || printf '# Mutation testing: survivors\n\nMade by `scripts/mutants.sh` (gremlins %s). Efficacy = killed / (killed + lived); timed-out mutants count as killed.\n' "$GREMLINS" >"$report"

for pkg in "$@"; do
  name=${pkg//\//_}
  log=$out/$name.log
  echo "mutants.sh: $pkg (bound $timeout_per_pkg, log $log)"
  start=$(date +%s)
  status=complete
  cmd=(gremlins unleash --workers "$workers" --timeout-coefficient "$coef" -E / "./$pkg")
  # -count=1: a cached coverage run would shrink gremlins' timeouts to nothing.
  (cd "$snap" && GOFLAGS="-count=1 ${GOFLAGS:-}" TMPDIR=$gtmp timeout --kill-after=30s "$timeout_per_pkg" \
    "$gbin" "${cmd[@]:1}") >"$log" 2>&1 || {
    rc=$?
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then status="partial (cut at $timeout_per_pkg)"; else status="gremlins exit $rc"; fi
  }
  secs=$(($(date +%s) - start))
  rm -rf "${gtmp:?}"/* # a cut run's work dirs
  count() { grep -c "^ *$1 " "$log" || true; }
  killed=$(count KILLED) lived=$(count LIVED) timedout=$(count "TIMED OUT")
  notcov=$(count "NOT COVERED") notviable=$(count "NOT VIABLE")
  eff=n/a
  if [ $((killed + timedout + lived)) -gt 0 ]; then
    eff=$(awk -v k=$((killed + timedout)) -v l="$lived" 'BEGIN { printf "%.1f%%", 100 * k / (k + l) }')
  fi
  section=$(mktemp)
  {
    echo "<!-- mutants: $pkg -->"
    echo "## $pkg"
    echo
    echo "HEAD $rev, $(date -u +%Y-%m-%d), ${secs}s, $status. Command (from the module root):"
    echo
    echo "    MUTANTS_TIMEOUT=$timeout_per_pkg MUTANTS_WORKERS=$workers scripts/mutants.sh $pkg"
    echo "    # runs: ${cmd[*]}"
    echo
    echo "| killed | timed out | lived | not covered | not viable | efficacy |"
    echo "| --- | --- | --- | --- | --- | --- |"
    echo "| $killed | $timedout | $lived | $notcov | $notviable | $eff |"
    echo
    if [ "$lived" -gt 0 ]; then
      echo "Survivors (the mutated line as it reads unmutated):"
      echo
      grep "^ *LIVED " "$log" | while read -r _ kind _ pos; do
        file=${pos%%:*} rest=${pos#*:} line=${rest%%:*}
        src=$(sed -n "${line}p" "$snap/$pkg/$file" | sed 's/^[[:space:]]*//; s/|/\\|/g')
        echo "- \`$pkg/$file:$line\` $kind: \`$src\`"
      done
      echo
    fi
    echo "<!-- /mutants: $pkg -->"
  } >"$section"
  # Replace this package's previous section, keep the others.
  awk -v pkg="$pkg" -v sec="$section" '
    $0 == "<!-- mutants: " pkg " -->" { skip = 1; while ((getline l < sec) > 0) print l; done = 1; next }
    skip && $0 == "<!-- /mutants: " pkg " -->" { skip = 0; next }
    !skip { print }
    END { if (!done) { print ""; while ((getline l < sec) > 0) print l } }
  ' "$report" >"$report.tmp" && mv "$report.tmp" "$report"
  rm -f "$section"
  echo "mutants.sh: $pkg: killed $killed, timed out $timedout, lived $lived, not covered $notcov ($eff, $status)"
done
echo "mutants.sh: report in $report"
