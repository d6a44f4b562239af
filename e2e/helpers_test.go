package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testutil"
)

// status is GET /_pinned/status: testutil's decoder, shared with the
// benchmarks.
type status = testutil.Status

// statusOf reads a's status; an error when it does not answer 200 with one
// (a node that is down or restarting).
func statusOf(a *testutil.Agent) (status, error) { return a.Status() }

// getStatus is statusOf that fails t.
func getStatus(t *testing.T, a *testutil.Agent) status {
	t.Helper()
	st, err := statusOf(a)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// counterValue parses a counter's answer, {"value":N}.
func counterValue(body string) (int64, error) {
	var v struct {
		Value *int64 `json:"value"`
	}
	if err := json.Unmarshal([]byte(body), &v); err != nil || v.Value == nil {
		return 0, fmt.Errorf("not a counter value: %q (%v)", strings.TrimSpace(body), err)
	}
	return *v.Value, nil
}

// load is n clients POSTing to an agent without pause until Stop: acked
// counts the 200s, refused the 503s with Retry-After (each followed by a
// short pause, as a client backs off), and bad keeps the last other answer.
type load struct {
	acked, refused atomic.Int64
	bad            atomic.Value
	stop           chan struct{}
	wg             sync.WaitGroup
}

// startLoad starts n clients, client w posting to path(w).
func startLoad(a *testutil.Agent, n int, path func(w int) string) *load {
	return startLoadWith(n, func(w int) (testutil.Response, error) { return a.Do("POST", path(w), "") })
}

// startLoadWith starts n clients, client w sending post(w) again and again.
func startLoadWith(n int, post func(w int) (testutil.Response, error)) *load {
	l := &load{stop: make(chan struct{})}
	for w := range n {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for {
				select {
				case <-l.stop:
					return
				default:
				}
				r, err := post(w)
				switch {
				case err != nil:
					l.bad.Store(err.Error())
				case r.Code == 200:
					l.acked.Add(1)
				case r.Code == 503 && r.Header.Get("Retry-After") != "":
					l.refused.Add(1)
					time.Sleep(20 * time.Millisecond)
				default:
					l.bad.Store(fmt.Sprintf("%d %s", r.Code, r.Body))
				}
			}
		}()
	}
	return l
}

// Stop ends the clients and returns the last answer a client may not
// retry, nil if none came.
func (l *load) Stop() any {
	close(l.stop)
	l.wg.Wait()
	return l.bad.Load()
}

// swapTwiceUnderLoad hot-swaps the plugin serving /counters (named plugin
// in the agent's status) twice while 4 clients increment one counter, and
// checks what every swap must keep: no answer a client may not retry, the
// old processes gone, the final value exactly the acknowledged increments.
// It returns the plugin's three pids, oldest first.
func swapTwiceUnderLoad(t *testing.T, a *testutil.Agent, plugin string) []int {
	t.Helper()
	l := startLoad(a, 4, func(int) string { return "/counters/load/increment" })
	acked, refused := &l.acked, &l.refused
	pids := []int{pluginPID(t, a, plugin)}
	for i := range 2 {
		testutil.WaitFor(t, 10*time.Second, "load flowing", func() bool { return acked.Load() > int64(20*(i+1)) })
		if out, err := testutil.CLI(t, "plugins", "reload", "--addr", a.URL, "/counters"); err != nil {
			t.Fatalf("plugins reload: %v\n%s", err, out)
		}
		testutil.WaitFor(t, 15*time.Second, "new process serving", func() bool {
			pid := pluginPID(t, a, plugin)
			return pid != pids[len(pids)-1] && pid != 0
		})
		pids = append(pids, pluginPID(t, a, plugin))
	}
	testutil.WaitFor(t, 10*time.Second, "load after the swaps", func() bool { return acked.Load() > 80 })
	if b := l.Stop(); b != nil {
		t.Fatalf("a client saw an answer it may not retry: %v", b)
	}
	for _, old := range pids[:2] {
		testutil.WaitFor(t, 10*time.Second, "old plugin process stopped", func() bool { return !testutil.Alive(old) })
	}
	r := a.MustDo("GET", "/counters/load/value", "")
	if want := fmt.Sprintf(`{"value":%d}`, acked.Load()); strings.TrimSpace(r.Body) != want {
		t.Fatalf("final %s, want %s (refused %d)", r.Body, want, refused.Load())
	}
	return pids
}
