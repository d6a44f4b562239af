package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testutil"
)

// SIGTERM on a node under load from kept-alive clients cuts no request it
// took: each request whose bytes went out on a connection gets an answer
// (its own, or a 503 for one the stopping node no longer starts) before
// that connection closes. A client (honouring Retry-After) that finds the
// node gone only fails to connect. Stopped and started three times.
func TestSIGTERMUnderLoadCutsNoRequest(t *testing.T) {
	t.Parallel()
	nodes := startFleet(t, "--drain-deadline", "1s")
	n1, n2 := nodes[0], nodes[1]

	for round := range 3 {
		ctx, stop := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		var answered, refused atomic.Int64
		var mu sync.Mutex
		var cut []string
		for c := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// One kept-alive connection per client, as a closed-loop
				// load generator holds.
				tr := &http.Transport{MaxIdleConnsPerHost: 1, DisableCompression: true}
				defer tr.CloseIdleConnections()
				client := &http.Client{Transport: tr, Timeout: 20 * time.Second}
				for i := 0; ctx.Err() == nil; i++ {
					var wrote atomic.Bool
					var got httptrace.GotConnInfo
					trace := &httptrace.ClientTrace{
						GotConn:      func(i httptrace.GotConnInfo) { got = i },
						WroteRequest: func(w httptrace.WroteRequestInfo) { wrote.Store(w.Err == nil) },
					}
					req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace),
						"POST", n2.url()+fmt.Sprintf("/counters/r%d-c%d-k%d/increment", round, c, i%3), nil)
					resp, err := client.Do(req)
					if err == nil {
						_, err = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						if err == nil {
							answered.Add(1)
							if resp.StatusCode == 503 && resp.Header.Get("Retry-After") != "" {
								time.Sleep(time.Second) // as a client honours Retry-After
							}
							continue
						}
					}
					if !wrote.Load() || (!got.Reused && errors.Is(err, syscall.ECONNRESET)) {
						// Never reached the node: it stopped listening,
						// or closed its listener with the connection
						// still in the kernel's accept queue (which
						// resets it). A request the node read and
						// dropped would end in EOF, not a reset.
						refused.Add(1)
						time.Sleep(5 * time.Millisecond)
						continue
					}
					mu.Lock()
					cut = append(cut, fmt.Sprintf("%s: request %d of client %d (connection %s, reused %v after %v idle): %v",
						time.Now().Format("15:04:05.000"), i, c, got.Conn.LocalAddr(), got.Reused, got.IdleTime, err))
					mu.Unlock()
				}
			}()
		}
		testutil.WaitFor(t, 20*time.Second, "load served", func() bool { return answered.Load() >= 200 })
		n2.a.Signal(syscall.SIGTERM)
		code, err := n2.a.Wait(60 * time.Second)
		stop()
		wg.Wait()
		if err != nil || code != 0 {
			t.Fatalf("round %d: n2 after SIGTERM: code %d, %v", round, code, err)
		}
		t.Logf("round %d: %d answered, %d not taken", round, answered.Load(), refused.Load())
		if len(cut) > 0 {
			t.Fatalf("round %d: %d requests the stopping node took were cut off, e.g.:\n%s", round, len(cut), strings.Join(cut[:min(5, len(cut))], "\n"))
		}
		n2.start(t, true)
		testutil.WaitFor(t, 20*time.Second, "n2 back", func() bool { return len(liveWorkers(t, n1)) == 3 })
	}
}
