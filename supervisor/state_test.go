package supervisor

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testutil"
	"github.com/pinnedd/pinnedd/plugins/sdk"
	"github.com/pinnedd/pinnedd/statestore"
	"github.com/pinnedd/pinnedd/statestore/memstore"
)

// A host's durable state through a real plugin process and the Store
// service pinnedd serves it: a tray lists its fields (Tray.Fields), again
// after the instance is evicted and restored from the store; an append
// within the store's limits but over gRPC's default message size is stored
// and holds up nothing behind it; an instance holding more than that loads
// again; an append over MaxAppendBytes is refused at once.
func TestPluginTrayFieldsAndLargeState(t *testing.T) {
	store := memstore.New()
	s, err := New(Config{
		Specs:      []Spec{{Name: "p", Path: testutil.Bin(t, "testhost"), Namespaces: []string{"/fields"}}},
		Store:      store,
		BackoffMin: 10 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	gen := uint64(7)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		parts := strings.SplitN(r.URL.Path, "/", 4)
		serveCall(s, w, r, "/"+parts[1], parts[2], gen, "/"+parts[3])
	}))
	pids := []int{s.Plugins()[0].PID}
	t.Cleanup(func() {
		srv.Close()
		s.Stop(context.Background())
		testutil.CheckGone(t, pids)
		checkNoPlugins(t)
	})
	do := func(method, path, body string, want int) string {
		t.Helper()
		r, err := testutil.Do(context.Background(), method, srv.URL+"/fields/d1"+path, body, nil)
		if err != nil || r.Code != want {
			t.Fatalf("%s %s: %v %d %s, want %d", method, path, err, r.Code, r.Body, want)
		}
		return strings.TrimSpace(r.Body)
	}

	do("PUT", "/f/b", "2", http.StatusNoContent)
	do("PUT", "/f/a", "1", http.StatusNoContent)
	do("PUT", "/f/gone", "3", http.StatusNoContent)
	do("DELETE", "/f/gone", "", http.StatusNoContent)
	if got := do("GET", "/f", "", http.StatusOK); got != `["a","b"]` {
		t.Fatalf("fields: %s, want [\"a\",\"b\"]", got)
	}
	// 5 MiB in one append: over gRPC's default 4 MiB, within the store's 16.
	if got := do("POST", "/append?n=5&size=1048576", "", http.StatusOK); got != `{"appended":5,"items":5}` {
		t.Fatalf("5 MiB append: %s", got)
	}
	do("PUT", "/f/c", "4", http.StatusNoContent) // nothing stuck behind it
	do("POST", fmt.Sprintf("/append?n=%d&size=1048576", sdk.MaxAppendBytes>>20+1), "", http.StatusRequestEntityTooLarge)
	do("PUT", "/f/"+strings.Repeat("n", sdk.MaxFieldNameLen+1), "5", http.StatusRequestEntityTooLarge)

	// Evicted, then restored from the store under a newer generation:
	// the fields and the 5 MiB of items come back.
	if !s.Evict(context.Background(), Key{Namespace: "/fields", ID: "d1"}, time.Second) {
		t.Fatal("d1 was not live")
	}
	testutil.WaitFor(t, 5*time.Second, "d1 evicted", func() bool { return !s.Live("/fields", "d1") })
	gen = 8
	if got := do("GET", "/f", "", http.StatusOK); got != `["a","b","c"]` {
		t.Fatalf("fields after restore: %s, want [\"a\",\"b\",\"c\"]", got)
	}
	if g, _, _ := s.LiveGeneration(Key{Namespace: "/fields", ID: "d1"}); g != 8 {
		t.Fatalf("restored under generation %d, want 8", g)
	}
	trays, err := store.Load(context.Background(), statestore.InstanceKey{Namespace: "/fields", ID: "d1"}, 8)
	if err != nil || len(trays) != 2 || len(trays[0].Items) != 5 {
		t.Fatalf("stored: %d trays (%v), want big with 5 items and doc", len(trays), err)
	}
}
