package relay

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testutil"
)

// While requests flow the loop waits in epoll_wait itself (held waits);
// once they stop it parks in Go's poller and holds no P. It never holds
// while other goroutines wait for a P, nor with one P: they would wait on
// it.
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
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if code, _, body := rig.get(c, "GET", fmt.Sprintf("/up/fixed?i=%d", i), ""); code != 200 || body != fmt.Sprintf("fixed i=%d", i) {
				t.Errorf("request %d: %d %q", i, code, body)
				return
			}
		}
	}()
	err := testutil.Eventually(10*time.Second, func() bool { return heldWaits.Load() > before+10 })
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatalf("the busy loop made %d held waits: %v", heldWaits.Load()-before, err)
	}
	if err := testutil.Eventually(10*time.Second, loopParked); err != nil {
		t.Fatalf("the idle loop did not park in Go's poller: %v\n%s", err, strings.Join(testutil.Goroutines(), "\n\n"))
	}
	if holder.Load() {
		t.Fatal("a parked loop still holds its wait")
	}

	// Goroutines waiting for a P get the loop's: with two spinning
	// goroutines on two Ps, one of them is always waiting.
	var spin atomic.Bool
	spin.Store(true)
	var spinners sync.WaitGroup
	for range 2 {
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

	runtime.GOMAXPROCS(1)
	before = heldWaits.Load()
	for i := range 200 {
		if code, _, _ := rig.get(c, "GET", fmt.Sprintf("/up/fixed?one=%d", i), ""); code != 200 {
			t.Fatalf("request %d with one P: %d", i, code)
		}
	}
	runtime.GOMAXPROCS(procs)
	if n := heldWaits.Load() - before; n != 0 {
		t.Fatalf("with GOMAXPROCS=1 the loop held %d waits, want none", n)
	}
}

// loopParked: a relay loop's goroutine is parked in Go's poller.
func loopParked() bool { return testutil.GoroutineWith("relay.(*life).park", "[IO wait") }
