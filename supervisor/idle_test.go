package supervisor

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testutil"
)

// evictedLog records what OnEvicted reports.
type evictedLog struct {
	mu  sync.Mutex
	got map[Key]bool // key -> release
}

func (l *evictedLog) note(k Key, _ uint64, release bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.got == nil {
		l.got = map[Key]bool{}
	}
	l.got[k] = release
}

func (l *evictedLog) of(k Key) (release, seen bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	release, seen = l.got[k]
	return release, seen
}

// A host's own idle timeout (/hooks: 300ms) wins over the node's (60s
// here), and an idle eviction releases the placement unless the node keeps
// placements across idle eviction (a node-local state store).
func TestIdleEvictionByHostTimeoutReleases(t *testing.T) {
	for _, keep := range []bool{false, true} {
		// A subtest each: its supervisor is stopped, and its plugin gone,
		// before the next starts.
		t.Run(map[bool]string{false: "release", true: "keep"}[keep], func(t *testing.T) {
			var evicted evictedLog
			s, srv := serveSupervisor(t, Config{
				Specs:                []Spec{{Name: "p", Path: testutil.Bin(t, "testhost"), Namespaces: []string{"/hooks"}}},
				DetachedTimeout:      time.Minute,
				OnEvicted:            evicted.note,
				KeepPlacementsOnIdle: keep,
			})
			activateIdle(t, srv, "/hooks", "h")
			k := Key{Namespace: "/hooks", ID: "h"}
			testutil.WaitFor(t, 10*time.Second, "the idle eviction after the host's 300ms", func() bool {
				_, seen := evicted.of(k)
				return seen
			})
			if release, _ := evicted.of(k); release == keep {
				t.Fatalf("KeepPlacementsOnIdle %v: idle eviction released the placement: %v", keep, release)
			}
			if n := evictions(t, s, "/hooks", "idle"); n != 1 {
				t.Fatalf("%v idle evictions counted, want 1", n)
			}
		})
	}
}

// An instance whose idle hook keeps it (/keep) stays live, idle period
// after idle period.
func TestIdleHookKeepsInstance(t *testing.T) {
	events := filepath.Join(t.TempDir(), "events")
	s, srv := serveSupervisor(t, Config{
		Specs: []Spec{{Name: "p", Path: testutil.Bin(t, "testhost"), Namespaces: []string{"/keep"},
			Env: []string{"TESTHOST_EVENTS=" + events}}},
	})
	activateIdle(t, srv, "/keep", "k")
	testutil.WaitFor(t, 10*time.Second, "two idle periods (the idle hook ran twice)", func() bool {
		b, _ := os.ReadFile(events)
		return strings.Count(string(b), "idle /keep k") >= 2
	})
	if !s.Live("/keep", "k") {
		t.Fatal("an instance its idle hook keeps was evicted")
	}
	if n := evictions(t, s, "/keep", "idle"); n != 0 {
		t.Fatalf("%v idle evictions of a kept instance", n)
	}
	// Kept, not stuck: an operator's eviction still takes it.
	if !s.Evict(context.Background(), Key{Namespace: "/keep", ID: "k"}, time.Second) || s.Live("/keep", "k") {
		t.Fatal("the kept instance did not go on an operator's eviction")
	}
}
