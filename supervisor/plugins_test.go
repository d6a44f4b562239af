package supervisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/pinnedd/pinnedd/internal/testutil"
)

// A plugin added to a running node serves its namespace once its
// handshake passed; one that would serve another plugin's namespace, or
// take its name, is refused and leaves nothing running. Removing a plugin
// evicts its instances (releasing their placements), ends its process and
// takes its namespace away, while the others serve on; the last plugin
// stays.
func TestAddAndRemovePlugins(t *testing.T) {
	bin := testutil.Bin(t, "testhost")
	var mu sync.Mutex
	var released []Key
	s, srv := serveSupervisor(t, Config{
		Specs: []Spec{{Name: "p", Path: bin, Namespaces: []string{"/misc"}}},
		OnEvicted: func(k Key, _ uint64, release bool) {
			mu.Lock()
			defer mu.Unlock()
			if release {
				released = append(released, k)
			}
		},
	})
	ctx := t.Context()
	post := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Post(srv.URL+path, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := post("/tally/t1/inc"); code != http.StatusNotFound {
		t.Fatalf("/tally before it was added: %d", code)
	}

	nss, err := s.AddPlugin(ctx, Spec{Name: "q", Path: bin, Namespaces: []string{"/tally"}})
	if err != nil || !slices.Equal(nss, []Route{{Namespace: "/tally"}}) || !s.Serves("/tally") {
		t.Fatalf("add: %v %v", nss, err)
	}
	if code, body := post("/tally/t1/inc"); code != http.StatusOK || body != `{"value":1}` {
		t.Fatalf("the added plugin answered %d %s", code, body)
	}
	var qPID int
	for _, p := range s.Plugins() {
		if p.Name == "q" {
			qPID = p.PID
		}
	}

	// Refused: a namespace another plugin serves, a name another has.
	for name, sp := range map[string]Spec{
		"namespace": {Name: "r", Path: bin, Namespaces: []string{"/misc"}},
		"name":      {Name: "q", Path: bin, Namespaces: []string{"/jobs"}},
	} {
		if _, err := s.AddPlugin(ctx, sp); !errors.Is(err, ErrPluginConflict) {
			t.Fatalf("a plugin with a taken %s: %v", name, err)
		}
	}
	if got := len(s.Plugins()); got != 2 || s.Serves("/jobs") {
		t.Fatalf("after refusals: %d plugins, /jobs served %v", got, s.Serves("/jobs"))
	}

	// Removed: its instance goes (placement released), its process ends.
	nss, err = s.RemovePlugin(ctx, "/tally")
	if err != nil || !slices.Equal(nss, []Route{{Namespace: "/tally"}}) || s.Serves("/tally") {
		t.Fatalf("remove: %v %v", nss, err)
	}
	testutil.CheckGone(t, []int{qPID})
	mu.Lock()
	if !slices.Contains(released, Key{Namespace: "/tally", ID: "t1"}) {
		t.Errorf("the removed plugin's instance was not released: %v", released)
	}
	mu.Unlock()
	if code, _ := post("/tally/t1/inc"); code != http.StatusNotFound {
		t.Fatalf("/tally after its removal: %d", code)
	}
	if code, _ := post("/misc/m1/echo"); code != http.StatusOK {
		t.Fatalf("the other plugin after a removal: %d", code)
	}
	if _, err := s.RemovePlugin(ctx, "/misc"); !errors.Is(err, ErrPluginConflict) {
		t.Fatalf("removing the last plugin: %v", err)
	}
	if _, err := s.RemovePlugin(ctx, "/nope"); !errors.Is(err, ErrUnknownPlugin) {
		t.Fatalf("removing an unknown namespace: %v", err)
	}
	// A plugin added again under the removed one's name serves anew.
	if _, err := s.AddPlugin(context.Background(), Spec{Name: "q", Path: bin, Namespaces: []string{"/tally"}}); err != nil {
		t.Fatal(err)
	}
	if code, body := post("/tally/t1/inc"); code != http.StatusOK || body != `{"value":1}` {
		t.Fatalf("re-added: %d %s", code, body)
	}
}

// Plugins added and removed while requests flow to another plugin's
// namespace: those requests never fail, and the set each request reads is
// whole (run under -race).
func TestPluginsChangeUnderLoad(t *testing.T) {
	bin := testutil.Bin(t, "testhost")
	s, srv := serveSupervisor(t, Config{Specs: []Spec{{Name: "p", Path: bin, Namespaces: []string{"/misc"}}}})
	var failed atomic.Value
	var served atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := http.Post(fmt.Sprintf("%s/misc/w%d-%d/echo", srv.URL, w, i%3), "", nil)
				if err != nil {
					failed.Store(err.Error())
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					failed.Store(resp.Status)
					continue
				}
				served.Add(1)
			}
		}()
	}
	for range 3 {
		if _, err := s.AddPlugin(t.Context(), Spec{Name: "q", Path: bin, Namespaces: []string{"/tally"}}); err != nil {
			t.Fatal(err)
		}
		_ = s.Namespaces()
		if _, err := s.RemovePlugin(t.Context(), "/tally"); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	if f := failed.Load(); f != nil || served.Load() == 0 {
		t.Fatalf("requests to /misc while plugins came and went: served %d, a failure: %v", served.Load(), f)
	}
}
