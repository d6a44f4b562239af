package frontdoor

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testdir"

	"github.com/pinnedd/pinnedd/pinboard"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pinnedd/pinnedd/pinboard/directory"
)

// forwardRig is an entry front door whose directory places /counters/c1 on
// another worker, and that worker's owner-side route on loopback: a handler
// that checks the attestation with the owner's own Verifier and answers
// like the counter host.
type forwardRig struct {
	entry *httptest.Server
	owner *httptest.Server
	f     *FrontDoor
	dir   *pinboard.Directory
}

func newForwardRig(tb testing.TB) *forwardRig {
	return newForwardRigWith(tb, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", "12")
		io.WriteString(w, `{"value":1}`+"\n")
	})
}

// newForwardRigWith: the owner answers with serve once the attestation holds.
func newForwardRigWith(tb testing.TB, serve http.HandlerFunc) *forwardRig {
	tb.Helper()
	return newForwardRigConfig(tb, serve, nil)
}

// newForwardRigConfig is newForwardRigWith with the entry front door's
// config adjusted by mod.
func newForwardRigConfig(tb testing.TB, serve http.HandlerFunc, mod func(*nodeConfig)) *forwardRig {
	tb.Helper()
	secret := []byte("0123456789abcdef0123456789abcdef")
	var verifier pinboard.Verifier
	var forged atomic.Int64
	owner := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		signed := r.URL.EscapedPath()
		if r.URL.RawQuery != "" {
			signed += "?" + r.URL.RawQuery
		}
		// Front doors sign with the owner session's key (SignFor).
		if _, err := verifier.Verify(pinboard.WorkerKey(secret, "owner", "s1"), r.Header.Get(pinboard.AttestationHeader), "owner", r.Method, signed, time.Now()); err != nil {
			forged.Add(1)
			http.Error(w, err.Error(), http.StatusForbidden)
			return
		}
		serve(w, r)
	}))
	tb.Cleanup(owner.Close)

	m := directory.New()
	now := time.Now().UnixMilli()
	testdir.Apply(m, 1, directory.Init{Secret: secret})
	reg := directory.Register{
		ClientID: "owner", SessionID: "s1", NodeID: "n2", AdvertiseURL: owner.URL, Namespaces: []string{"/counters"},
		Headroom: 1 << 20, TTLMs: time.Hour.Milliseconds(), Now: now,
	}
	claim := directory.Claim{Key: directory.Key{Namespace: "/counters", ID: "c1"}, ClientID: "owner", Now: now}
	cfg := nodeConfig{Config: Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Registerer: prometheus.NewRegistry()}}
	if mod != nil {
		mod(&cfg)
	}
	var res directory.Result
	if cfg.HostnameAware {
		// The owner serves /counters under benchHostnames hostnames, each
		// its own env; c1 is placed through benchHost.
		var routes []directory.Route
		for i := range benchHostnames {
			h := fmt.Sprintf("h%d.preview.test", i)
			routes = append(routes, directory.Route{Hostname: h, Namespace: "/counters", Env: h})
		}
		reg.Namespaces = nil
		testdir.Apply(m, 2, directory.RegisterRoutes{Register: reg, Routes: routes})
		claim.Key.Env = benchHost
		res = testdir.Apply(m, 3, directory.ClaimRoute{Claim: claim, Hostname: benchHost, TTLMs: time.Hour.Milliseconds()})
	}
	if res.Code == 0 {
		testdir.Apply(m, 2, reg)
		res = testdir.Apply(m, 3, claim)
	}
	if res.Code != directory.CodeGranted {
		tb.Fatalf("claim: %v %s", res.Code, res.Reason)
	}
	dir := pinboard.NewDirectory(m, nil)
	tb.Cleanup(dir.Close)
	cfg.Dir = dir
	f := newNode(cfg)
	entry := httptest.NewServer(f)
	tb.Cleanup(func() {
		entry.Close()
		_ = f.Close()
		if n := forged.Load(); n > 0 {
			tb.Errorf("%d attestations refused", n)
		}
	})
	return &forwardRig{entry: entry, owner: owner, f: f, dir: dir}
}

// dial opens a raw connection to the entry front door (closed at the
// test's end) with a reader for its responses.
func (rig *forwardRig) dial(tb testing.TB) (net.Conn, *bufio.Reader) {
	tb.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(rig.entry.URL, "http://"))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	return conn, bufio.NewReader(conn)
}

// benchHostnames are the hostnames bound in a hostname-aware rig, and
// benchHost the one its requests name.
const (
	benchHostnames = 200
	benchHost      = "h137.preview.test"
)

// newHostnameForwardRig is newForwardRig in hostname-aware mode, with
// benchHostnames hostnames bound.
func newHostnameForwardRig(tb testing.TB) *forwardRig {
	return newForwardRigConfig(tb, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", "12")
		io.WriteString(w, `{"value":1}`+"\n")
	}, func(c *nodeConfig) { c.HostnameAware = true })
}

// BenchmarkForward: one GET through a real front door to the owner-side
// route over loopback (placement lookup, attestation, proxying, and the
// owner's verification), sequential on one keep-alive connection; in
// single mode, and in hostname-aware mode with 200 hostnames bound (one
// more map look-up: the request's binding).
func BenchmarkForward(b *testing.B) {
	b.Run("single", func(b *testing.B) { benchForward(b, newForwardRig(b), "") })
	b.Run(fmt.Sprintf("hostnames=%d", benchHostnames), func(b *testing.B) { benchForward(b, newHostnameForwardRig(b), benchHost) })
}

func benchForward(b *testing.B, rig *forwardRig, host string) {
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
	req, err := http.NewRequest("GET", rig.entry.URL+"/counters/c1/value", nil)
	if err != nil {
		b.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	get := func() {
		resp, err := c.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatalf("status %d", resp.StatusCode)
		}
	}
	get()
	b.ReportAllocs()
	cpu0 := processCPU()
	for b.Loop() {
		get()
	}
	// Wall time is mostly loopback wake-ups; CPU (client, entry and owner,
	// all in this process) is what a loaded node runs out of.
	b.ReportMetric(float64((processCPU()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func BenchmarkSign(b *testing.B) {
	key := []byte("0123456789abcdef0123456789abcdef")
	a := pinboard.Attestation{Target: "worker-4f2a9c", Caller: "worker-77ab01", Generation: 42, At: time.Now()}
	b.ReportAllocs()
	for b.Loop() {
		_ = pinboard.Sign(key, a, "GET", "/_pinned/i/counters/c1/value")
	}
}

func BenchmarkVerify(b *testing.B) {
	key := []byte("0123456789abcdef0123456789abcdef")
	var v pinboard.Verifier
	now := time.Now()
	headers := make([]string, 0, 1<<16)
	for i := range cap(headers) {
		headers = append(headers, pinboard.Sign(key, pinboard.Attestation{Target: "worker-4f2a9c", Caller: "worker-77ab01", Generation: 42, At: now, Nonce: "n" + strconv.Itoa(i)}, "GET", "/_pinned/i/counters/c1/value"))
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if i == len(headers) {
			b.StopTimer()
			v = pinboard.Verifier{}
			i = 0
			b.StartTimer()
		}
		if _, err := v.Verify(key, headers[i], "worker-4f2a9c", "GET", "/_pinned/i/counters/c1/value", now); err != nil {
			b.Fatal(err)
		}
		i++
	}
}
