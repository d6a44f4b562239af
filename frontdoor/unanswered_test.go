package frontdoor

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// A forwarded request the owner received and then left without an answer
// (its connection cut before a response head) may have run: the client
// gets 504 with a body that says so and no Retry-After, on the wire path
// and on ReverseProxy's (a body too large for the wire path), and the hop
// does not send it again. An owner nothing could reach gets 503 +
// Retry-After: it certainly did not run.
func TestUnansweredForwards(t *testing.T) {
	var received atomic.Int64
	rig := newForwardRigWith(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		received.Add(1)
		// The owner got the whole request, then its process died.
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		_ = conn.Close()
	})
	for _, tc := range []struct{ name, body string }{
		{"wire path", "x"},
		{"ReverseProxy path", strings.Repeat("x", 100<<10)},
	} {
		before := received.Load()
		resp, err := http.Post(rig.entry.URL+"/counters/c1/increment", "text/plain", strings.NewReader(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var got map[string]string
		_ = json.Unmarshal(body, &got)
		if resp.StatusCode != http.StatusGatewayTimeout || resp.Header.Get("Retry-After") != "" ||
			got["outcome"] != "unknown" || !strings.Contains(got["error"], "may have run") {
			t.Fatalf("%s: %d Retry-After %q %s, want 504 outcome unknown, no Retry-After", tc.name, resp.StatusCode, resp.Header.Get("Retry-After"), body)
		}
		if n := received.Load() - before; n != 1 {
			t.Fatalf("%s: the owner received the request %d times, want once (a sent request is never sent again)", tc.name, n)
		}
	}
	if got := counterValue(t, rig.f.fwd.failures.WithLabelValues(outcomeUnknown)); got != 2 {
		t.Fatalf("forward failures{outcome=unknown} = %v, want 2", got)
	}

	rig.owner.Close() // nothing listens on the owner's port now
	for _, body := range []string{"x", strings.Repeat("x", 100<<10)} {
		resp, err := http.Post(rig.entry.URL+"/counters/c1/increment", "text/plain", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(b), "owner unreachable") {
			t.Fatalf("refused dial (%d-byte body): %d Retry-After %q %s, want 503 + Retry-After", len(body), resp.StatusCode, resp.Header.Get("Retry-After"), b)
		}
	}
	if got := counterValue(t, rig.f.fwd.failures.WithLabelValues(outcomeUnreachable)); got != 2 {
		t.Fatalf("forward failures{outcome=unreachable} = %v, want 2", got)
	}
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}
