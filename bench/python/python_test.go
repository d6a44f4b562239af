package python

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testutil"
)

const (
	clients = 8
	round   = 3 * time.Second
)

// BenchmarkPythonCounter prints the table; b.N is ignored (-benchtime 1x).
func BenchmarkPythonCounter(b *testing.B) {
	rounds := 3
	if s := os.Getenv("PY_ROUNDS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			b.Fatalf("PY_ROUNDS=%q: want a positive count", s)
		}
		rounds = n
	}
	script, path := testutil.PythonPlugin(b, "examples/python/counter")
	a := testutil.StartAgent(b, nil, "--dev", "--data-dir", filepath.Join(b.TempDir(), "data"),
		"--plugin", "/counters="+script, "--plugin-env", "/counters=PYTHONPATH="+path)
	// The Go counter behind the same kind of pinnedd tells what is Python's
	// and what is pinnedd's (the hop, the durable write) in the gap.
	g := testutil.StartAgent(b, nil, "--dev", "--data-dir", filepath.Join(b.TempDir(), "data-go"),
		"--plugin", "/counters="+testutil.Bin(b, "counter"))
	plain := startUvicorn(b)

	targets := []struct{ name, base string }{
		{"pinnedd + Python counter plugin", a.URL},
		{"plain uvicorn over TCP", plain},
		{"pinnedd + Go counter plugin (reference)", g.URL},
	}
	ops := []struct{ name, method, path string }{{"POST increment", "POST", "increment"}, {"GET value", "GET", "value"}}
	type key struct{ t, o int }
	results := map[key][]result{}
	for r := 0; r < rounds; r++ {
		for oi, o := range ops {
			for ti, t := range targets {
				res, err := load(t.base, o.method, o.path)
				if err != nil {
					b.Fatalf("%s %s: %v", t.name, o.name, err)
				}
				results[key{ti, oi}] = append(results[key{ti, oi}], res)
			}
		}
	}
	fmt.Printf("\nPython counter, owner to plugin: %d clients, %d rounds of %s each, interleaved (%s)\n\n",
		clients, rounds, round, time.Now().UTC().Format(time.DateOnly))
	fmt.Println("| request | server | req/s (median of rounds) | p50 (median of rounds) | errors |")
	fmt.Println("| --- | --- | ---: | ---: | ---: |")
	for oi, o := range ops {
		for ti, t := range targets {
			rs := results[key{ti, oi}]
			var rps []float64
			var p50 []time.Duration
			errs := 0
			for _, r := range rs {
				rps = append(rps, r.rps)
				p50 = append(p50, r.p50)
				errs += r.errors
			}
			slices.Sort(rps)
			slices.Sort(p50)
			fmt.Printf("| %s | %s | %.0f | %s | %d |\n", o.name, t.name, rps[len(rps)/2], p50[len(p50)/2].Round(time.Microsecond), errs)
		}
	}
	fmt.Println()
}

// startUvicorn serves plain_counter.py on a port of its own until b ends.
func startUvicorn(b *testing.B) string {
	addr := testutil.FreeAddr(b)
	host, port, _ := net.SplitHostPort(addr)
	cmd := exec.Command(testutil.Python, "-m", "uvicorn", "plain_counter:app", "--host", host, "--port", port,
		"--log-level", "warning", "--no-access-log", "--timeout-keep-alive", "120")
	cmd.Dir = "."
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	base := "http://" + addr
	testutil.WaitFor(b, 15*time.Second, "uvicorn serving", func() bool {
		r, err := testutil.Do(context.Background(), "GET", base+"/counters/x/value", "", nil)
		return err == nil && r.Code == 200
	})
	return base
}

type result struct {
	rps    float64
	p50    time.Duration
	errors int
}

// load runs clients closed-loop workers, each on its own counter id and
// kept-alive connection, for one round.
func load(base, method, op string) (result, error) {
	tr := &http.Transport{MaxIdleConnsPerHost: clients, DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	// Every id activated and its connection open before the clock starts.
	for c := range clients {
		if _, err := do(client, "GET", fmt.Sprintf("%s/counters/bench-%d/value", base, c)); err != nil {
			return result{}, err
		}
	}
	var mu sync.Mutex
	var lat []time.Duration
	errs := 0
	start := time.Now()
	deadline := start.Add(round)
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			url := fmt.Sprintf("%s/counters/bench-%d/%s", base, c, op)
			var mine []time.Duration
			bad := 0
			for time.Now().Before(deadline) {
				t0 := time.Now()
				if code, err := do(client, method, url); err != nil || code != 200 {
					bad++
					continue
				}
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			lat = append(lat, mine...)
			errs += bad
			mu.Unlock()
		}()
	}
	wg.Wait()
	el := time.Since(start)
	if len(lat) == 0 {
		return result{}, fmt.Errorf("no request succeeded (%d errors)", errs)
	}
	slices.Sort(lat)
	return result{rps: float64(len(lat)) / el.Seconds(), p50: lat[len(lat)/2], errors: errs}, nil
}

func do(c *http.Client, method, url string) (int, error) {
	resp, err := c.Do(mustReq(method, url))
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

func mustReq(method, url string) *http.Request {
	r, err := http.NewRequest(method, url, strings.NewReader(""))
	if err != nil {
		panic(err)
	}
	return r
}
