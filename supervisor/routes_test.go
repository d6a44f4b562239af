package supervisor

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/pinnedd/pinnedd/internal/testutil"
	"github.com/pinnedd/pinnedd/plugins"
	"github.com/pinnedd/pinnedd/statestore"
	"github.com/pinnedd/pinnedd/statestore/memstore"
)

// In hostname-aware mode a node runs builds of one namespace side by side,
// each under its hostname: a request reaches its own hostname's build; ids
// live per env, so two hostnames of one env share an id's durable state
// and another env's id is another instance, stored under its
// StateNamespace; an id live under one hostname is not opened under
// another of its env (a takeover moves it, under a newer generation); and
// a route names one plugin.
func TestRoutesKeepEnvsApart(t *testing.T) {
	bin := testutil.Bin(t, "testhost")
	store := memstore.New()
	spec := func(name, host, env string) Spec {
		return Spec{Name: name, Path: bin, Namespaces: []string{"/fields"}, Bind: Binding{Hostname: host, Env: env}}
	}
	s, err := New(Config{
		Specs: []Spec{spec("a", "a.test", "shared"), spec("b", "b.test", "shared"), spec("c", "c.test", "solo")},
		Store: store,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	envOf := map[string]string{"a.test": "shared", "b.test": "shared", "c.test": "solo"}
	var gen atomic.Uint64
	gen.Store(1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host := plugins.NormalizeHost(r.Host)
		parts := strings.SplitN(r.URL.Path, "/", 4)
		k := Key{Env: envOf[host], Namespace: "/" + parts[1], ID: parts[2]}
		c, err := s.Open(r.Context(), host, k, gen.Load(), Activate)
		if err != nil {
			s.WriteOpenError(w, r, k.Namespace, err)
			return
		}
		c.ServeHTTP(w, r, "/"+parts[3])
	}))
	var pids []int
	for _, p := range s.Plugins() {
		pids = append(pids, p.PID)
	}
	t.Cleanup(func() {
		srv.Close()
		s.Stop(context.Background())
		testutil.CheckGone(t, pids)
		checkNoPlugins(t)
	})
	do := func(host, method, path, body string, want int) string {
		t.Helper()
		r, err := testutil.Do(context.Background(), method, srv.URL+"/fields/d1"+path, body, map[string]string{"Host": host})
		if err != nil || r.Code != want {
			t.Fatalf("%s %s %s: %v %d %s, want %d", host, method, path, err, r.Code, r.Body, want)
		}
		return strings.TrimSpace(r.Body)
	}

	if got := s.Routes(); len(got) != 3 || got[0].String() != "a.test/fields" || got[0].Bind.Env != "shared" || got[2].Bind.Env != "solo" {
		t.Fatalf("Routes() = %+v", got)
	}
	do("a.test", "PUT", "/f/x", "1", http.StatusNoContent)
	do("c.test", "PUT", "/f/y", "2", http.StatusNoContent)
	// Live under a.test: b.test (same env) is told a takeover is needed.
	do("b.test", "GET", "/f", "", http.StatusServiceUnavailable)
	if _, err := s.Open(t.Context(), "b.test", Key{"shared", "/fields", "d1"}, 1, Activate); !errors.Is(err, ErrOtherRoute) {
		t.Fatalf("open under b.test while live under a.test: %v, want ErrOtherRoute", err)
	}
	if _, err := s.Open(t.Context(), "a.test", Key{"solo", "/fields", "d1"}, 1, Activate); !errors.Is(err, ErrUnknownNS) {
		t.Fatalf("a.test opening an id of another env: %v, want ErrUnknownNS", err)
	}
	// A takeover re-places it under a newer generation: b.test's build
	// restores the state a.test's wrote.
	gen.Store(2)
	if got := do("b.test", "GET", "/f", "", http.StatusOK); got != `["x"]` {
		t.Fatalf("shared env through b.test: %s, want [\"x\"]", got)
	}
	if g, host, live := s.LiveGeneration(Key{"shared", "/fields", "d1"}); !live || g != 2 || host != "b.test" {
		t.Fatalf("after b.test took it over: generation %d under %q live %v, want 2 under b.test", g, host, live)
	}
	if got := do("c.test", "GET", "/f", "", http.StatusOK); got != `["y"]` {
		t.Fatalf("solo env through c.test: %s, want [\"y\"]", got)
	}
	for env, want := range map[string]int{"shared": 1, "solo": 1, "": 0} {
		trays, err := store.Load(t.Context(), statestore.InstanceKey{Namespace: plugins.StateNamespace(env, "/fields"), ID: "d1"}, 9)
		if err != nil || len(trays) != want {
			t.Errorf("stored under env %q: %d trays (%v), want %d", env, len(trays), err, want)
		}
	}

	// A superseded route's instances are aborted; the others run on.
	if n := s.AbortRoutes(t.Context(), []Route{{"c.test", "/fields"}}); n != 1 {
		t.Fatalf("AbortRoutes(c.test/fields) = %d instances, want 1", n)
	}
	if _, _, live := s.LiveGeneration(Key{"solo", "/fields", "d1"}); live {
		t.Fatal("solo's d1 still live after its route was aborted")
	}
	if _, host, live := s.LiveGeneration(Key{"shared", "/fields", "d1"}); !live || host != "b.test" {
		t.Fatal("shared's d1 went with another route's abort")
	}

	// One plugin per route; another hostname of the namespace is fine.
	if _, err := s.AddPlugin(t.Context(), spec("a2", "a.test", "other")); !errors.Is(err, ErrPluginConflict) {
		t.Fatalf("a second plugin for a.test/fields: %v, want ErrPluginConflict", err)
	}
	rs, err := s.AddPlugin(t.Context(), spec("d", "d.test", "solo"))
	if err != nil || !slices.Equal(rs, []Route{{"d.test", "/fields"}}) || !s.ServesRoute(Route{"d.test", "/fields"}) {
		t.Fatalf("add d.test: %v %v", rs, err)
	}
	pids = append(pids, s.Plugins()[len(s.Plugins())-1].PID)
	// A route names its plugin however the hostname is cased.
	if rs, ok := s.PluginRoutes("D.Test/fields"); !ok || !slices.Equal(rs, []Route{{"d.test", "/fields"}}) {
		t.Fatalf("PluginRoutes(D.Test/fields) = %v %v", rs, ok)
	}
	if rs, err := s.RemovePlugin(t.Context(), "d.test/fields"); err != nil || !slices.Equal(rs, []Route{{"d.test", "/fields"}}) {
		t.Fatalf("remove d.test/fields: %v %v", rs, err)
	}
	if s.ServesRoute(Route{"d.test", "/fields"}) || !s.ServesRoute(Route{"c.test", "/fields"}) {
		t.Fatal("remove took the wrong route")
	}
}
