package supervisor

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/examples/counter"
	"github.com/pinnedd/pinnedd/internal/testutil"
	"github.com/pinnedd/pinnedd/plugins/proto"
	"github.com/pinnedd/pinnedd/plugins/sdk"
)

// BenchmarkDataPlane measures one POST /increment on the counter host:
//
//	in-process    the handler called directly (no network)
//	loopback-http the handler behind a plain loopback HTTP server, same process
//	loopback-http-process  ... in another process: the bar for the plugin hop
//	unix          front door → HTTP over the plugin's unix socket → plugin
//	grpc-unary    a go-plugin gRPC unary call alone (Control.Health)
//
// Each reports p50/p99 latency in µs beside ns/op.
func BenchmarkDataPlane(b *testing.B) {
	b.Run("in-process", func(b *testing.B) {
		h, err := counter.Host().New(sdk.NewMemoryInstance("/counters", "bench"))
		if err != nil {
			b.Fatal(err)
		}
		measure(b, func() error {
			w := httptest.NewRecorder()
			h.ServeHTTP(w, httptest.NewRequest("POST", "/increment", nil))
			return nil
		})
	})
	b.Run("loopback-http", func(b *testing.B) {
		h, _ := counter.Host().New(sdk.NewMemoryInstance("/counters", "bench"))
		srv := httptest.NewServer(h)
		defer srv.Close()
		measure(b, post(srv.URL+"/increment"))
	})
	b.Run("loopback-http-process", func(b *testing.B) {
		measure(b, post(plainHTTPServer(b)+"/increment"))
	})
	b.Run("unix", func(b *testing.B) {
		_, srv := startSupervisor(b, testutil.Bin(b, "counter"), counter.Namespace)
		measure(b, post(srv.URL+"/counters/bench/increment"))
	})
	b.Run("unix-direct", func(b *testing.B) {
		// The plugin hop alone: a client on the plugin's data socket.
		s, _ := startSupervisor(b, testutil.Bin(b, "counter"), counter.Namespace)
		if _, err := s.acquire(context.Background(), "", Key{Namespace: counter.Namespace, ID: "direct"}, 1); err != nil {
			b.Fatal(err)
		}
		inc, _ := s.plugins().procs[0].current()
		client := &http.Client{Transport: inc.tr}
		measure(b, func() error {
			req, _ := http.NewRequest("POST", "http://plugin/increment", nil)
			req.Header.Set("X-Pinned-Namespace", counter.Namespace)
			req.Header.Set("X-Pinned-Id", "direct")
			resp, err := client.Do(req)
			if err != nil {
				return err
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return nil
		})
	})
	b.Run("grpc-unary", func(b *testing.B) {
		s, _ := startSupervisor(b, testutil.Bin(b, "counter"), counter.Namespace)
		inc, err := s.plugins().procs[0].current()
		if err != nil {
			b.Fatal(err)
		}
		measure(b, func() error {
			_, err := inc.conn.Control.Health(context.Background(), &proto.HealthRequest{})
			return err
		})
	})
}

// plainHTTPServer runs the counter as a plain HTTP server in another
// process: a loopback request that crosses processes, as the plugin hop does.
func plainHTTPServer(b *testing.B) string {
	cmd := exec.Command(testutil.Bin(b, "testhost"))
	cmd.Env = append(os.Environ(), "TESTHOST_SERVE_HTTP=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		b.Fatal(err)
	}
	return "http://" + strings.TrimSpace(strings.TrimPrefix(line, "listening "))
}

func post(url string) func() error {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	return func() error {
		resp, err := client.Post(url, "", nil)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	}
}

// measure runs op b.N times sequentially and reports latency percentiles.
func measure(b *testing.B, op func() error) {
	b.Helper()
	for range 50 { // warm connections and caches
		if err := op(); err != nil {
			b.Fatal(err)
		}
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		if err := op(); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	b.StopTimer()
	slices.Sort(lat)
	pct := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Nanoseconds()) / 1e3 }
	b.ReportMetric(pct(0.50), "p50-µs")
	b.ReportMetric(pct(0.99), "p99-µs")
}
