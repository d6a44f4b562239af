package hop

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testutil"
)

// boundHostnames is how many hostnames the hostname-aware fleet has bound
// while its hop is measured.
const boundHostnames = 200

// bindHostnames binds n more hostnames (h<i>.bench.test/counters, each its
// own env) in a's fleet: an outside worker, as pinboard/REGISTRY.md
// specifies one, registers them with the challenge and heartbeats until
// the benchmark ends. Its routes are what a fleet of previews would have
// bound; the benchmark's requests never name them.
func bindHostnames(b testing.TB, a *testutil.Agent, n int) {
	b.Helper()
	var mu sync.Mutex
	pairs := map[string]string{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		v, ok := pairs[r.URL.Query().Get("challenge")]
		mu.Unlock()
		if r.URL.Path != "/_pinned/challenge" || !ok {
			http.NotFound(w, r)
			return
		}
		fmt.Fprint(w, v)
	}))
	b.Cleanup(srv.Close)
	challenge := func(body map[string]any) map[string]any {
		c, v := randHex(b), randHex(b)
		mu.Lock()
		pairs[c] = v // a handful per benchmark: kept, never pruned
		mu.Unlock()
		body["challenge"], body["challengeValue"] = c, v
		return body
	}
	type route struct {
		Hostname  string `json:"hostname"`
		Namespace string `json:"namespace"`
		Env       string `json:"env"`
	}
	routes := make([]route, n)
	for i := range routes {
		routes[i] = route{fmt.Sprintf("h%d.bench.test", i), "/counters", fmt.Sprintf("h%d", i)}
	}
	clientID := "bench-bindings-" + randHex(b)[:8]
	var reg struct {
		SessionID string `json:"sessionId"`
	}
	post(b, a, "/registry/register", challenge(map[string]any{
		"clientId": clientID, "advertiseUrl": srv.URL, "routes": routes, "headroom": 0,
	}), &reg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(time.Second) // the fleet's lease is 5 s
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				body, _ := json.Marshal(challenge(map[string]any{"clientId": clientID, "sessionId": reg.SessionID, "headroom": 0}))
				r, err := testutil.Do(ctx, "POST", a.URL+"/registry/heartbeat", string(body), map[string]string{"Authorization": "Bearer " + testutil.Token})
				if err == nil && r.Code != http.StatusOK && ctx.Err() == nil {
					b.Errorf("outside worker's heartbeat: %d %s", r.Code, r.Body)
				}
			}
		}
	}()
	b.Cleanup(func() { cancel(); <-done })
}

// post sends body as JSON to a's path with the token and decodes a 200's
// answer into out.
func post(b testing.TB, a *testutil.Agent, path string, body any, out any) {
	b.Helper()
	raw, err := json.Marshal(body)
	if err != nil {
		b.Fatal(err)
	}
	r, err := testutil.Do(context.Background(), "POST", a.URL+path, string(raw), map[string]string{"Authorization": "Bearer " + testutil.Token})
	if err != nil || r.Code != http.StatusOK {
		b.Fatalf("POST %s: %v %d %s", path, err, r.Code, r.Body)
	}
	if err := json.Unmarshal([]byte(r.Body), out); err != nil {
		b.Fatalf("POST %s: %q: %v", path, r.Body, err)
	}
}

func randHex(b testing.TB) string {
	var buf [16]byte
	if _, err := rand.Read(buf[:]); err != nil {
		b.Fatal(err)
	}
	return hex.EncodeToString(buf[:])
}

// The hostname-aware fleet BenchmarkHop measures, set up as it is: the
// outside worker's registration binds its hostnames beside the fleet's,
// the counter is served through 127.0.0.1 from either node, and a request
// through one of the outside worker's hostnames is forwarded to it (it
// answers 404 to everything but its challenge).
func TestHostnameAwareFleetForTheBenchmark(t *testing.T) {
	g := startFleetWith(t, "", []string{"127.0.0.1/counters=COUNTER,env=bench"}, "--insecure-cluster", "--hostname-aware")
	bindHostnames(t, g.entry, boundHostnames-1)
	var out struct {
		Workers []struct {
			Routes []struct{ Hostname string } `json:"routes"`
		} `json:"workers"`
	}
	r := g.entry.MustDo("GET", "/registry/workers", "")
	r.JSON(t, &out)
	bound := map[string]bool{}
	for _, w := range out.Workers {
		for _, rt := range w.Routes {
			bound[rt.Hostname] = true
		}
	}
	if len(bound) != boundHostnames {
		t.Fatalf("%d hostnames bound, want %d", len(bound), boundHostnames)
	}
	id := g.place(t, "/counters", "/value")
	for _, a := range []*testutil.Agent{g.owner, g.entry} {
		if err := getOK(http.DefaultClient, a.URL+"/counters/"+id+"/value"); err != nil {
			t.Fatal(err)
		}
	}
	r, err := testutil.Do(context.Background(), "GET", g.entry.URL+"/counters/"+id+"/value", "", map[string]string{"Host": "h7.bench.test"})
	if err != nil || r.Code != http.StatusNotFound || r.Body != "404 page not found\n" {
		t.Fatalf("through a hostname the outside worker binds: %v %d %q, want its own 404", err, r.Code, r.Body)
	}
}
