// Package python holds the Python plugin benchmark (python_test.go):
// owner-to-plugin requests/s and p50 for the Python counter
// (examples/python/counter) behind a real pinnedd, against a plain uvicorn
// app serving the same counter over TCP, measured in the same run, in
// interleaved rounds.
//
//	scripts/bench-python.sh
//	go test -run XXX -bench BenchmarkPythonCounter -benchtime 1x ./bench/python/
//
// It prints one markdown table. A plain go test ./... runs none of it.
//
// The baseline keeps its value in memory; the plugin's increment is
// written through pinnedd's store (the embedded one here) and its answer
// waits for it, so the increment rows compare the whole durable path with
// none, and the read rows compare pinnedd's hop and the SDK with a bare
// uvicorn. Both are one Python process on uvicorn. A third row, the Go
// counter (examples/counter) behind another such pinnedd, shows how much
// of the gap is pinnedd's hop and store and how much is Python's.
package python
