#!/usr/bin/env bash
# bench-python.sh: the Python plugin benchmark table (bench/python).
#
# Starts a real pinnedd running the Python counter (examples/python/counter),
# one running the Go counter, and a plain uvicorn app serving the same
# counter over TCP, and measures requests/s and p50 of each in the same
# interleaved rounds. PY_ROUNDS=<n> sets the rounds (default 3). Needs
# Debian's python3-grpcio python3-protobuf python3-uvicorn
# python3-cryptography (.ci/run installs them).
set -euo pipefail
cd "$(dirname "$0")/.."
go test -run XXX -bench BenchmarkPythonCounter -benchtime 1x -count 1 -timeout 20m ./bench/python/
