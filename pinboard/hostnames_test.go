package pinboard

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testutil"
	"github.com/pinnedd/pinnedd/passport"
)

// registerBody is a registration that passes every check before the
// hostname-aware fields' (the probe comes after them), plus extra fields.
func registerBody(extra string) string {
	return `{"clientId":"w1","advertiseUrl":"http://127.0.0.1:1","namespaces":["/threads"],"headroom":1,` +
		`"challenge":"c","challengeValue":"v"` + extra + `}`
}

// Single mode refuses each hostname-aware field; hostname-aware mode
// requires a hostname; bad routes are 400s. Nothing is registered.
func TestRegisterHostnameFieldsByMode(t *testing.T) {
	for _, aware := range []bool{false, true} {
		rig := newDoorRig(t, func(_ *doorRig, c *APIConfig) {
			c.Registry = NewRegistry(c.Dir, time.Minute)
			if aware {
				c.Registry.HostnameAware()
			}
		})
		cases := map[string]string{
			`,"hostname":"pr-1.example.com"`: "hostname requires hostname-aware mode",
			`,"env":"pr-1"`:                  "env requires hostname-aware mode",
			`,"envs":{"/threads":"x"}`:       "envs requires hostname-aware mode",
			`,"takeover":"deny"`:             "takeover requires hostname-aware mode",
			`,"epoch":2`:                     "epoch requires hostname-aware mode",
		}
		if aware {
			cases = map[string]string{
				``:                  "hostname is required in hostname-aware mode",
				`,"env":"pr-1"`:     "hostname is required in hostname-aware mode",
				`,"hostname":"a_b"`: `hostname "a_b" is not a host name`,
				`,"hostname":"pr-1.example.com","takeover":"steal"`:    `takeover "steal": want wind_down or deny`,
				`,"hostname":"pr-1.example.com","env":"a/b"`:           `env "a/b" must be`,
				`,"hostname":"pr-1.example.com","envs":{"/other":"x"}`: "envs names /other, which namespaces does not list",
			}
		}
		for extra, want := range cases {
			code, body, _ := rig.call(t, "POST", "/registry/register", "op-token", registerBody(extra))
			if code != http.StatusBadRequest || !strings.Contains(testutil.ErrorOf(t, body), want) {
				t.Errorf("aware %v, %s: %d %s, want 400 %q", aware, extra, code, body, want)
			}
		}
		if ws := rig.m.Workers(); len(ws) != 0 {
			t.Fatalf("registered %+v", ws)
		}
	}
}

// routedWorker is a Worker in hostname-aware mode with its own advertise
// server (the registry probes it), recording what it is told to drop.
type routedWorker struct {
	*Worker
	mu      sync.Mutex
	dropped []string
}

func newRoutedWorker(t *testing.T, reg *Registry, node string, routes ...RouteSpec) *routedWorker {
	t.Helper()
	rw := &routedWorker{}
	mux := http.NewServeMux()
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	rw.Worker = NewWorker(WorkerConfig{
		NodeID: node, AdvertiseURL: srv.URL, TTL: time.Hour, Logger: slog.New(slog.NewTextHandler(&testutil.SyncBuffer{}, nil)),
		Routes: func() []RouteSpec { return routes },
		OnSuperseded: func(rs []RouteSpec, why string) {
			rw.mu.Lock()
			defer rw.mu.Unlock()
			for _, r := range rs {
				rw.dropped = append(rw.dropped, r.Hostname+r.Namespace+": "+why)
			}
		},
	}, reg)
	mux.HandleFunc("GET /_pinned/challenge", rw.ServeChallenge)
	return rw
}

func (rw *routedWorker) told() []string {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	return slices.Clone(rw.dropped)
}

// The seeds' epoch displacement, from the workers' side: a registration
// that disagrees at the same epoch is refused (the worker serves the rest
// and says why), a higher epoch supersedes the holder, whose next
// heartbeat tells it; it registers without the route, reports it in its
// status and readiness, and the HTTP heartbeat answers the seeds' 409.
func TestWorkersSupersededByAHigherEpoch(t *testing.T) {
	var reg *Registry
	rig := newDoorRig(t, func(_ *doorRig, c *APIConfig) {
		reg = NewRegistry(c.Dir, time.Hour)
		reg.HostnameAware()
		c.Registry = reg
	})
	ctx := t.Context()
	a := newRoutedWorker(t, reg, "na",
		RouteSpec{Hostname: "PR-42.preview.example.com:443", Namespace: "/threads"},
		RouteSpec{Hostname: "pr-41.preview.example.com", Namespace: "/threads"})
	if err := a.register(ctx); err != nil {
		t.Fatal(err)
	}
	if b, ok := rig.m.Binding("pr-42.preview.example.com", "/threads"); !ok || b.Env != "pr-42.preview.example.com" {
		t.Fatalf("the env defaults to the normalized hostname: %+v %v", b, ok)
	}

	// c disagrees at epoch 0: refused with the seeds' words; it serves
	// its other route.
	c := newRoutedWorker(t, reg, "nc",
		RouteSpec{Hostname: "pr-42.preview.example.com", Namespace: "/threads", Env: "shared"},
		RouteSpec{Hostname: "pr-43.preview.example.com", Namespace: "/threads"})
	if err := c.register(ctx); err != nil {
		t.Fatal(err)
	}
	want := "hostname pr-42.preview.example.com/threads is bound to env pr-42.preview.example.com at epoch 0, not shared — register with a higher epoch to displace"
	if got := c.told(); len(got) != 1 || !strings.HasSuffix(got[0], want) {
		t.Fatalf("c was told %q", got)
	}
	if w, _ := rig.m.Worker(c.ClientID()); len(w.Routes) != 1 || w.Routes[0].Hostname != "pr-43.preview.example.com" {
		t.Fatalf("c registered %+v", w.Routes)
	}

	// b displaces at epoch 1.
	b := newRoutedWorker(t, reg, "nb", RouteSpec{Hostname: "pr-42.preview.example.com", Namespace: "/threads", Env: "shared", Epoch: 1})
	if err := b.register(ctx); err != nil {
		t.Fatal(err)
	}
	// a's heartbeat over HTTP: the seeds' 409, its lease renewed all the same.
	hb, _ := json.Marshal(HeartbeatRequest{ClientID: a.ClientID(), SessionID: a.SessionID(), Headroom: 1})
	code, body, _ := rig.call(t, "POST", "/registry/heartbeat", "op-token", string(hb))
	var nack struct {
		Superseded  bool        `json:"superseded"`
		Routes      []RouteSpec `json:"routes"`
		ExpiresInMs int64       `json:"expiresInMs"`
	}
	if err := json.Unmarshal([]byte(body), &nack); code != http.StatusConflict || err != nil || !nack.Superseded ||
		len(nack.Routes) != 1 || nack.Routes[0].Env != "pr-42.preview.example.com" || nack.ExpiresInMs <= 0 {
		t.Fatalf("heartbeat after displacement: %d %s", code, body)
	}
	// The worker's own heartbeat: it drops the route and registers the rest.
	if err := a.heartbeat(ctx); err != ErrReregister {
		t.Fatalf("heartbeat: %v", err)
	}
	if got := a.told(); len(got) != 1 || !strings.HasPrefix(got[0], "pr-42.preview.example.com/threads: superseded") {
		t.Fatalf("a was told %q", got)
	}
	if err := a.register(ctx); err != nil {
		t.Fatal(err)
	}
	if w, _ := rig.m.Worker(a.ClientID()); len(w.Routes) != 1 || w.Routes[0].Hostname != "pr-41.preview.example.com" {
		t.Fatalf("a re-registered %+v", w.Routes)
	}
	if st := a.Status(); len(st.Superseded) != 1 || st.Superseded[0].Hostname != "pr-42.preview.example.com" {
		t.Fatalf("a's status %+v", st.Superseded)
	}
	// Once its last route goes, it has nothing to register.
	a.drop([]RouteSpec{{Hostname: "pr-41.preview.example.com", Namespace: "/threads"}}, "test")
	if err := a.register(ctx); err != ErrNoRoutes {
		t.Fatalf("register with no routes left: %v", err)
	}
	// Forgetting a dropped route (its plugin re-added) lists it again.
	a.Forget(RouteSpec{Hostname: "pr-41.preview.example.com", Namespace: "/threads"})
	if err := a.register(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok := rig.m.Binding("pr-42.preview.example.com", "/threads"); !ok {
		t.Fatal("binding gone")
	}
}

const pvToken = "pv-token-0123456789abcdef0123456789"

// The passport's hostnames and envs claims bound what a worker key may
// register.
func TestRegisterHostnamesBoundByClaims(t *testing.T) {
	rig := newDoorRig(t, func(_ *doorRig, c *APIConfig) {
		c.Registry = NewRegistry(c.Dir, time.Minute)
		c.Registry.HostnameAware()
		p, err := passport.Parse([]byte(`{"providers":[{"type":"staticToken","id":"pinboard","keys":[
			{"name":"previews","token":{"env":"PV"},"scopes":["pinboard:worker"],
			 "claims":{"pinboard":{"namespaces":["*"],"allowedBackendHosts":["*"],"hostnames":[".preview.example.com"],"envs":["pr-42"]}}}]}]}`),
			func(string) (string, bool) { return pvToken, true }, nil)
		if err != nil {
			t.Fatal(err)
		}
		c.Tokens = NewPassportTokens(p)
	})
	for extra, want := range map[string]int{
		`,"hostname":"pr-42.other.example.com","env":"pr-42"`:  http.StatusForbidden,
		`,"hostname":"pr-42.preview.example.com","env":"prod"`: http.StatusForbidden,
		`,"hostname":"preview.example.com","env":"pr-42"`:      http.StatusForbidden, // the bare suffix is not under it
	} {
		code, body, _ := rig.call(t, "POST", "/registry/register", pvToken, registerBody(extra))
		if code != want || !strings.Contains(body, "may not register hostname") {
			t.Errorf("%s: %d %s", extra, code, body)
		}
	}
	// Admitted: the registry goes on to probe (nothing listens there).
	code, body, _ := rig.call(t, "POST", "/registry/register", pvToken, registerBody(`,"hostname":"pr-42.preview.example.com","env":"pr-42"`))
	if code != http.StatusForbidden || !strings.Contains(body, "did not answer this worker's challenge") {
		t.Fatalf("admitted registration: %d %s", code, body)
	}
}

// POST /registry/wind_down needs env in hostname-aware mode and refuses it
// in single mode, with the seeds' words.
func TestWindDownEnvByMode(t *testing.T) {
	for _, aware := range []bool{false, true} {
		rig := newDoorRig(t, func(_ *doorRig, c *APIConfig) {
			c.Registry = NewRegistry(c.Dir, time.Minute)
			if aware {
				c.Registry.HostnameAware()
			}
		})
		withEnv := `{"namespace":"/threads","id":"x","deadline":0,"env":"pr-42"}`
		without := `{"namespace":"/threads","id":"x","deadline":0}`
		bad, want := withEnv, "env requires hostname-aware mode"
		if aware {
			bad, want = without, "env is required in hostname-aware mode"
		}
		code, body, _ := rig.call(t, "POST", "/registry/wind_down", "op-token", bad)
		if code != http.StatusBadRequest || testutil.ErrorOf(t, body) != want {
			t.Errorf("aware %v: %d %s", aware, code, body)
		}
		if aware {
			code, body, _ = rig.call(t, "POST", "/registry/wind_down", "op-token", `{"namespace":"/threads","deadline":0,"env":"a b"}`)
			if code != http.StatusBadRequest || !strings.Contains(body, "env must be") {
				t.Errorf("bad env: %d %s", code, body)
			}
		}
	}
}
