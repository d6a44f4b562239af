package supervisor

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/pinnedd/pinnedd/internal/testutil"
	dto "github.com/prometheus/client_model/go"
)

// A request under the generation an instance runs under reuses it; one
// under a newer generation (the id was placed here again) replaces it, so
// the old activation writes no more; an older generation's request does
// not take a newer instance down.
func TestNewerGenerationReplacesInstance(t *testing.T) {
	s, err := New(Config{
		Specs:  []Spec{{Name: "p", Path: testutil.Bin(t, "testhost"), Namespaces: []string{"/misc"}}},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	// /<ns>/<id>/<generation>/<rest>
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		parts := strings.SplitN(r.URL.Path, "/", 5)
		gen, _ := strconv.ParseUint(parts[3], 10, 64)
		serveCall(s, w, r, "/"+parts[1], parts[2], gen, "/"+parts[4])
	}))
	t.Cleanup(func() {
		srv.Close()
		pids := []int{s.Plugins()[0].PID}
		s.Stop(context.Background())
		testutil.CheckGone(t, pids)
		checkNoPlugins(t)
	})
	activations := func() float64 {
		var m dto.Metric
		if err := s.metrics.activations.WithLabelValues("/misc").Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetCounter().GetValue()
	}
	// served returns the generation the instance that answered runs under.
	served := func(gen int) uint64 {
		t.Helper()
		r, err := testutil.Do(context.Background(), "GET", srv.URL+"/misc/g/"+strconv.Itoa(gen)+"/echo", "", nil)
		if err != nil || r.Code != 200 {
			t.Fatalf("request under generation %d: %v %+v", gen, err, r)
		}
		var body struct{ Generation uint64 }
		r.JSON(t, &body)
		return body.Generation
	}
	for range 2 {
		if g := served(5); g != 5 {
			t.Fatalf("served by generation %d, want 5", g)
		}
	}
	if n := activations(); n != 1 {
		t.Fatalf("two requests under one generation activated %v times, want 1", n)
	}
	if g := served(6); g != 6 {
		t.Fatalf("a request under generation 6 served by generation %d", g)
	}
	if n := activations(); n != 2 {
		t.Fatalf("activations after a newer generation: %v, want 2", n)
	}
	if g, _, _ := s.LiveGeneration(Key{Namespace: "/misc", ID: "g"}); g != 6 {
		t.Fatalf("live under generation %d, want 6", g)
	}
	if g := served(5); g != 6 {
		t.Fatalf("a stale generation's request served by generation %d, want the live 6", g)
	}
	if n := activations(); n != 2 {
		t.Fatalf("a stale generation's request activated again: %v activations, want 2", n)
	}
}

// A host that cannot build its instance: 500 "activation failed", nothing
// left live, and the next request tries again.
func TestFailedActivationIs500AndLeavesNothing(t *testing.T) {
	s, srv := startSupervisor(t, testutil.Bin(t, "testhost"), "/fail")
	for range 2 {
		r, err := testutil.Do(context.Background(), "GET", srv.URL+"/fail/f/x", "", nil)
		if err != nil || r.Code != http.StatusInternalServerError || !strings.Contains(r.Body, `"activation failed`) {
			t.Fatalf("failed activation: %v %+v, want 500 activation failed", err, r)
		}
		if s.Live("/fail", "f") || len(s.Instances()) != 0 {
			t.Fatalf("a failed activation left an instance: %+v", s.Instances())
		}
	}
}
