package relay

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testutil"
	"golang.org/x/sys/unix"
)

// While requests flow the loop waits in epoll_wait itself (held waits);
// once they stop it waits in epoll_wait through the scheduler's syscall
// path, which lets the P go. It never holds while other goroutines wait
// for a P, nor with one P: they would wait on it. With one P it parks in
// Go's poller.
func TestLoopHoldsOnlyWhileBusy(t *testing.T) {
	procs := max(runtime.GOMAXPROCS(0), 2)
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
	rig := newConnsRig(t)
	c := rig.client()
	before := heldWaits.Load()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		rig.requestUntil(c, stop, nil)
	}()
	err := testutil.Eventually(10*time.Second, func() bool { return heldWaits.Load() > before+10 })
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatalf("the busy loop made %d held waits: %v", heldWaits.Load()-before, err)
	}
	if err := testutil.Eventually(10*time.Second, connsBlocked); err != nil {
		t.Fatalf("the idle loop is not in a blocking wait: %v\n%s", err, strings.Join(testutil.Goroutines(), "\n\n"))
	}
	if holder.Load() {
		t.Fatal("an idle loop still holds its wait")
	}

	// Goroutines waiting for a P get the loop's: with one spinning
	// goroutine per P, beside the loop and the client, one of them is
	// always waiting, however many Ps there are (-cpu 4, 8).
	var spin atomic.Bool
	spin.Store(true)
	var spinners sync.WaitGroup
	for range procs {
		spinners.Add(1)
		go func() {
			defer spinners.Done()
			for spin.Load() {
			}
		}()
	}
	before = heldWaits.Load()
	for i := range 50 {
		if code, _, _ := rig.get(c, "GET", fmt.Sprintf("/up/fixed?busy=%d", i), ""); code != 200 {
			t.Errorf("request %d beside busy goroutines: %d", i, code)
			break
		}
	}
	spin.Store(false)
	spinners.Wait()
	if n := heldWaits.Load() - before; n != 0 {
		t.Fatalf("with goroutines waiting for a P the loop held %d waits, want none", n)
	}

	// One P from now on. The loop may still be busy from the requests
	// above and hold a wait or two before a held wait finds nothing; what
	// counts is that once idle it parks, and then neither holds nor locks.
	runtime.GOMAXPROCS(1)
	if err := testutil.Eventually(10*time.Second, connsParked); err != nil {
		runtime.GOMAXPROCS(procs)
		t.Fatalf("with GOMAXPROCS=1 the idle loop did not park in Go's poller: %v\n%s", err, strings.Join(testutil.Goroutines(), "\n\n"))
	}
	before = heldWaits.Load()
	for i := range 200 {
		if code, _, _ := rig.get(c, "GET", fmt.Sprintf("/up/fixed?one=%d", i), ""); code != 200 {
			t.Fatalf("request %d with one P: %d", i, code)
		}
	}
	held := heldWaits.Load() - before
	err = testutil.Eventually(10*time.Second, connsParked)
	runtime.GOMAXPROCS(procs)
	if held != 0 {
		t.Fatalf("with GOMAXPROCS=1 the loop held %d waits, want none", held)
	}
	if err != nil {
		t.Fatalf("with GOMAXPROCS=1 the idle loop did not park in Go's poller: %v\n%s", err, strings.Join(testutil.Goroutines(), "\n\n"))
	}
}

// requestUntil sends requests on c, checking each answer, until stop is
// closed; between(i), if set, runs after request i.
func (rig *connsRig) requestUntil(c *http.Client, stop <-chan struct{}, between func(i int)) {
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		default:
		}
		if code, _, body := rig.get(c, "GET", fmt.Sprintf("/up/fixed?i=%d", i), ""); code != 200 || body != fmt.Sprintf("fixed i=%d", i) {
			rig.t.Errorf("request %d: %d %q", i, code, body)
			return
		}
		if between != nil {
			between(i)
		}
	}
}

// connsParked: a Conns loop's goroutine is parked in Go's poller.
func connsParked() bool {
	return testutil.GoroutineWith("relay.(*Conns).run", "relay.(*life).park", "[IO wait")
}

// connsBlocked: a Conns loop's goroutine waits in a blocking syscall.
func connsBlocked() bool {
	return testutil.GoroutineWith("relay.(*Conns).run", "relay.(*life).block", "[syscall")
}

// With more than one P the loop keeps to one thread: all its waits, held
// and blocking, are made by the thread it is locked to, though a GC every
// millisecond stops it over and over (unlocked, each stop could resume it
// on another thread: its waits were seen on 5-6 threads). The waiting
// threads are read from /proc/self/task/*/syscall: the syscall and the
// epoll instance.
func TestLoopKeepsItsThread(t *testing.T) {
	procs := max(runtime.GOMAXPROCS(0), 2)
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
	rig := newConnsRig(t)
	c := rig.client()
	if code, _, _ := rig.get(c, "GET", "/up/fixed?first", ""); code != 200 {
		t.Fatalf("first request: %d", code)
	}
	rig.loop.mu.Lock()
	waiting := fmt.Sprintf("%d %#x ", unix.SYS_EPOLL_PWAIT, rig.loop.epfd)
	rig.loop.mu.Unlock()

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		rig.requestUntil(c, stop, func(i int) {
			if i%50 == 49 {
				time.Sleep(5 * time.Millisecond) // idle: blocking waits too
			}
		})
	}()
	go func() {
		defer wg.Done()
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				runtime.GC()
			}
		}
	}()
	threads := map[string]int{} // tid -> times seen waiting on the loop's epoll
	seen := 0
	// Two seconds of sampling at least, and until the loop was seen enough
	// times: on a loaded machine (-race, other packages' tests) a sampling
	// pass is slow and sees few waits.
	start := time.Now()
	for time.Since(start) < 2*time.Second || seen < 50 && time.Since(start) < 30*time.Second {
		files, _ := filepath.Glob("/proc/self/task/*/syscall")
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err == nil && strings.HasPrefix(string(b), waiting) {
				threads[filepath.Base(filepath.Dir(f))]++
				seen++
			}
		}
	}
	close(stop)
	wg.Wait()
	if seen < 20 {
		t.Fatalf("the loop was seen waiting only %d times", seen)
	}
	if len(threads) != 1 {
		t.Fatalf("the loop waited on %d threads (tid: times seen): %v", len(threads), threads)
	}
}
