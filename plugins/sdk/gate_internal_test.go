package sdk

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// discard is a ResponseWriter that keeps nothing, so the benchmark below
// measures the gate and not a recorder.
type discard struct{ h http.Header }

func (d *discard) Header() http.Header         { return d.h }
func (d *discard) Write(p []byte) (int, error) { return len(p), nil }
func (d *discard) WriteHeader(int)             {}

// BenchmarkGateOverhead: what the output gate adds to a read with nothing
// in flight, per request, against the same handler called bare: the price
// of "passes straight through". (BenchmarkGate in examples/counter has
// the end-to-end figures.)
//
//	go test -run XXX -bench GateOverhead -benchmem ./plugins/sdk/
func BenchmarkGateOverhead(b *testing.B) {
	inst := NewMemoryInstance("/bench", "b")
	defer inst.Stop()
	if err := inst.Tray("t", "~").Set("v", 1); err != nil {
		b.Fatal(err)
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"value":1}` + "\n"))
	})
	l := &live{inst: inst, handler: h}
	r := httptest.NewRequest("GET", "/value", nil)
	for _, gated := range []bool{false, true} {
		b.Run(map[bool]string{false: "bare", true: "gated"}[gated], func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				w := &discard{h: http.Header{}}
				if gated {
					serveRecovering(w, r, l)
				} else {
					h.ServeHTTP(w, r)
				}
			}
		})
	}
}
