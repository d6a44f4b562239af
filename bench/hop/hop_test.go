package hop

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/clustertls"
	"github.com/pinnedd/pinnedd/internal/procstat"
	"github.com/pinnedd/pinnedd/internal/testutil"
)

// Workload sizes: the whole benchmark (binaries cached) stays well under
// two minutes on a 2-core machine.
const (
	seqRounds    = 6                       // interleaved rounds of sequential requests per row
	seqPerRound  = 1000                    // sequential requests per row per round
	seqWarm      = 100                     // warm-up requests per row per round
	conns        = 16                      // concurrent keep-alive connections
	loadRounds   = 8                       // interleaved rounds of the throughput run (HOP_ROUNDS overrides)
	loadDuration = 1500 * time.Millisecond // per row per round (12 s per row in all)
	loadWarm     = 300 * time.Millisecond
	sseStreams   = 200
	sseTargetKB  = 16
)

// rproxyEnv makes the test binary, re-executed, serve as the plain
// httputil.ReverseProxy baseline: its own process, like nginx and pinnedd.
const rproxyEnv = "HOP_RPROXY_TARGET"

func TestMain(m *testing.M) {
	if target := os.Getenv(rproxyEnv); target != "" {
		serveReverseProxy(target)
		return
	}
	os.Exit(m.Run())
}

// serveReverseProxy is baseline 3: the standard library's reverse proxy with
// the settings pinnedd's node-to-node proxy uses (Host kept, X-Forwarded-*,
// a pooled transport), in front of the owner's front door.
func serveReverseProxy(target string) {
	u, err := url.Parse(target)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	rp := &httputil.ReverseProxy{
		Transport: &http.Transport{MaxIdleConns: 1024, MaxIdleConnsPerHost: 256, IdleConnTimeout: 90 * time.Second},
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(u)
			pr.Out.Host = pr.In.Host
			pr.SetXForwarded()
		},
	}
	fmt.Printf("listening %s\n", ln.Addr())
	_ = http.Serve(ln, rp)
}

// BenchmarkHop prints the forwarding-hop table. It ignores b.N: one run is
// the whole measurement (-benchtime 1x).
func BenchmarkHop(b *testing.B) {
	nginxBin := findNginx(b)
	ngxName := "nginx " + nginxVersion(nginxBin)
	started := time.Now()
	loadBefore := loadavg()

	// Rows 1-4: node-to-node traffic in plain HTTP, the comparison the
	// plain gate was set on.
	f := startFleet(b, "", "--insecure-cluster")
	sse := measureSSE(b, f)

	counterID := f.place(b, "/counters", "/value")
	path := "/counters/" + counterID + "/value"
	rproxy, rproxyPID := startReverseProxy(b, f.owner.URL)
	ngx, ngxPID := startNginx(b, nginxBin, f.owner.URL, nil)

	ownerNode := func() []int { return withChildren(f.owner.PID()) } // pinnedd and its plugins
	rows := []*row{
		{name: "no hop: the owner node serves its own id", url: f.owner.URL + path, owner: ownerNode,
			note: "are from a fleet started with --insecure-cluster (node-to-node HTTP in plain text)"},
		{name: "pinnedd hop (plain): entry node → owner (attested)", url: f.entry.URL + path, owner: ownerNode,
			fwd: func() []int { return []int{f.entry.PID()} }},
		{name: "httputil.ReverseProxy → owner's front door (plain)", url: rproxy + path, owner: ownerNode,
			fwd: func() []int { return []int{rproxyPID} }},
		{name: ngxName + " → owner's front door (plain, keepalive upstream)", url: ngx + path, owner: ownerNode,
			fwd: func() []int { return withChildren(ngxPID) }}, // master and workers
	}
	// Rows 5-7: the default fleet, mutual TLS between nodes. nginx takes
	// the hop as a node would: to the owner's cluster port, over TLS,
	// presenting the entry node's certificate.
	tf := startFleet(b, "")
	// Held streams from an owner over TLS stay in net/http (the relay loop
	// for held streams reads raw descriptors): what each costs there.
	tlsSSE := measureSSE(b, tf)
	{
		tid := tf.place(b, "/counters", "/value")
		tpath := "/counters/" + tid + "/value"
		tngx, tngxPID := startNginx(b, nginxBin, "https://"+tf.ownerRaft, &upstreamTLS{dir: tf.entryTLS, name: tf.ownerID})
		checkServedByOwner(b, tf, tngx, "/counters/"+tid)
		tOwner := func() []int { return withChildren(tf.owner.PID()) }
		n := len(rows)
		rows = append(rows,
			&row{name: "no hop (mTLS fleet): the owner node serves its own id", url: tf.owner.URL + tpath, owner: tOwner, base: n,
				note: "are from a fleet with mutual TLS between nodes (the default)"},
			&row{name: "pinnedd hop over mTLS: entry node → owner's cluster port", url: tf.entry.URL + tpath, owner: tOwner,
				fwd: func() []int { return []int{tf.entry.PID()} }, base: n, role: "tls-hop"},
			&row{name: ngxName + " proxy_ssl → owner's cluster port (mTLS, keepalive, session reuse)", url: tngx + tpath, owner: tOwner,
				fwd: func() []int { return withChildren(tngxPID) }, base: n, role: "tls-nginx"},
		)
	}
	if abBin := os.Getenv("HOP_AB_BIN"); abBin != "" {
		// The plain rows 1 and 2 from a fleet running another build,
		// interleaved with the rest: an A/B in one run, drift and all.
		g := startFleet(b, abBin, "--insecure-cluster")
		gid := g.place(b, "/counters", "/value")
		gOwner := func() []int { return withChildren(g.owner.PID()) }
		n := len(rows)
		rows = append(rows,
			&row{name: "B build (" + filepath.Base(abBin) + "): no hop", url: g.owner.URL + "/counters/" + gid + "/value", owner: gOwner, base: n,
				note: "are rows 1 and 2 from a fleet running another pinnedd build (HOP_AB_BIN), also --insecure-cluster"},
			&row{name: "B build (" + filepath.Base(abBin) + "): pinnedd hop (plain)", url: g.entry.URL + "/counters/" + gid + "/value", owner: gOwner,
				fwd: func() []int { return []int{g.entry.PID()} }, base: n, role: "ab-hop"},
		)
	}
	{
		// This build with --fast-path=false on both nodes: every request
		// in net/http, what the fast path is measured against.
		g := startFleet(b, "", "--insecure-cluster", "--fast-path=false")
		gid := g.place(b, "/counters", "/value")
		gOwner := func() []int { return withChildren(g.owner.PID()) }
		n := len(rows)
		rows = append(rows,
			&row{name: "--fast-path=false: no hop", url: g.owner.URL + "/counters/" + gid + "/value", owner: gOwner, base: n,
				note: "are rows 1 and 2 from a fleet running this build with --insecure-cluster --fast-path=false on both nodes"},
			&row{name: "--fast-path=false: pinnedd hop (plain)", url: g.entry.URL + "/counters/" + gid + "/value", owner: gOwner,
				fwd: func() []int { return []int{g.entry.PID()} }, base: n, role: "slow-hop"},
		)
	}
	{
		// This build in hostname-aware mode with hostnameRows hostnames
		// bound: the fleet's counter under 127.0.0.1 (the Host the load
		// client sends), the rest by an outside worker that registers
		// them through the registry and keeps its lease (bind.go).
		g := startFleetWith(b, "", []string{"127.0.0.1/counters=COUNTER,env=bench"}, "--insecure-cluster", "--hostname-aware")
		bindHostnames(b, g.entry, boundHostnames-1)
		gid := g.place(b, "/counters", "/value")
		gOwner := func() []int { return withChildren(g.owner.PID()) }
		n := len(rows)
		rows = append(rows,
			&row{name: fmt.Sprintf("--hostname-aware, %d hostnames bound: no hop", boundHostnames), url: g.owner.URL + "/counters/" + gid + "/value", owner: gOwner, base: n,
				note: fmt.Sprintf("are rows 1 and 2 from a fleet running this build with --insecure-cluster --hostname-aware, %d hostnames bound (the counter's, 127.0.0.1, and %d an outside worker registered)", boundHostnames, boundHostnames-1)},
			&row{name: fmt.Sprintf("--hostname-aware, %d hostnames bound: pinnedd hop (plain)", boundHostnames), url: g.entry.URL + "/counters/" + gid + "/value", owner: gOwner,
				fwd: func() []int { return []int{g.entry.PID()} }, base: n, role: "hostname-hop"},
		)
	}
	for _, r := range rows {
		if err := getOK(http.DefaultClient, r.url); err != nil {
			b.Fatalf("%s: %v", r.name, err)
		}
	}
	measureLatency(b, rows)
	measureThroughput(b, rows)
	hop, ngxRow := rows[1], rows[3]
	tlsHop, tlsNgx := withRole(rows, "tls-hop"), withRole(rows, "tls-nginx")
	var atRate string
	if v := os.Getenv("HOP_RATE"); v != "" {
		rate, err := strconv.Atoi(v)
		if err != nil || rate <= 0 {
			b.Fatalf("HOP_RATE=%q: want requests per second", v)
		}
		at := []*row{hop, ngxRow, tlsHop, tlsNgx}
		if r := withRole(rows, "ab-hop"); r != nil {
			at = append(at, r)
		}
		atRate = measureAtRate(b, rate, at...)
	}
	if dir := os.Getenv("HOP_PROFILE"); dir != "" {
		profileHop(b, f, hop.url, ngxRow.url, dir, "")
		profileHop(b, tf, tlsHop.url, tlsNgx.url, dir, "tls-")
	}

	table := renderTable(rows, sse, tlsSSE) + atRate
	fmt.Print("\n" + table + "\n")
	b.ReportMetric(hop.p50-rows[hop.base].p50, "hop-p50-µs")
	b.ReportMetric(ngxRow.p50-rows[ngxRow.base].p50, "nginx-p50-µs")
	b.ReportMetric(hop.rps, "hop-req/s")
	b.ReportMetric(ngxRow.rps, "nginx-req/s")
	b.ReportMetric(tlsHop.p50-rows[tlsHop.base].p50, "tls-hop-p50-µs")
	b.ReportMetric(tlsNgx.p50-rows[tlsNgx.base].p50, "tls-nginx-p50-µs")
	b.ReportMetric(tlsHop.rps, "tls-hop-req/s")
	b.ReportMetric(tlsNgx.rps, "tls-nginx-req/s")
	b.ReportMetric(sse.perStreamKB, "KB/stream")

	cmd := os.Getenv("HOP_BENCH_CMD")
	if cmd == "" {
		cmd = "go test -run XXX -bench BenchmarkHop -benchtime 1x ./bench/hop/"
	}
	writeResults(b, cmd, started, loadBefore, table)
}

// fleet is two pinnedd nodes: entry forwards to owner.
type fleet struct {
	entry, owner *testutil.Agent
	// ownerID and ownerRaft are the owner's node id (its certificate's
	// CommonName) and cluster port (its --raft-addr); entryTLS is the entry
	// node's <data-dir>/tls: its certificate and key, the cluster CA.
	ownerID, ownerRaft, entryTLS string
}

// startFleet starts the two nodes from bin ("": this tree's pinnedd), with
// extra flags on both.
func startFleet(b testing.TB, bin string, extra ...string) *fleet {
	b.Helper()
	return startFleetWith(b, bin, nil, extra...)
}

// startFleetWith is startFleet with plugins, if given, in place of the
// --plugin flags: COUNTER in one stands for the counter's path.
func startFleetWith(b testing.TB, bin string, plugins []string, extra ...string) *fleet {
	b.Helper()
	if bin == "" {
		bin = testutil.Bin(b, "pinnedd")
	}
	th := testutil.Bin(b, "testhost")
	counter := testutil.Bin(b, "counter")
	if bin == os.Getenv("HOP_AB_BIN") && bin != "" {
		// The B build's own plugins (bench-hop-ab.sh builds them).
		th, counter = os.Getenv("HOP_AB_TESTHOST"), os.Getenv("HOP_AB_COUNTER")
		if th == "" || counter == "" {
			b.Fatal("HOP_AB_BIN needs HOP_AB_TESTHOST and HOP_AB_COUNTER (scripts/bench-hop-ab.sh sets them)")
		}
	}
	// HOP_AGENT_ENV adds environment to both nodes (e.g. GOMAXPROCS=1).
	env := append([]string{"PINBOARD_TOKEN=" + testutil.Token}, strings.Fields(os.Getenv("HOP_AGENT_ENV"))...)
	dirs := b.TempDir()
	pluginFlags := []string{"--plugin", "/counters=" + counter, "--plugin", "/misc=" + th}
	if plugins != nil {
		pluginFlags = nil
		for _, p := range plugins {
			pluginFlags = append(pluginFlags, "--plugin", strings.ReplaceAll(p, "COUNTER", counter))
		}
	}
	node := func(id, raftAddr string, more ...string) []string {
		return append(append(append(pluginFlags,
			"--node-id", id, "--raft-addr", raftAddr, "--data-dir", filepath.Join(dirs, id), "--local-state",
			// Loopback's X-Forwarded-For is trusted so the benchmark can
			// pose as many client IPs and place ids on the owner.
			"--trusted-proxies", "127.0.0.1/32",
			// pinnedd's default timings (Raft's heartbeats and elections
			// included), except a 5 s lease (the shortest that outlasts
			// an election at Raft's default timeout), which the cold-start
			// quarantine lasts, renewed every second.
			"--lease-ttl", "5s", "--heartbeat-interval", "1s",
			// testutil asks for debug logs; a benchmark wants the default.
			"--log-level", "info",
		), more...), extra...)
	}
	raft1, raft2 := testutil.FreeAddr(b), testutil.FreeAddr(b)
	n1 := testutil.StartAgentBin(b, bin, env, node("n1", raft1, "--bootstrap")...)
	n2 := testutil.StartAgentBin(b, bin, env, node("n2", raft2, "--join", n1.URL)...)
	testutil.WaitFleet(b, 15*time.Second, n1, n2)
	return &fleet{entry: n1, owner: n2, ownerID: "n2", ownerRaft: raft2, entryTLS: filepath.Join(dirs, "n1", "tls")}
}

// place activates ids in ns through the owner node, posing as a new client
// IP each time, until one lands on the owner; it returns that id.
func (f *fleet) place(b testing.TB, ns, path string) string {
	b.Helper()
	for i := range 100 {
		id := fmt.Sprintf("hop%d", i)
		hdr := map[string]string{"X-Forwarded-For": fmt.Sprintf("10.77.%d.%d", i/250, i%250+1)}
		r, err := testutil.Do(context.Background(), "GET", f.owner.URL+ns+"/"+id+path, "", hdr)
		if err != nil || r.Code != 200 {
			b.Fatalf("place %s/%s: %v %d %s", ns, id, err, r.Code, r.Body)
		}
		if runs(b, f.owner, ns, id) && !runs(b, f.entry, ns, id) {
			return id
		}
	}
	b.Fatalf("no %s id landed on the owner node in 100 tries", ns)
	return ""
}

// runs reports whether a's /_pinned/status lists the instance.
func runs(b testing.TB, a *testutil.Agent, ns, id string) bool {
	b.Helper()
	st, err := a.Status()
	if err != nil {
		b.Fatal(err)
	}
	return st.Runs(ns, id)
}

// checkServedByOwner makes sure proxy (a proxy's URL) reaches the owner's
// counter at counter ("/counters/<id>"): an increment sent through it shows
// in what the owner itself answers. An nginx upstream on the owner's
// cluster port, which speaks only TLS, answers only once the handshake,
// the certificate nginx presents included, was accepted.
func checkServedByOwner(b *testing.B, f *fleet, proxy, counter string) {
	b.Helper()
	value := func(method, u string) int64 {
		r, err := testutil.Do(context.Background(), method, u, "", nil)
		if err != nil || r.Code != http.StatusOK {
			b.Fatalf("%s %s: %v %d %s", method, u, err, r.Code, r.Body)
		}
		var v struct {
			Value int64 `json:"value"`
		}
		if err := json.Unmarshal([]byte(r.Body), &v); err != nil {
			b.Fatalf("%s %s: %q: %v", method, u, r.Body, err)
		}
		return v.Value
	}
	before := value(http.MethodGet, f.owner.URL+counter+"/value")
	if got := value(http.MethodPost, proxy+counter+"/increment"); got != before+1 {
		b.Fatalf("POST %s%s/increment answered %d; the owner had %d", proxy, counter, got, before)
	}
	if got := value(http.MethodGet, f.owner.URL+counter+"/value"); got != before+1 {
		b.Fatalf("an increment through %s did not reach the owner's counter: it has %d, had %d", proxy, got, before)
	}
}

// row is one line of the table.
type row struct {
	name     string
	url      string
	lat      []time.Duration
	p50, p99 float64 // µs
	rps      float64
	roundRPS []float64 // req/s of each throughput round, in round order
	// p50 and p99 of each latency round, µs, in round order
	roundP50, roundP99 []float64
	// fwd and owner list the forwarding processes (none for row 1) and the
	// owner node's (pinnedd and its plugins), whose CPU per request the
	// throughput run measures.
	fwd, owner func() []int
	base       int    // the row its hop columns are measured against: its fleet's no-hop row
	role       string // "tls-hop", "tls-nginx": the mTLS gate's two rows; "ab-hop": the B build's hop; "slow-hop": this build's hop with --fast-path=false; "hostname-hop": in hostname-aware mode
	// note, on a fleet's no-hop row, says what that fleet is, under the table
	note              string
	fwdCPU, ownerCPU  time.Duration
	fwdPerReq, ownPer float64 // µs of CPU per request
}

// cpuOf is the CPU time (user and system, all threads) the processes have
// used, from /proc/<pid>/stat.
func cpuOf(pids []int) time.Duration {
	var d time.Duration
	for _, pid := range pids {
		d += procstat.CPUOf(pid)
	}
	return d
}

// withChildren is pid and its child processes. Each thread has its own
// children file, and Go starts a child from whichever thread runs the
// call, so every thread's is read.
func withChildren(pid int) []int {
	pids := []int{pid}
	files, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	for _, name := range files {
		b, _ := os.ReadFile(name)
		for _, f := range strings.Fields(string(b)) {
			if c, err := strconv.Atoi(f); err == nil {
				pids = append(pids, c)
			}
		}
	}
	return pids
}

func getOK(c *http.Client, u string) error {
	resp, err := c.Get(u)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		return fmt.Errorf("GET %s: status %d", u, resp.StatusCode)
	}
	return nil
}

// measureLatency sends sequential keep-alive requests, one client per row,
// rows interleaved round by round so drift on a shared machine hits all.
func measureLatency(b *testing.B, rows []*row) {
	b.Helper()
	clients := make([]*getter, len(rows))
	for i, r := range rows {
		g, err := newGetter(r.url)
		if err != nil {
			b.Fatal(err)
		}
		clients[i] = g
		defer g.close()
	}
	for round := range seqRounds {
		for k := range rows {
			i := k
			if round%2 == 1 {
				i = len(rows) - 1 - k
			}
			r, c := rows[i], clients[i]
			for range seqWarm {
				if err := c.get(); err != nil {
					b.Fatalf("%s: %v", r.name, err)
				}
			}
			for range seqPerRound {
				t0 := time.Now()
				if err := c.get(); err != nil {
					b.Fatalf("%s: %v", r.name, err)
				}
				r.lat = append(r.lat, time.Since(t0))
			}
		}
	}
	for _, r := range rows {
		for round := range seqRounds {
			lat := slices.Clone(r.lat[round*seqPerRound : (round+1)*seqPerRound])
			slices.Sort(lat)
			r.roundP50 = append(r.roundP50, percentile(lat, 0.50))
			r.roundP99 = append(r.roundP99, percentile(lat, 0.99))
		}
		slices.Sort(r.lat)
		r.p50, r.p99 = percentile(r.lat, 0.50), percentile(r.lat, 0.99)
	}
}

// measureThroughput runs conns keep-alive clients (one connection each)
// flat out against each row for loadDuration per round.
func measureThroughput(b *testing.B, rows []*row) {
	b.Helper()
	done := make([]int64, len(rows))
	var elapsed = make([]time.Duration, len(rows))
	for round := range throughputRounds(b) {
		for k := range rows {
			i := k
			if round%2 == 1 {
				i = len(rows) - 1 - k
			}
			r := rows[i]
			var fwd []int
			if r.fwd != nil {
				fwd = r.fwd()
			}
			owner := r.owner()
			f0, o0 := cpuOf(fwd), cpuOf(owner)
			n, d, err := load(r.url)
			if err != nil {
				b.Fatalf("%s at %d connections: %v", r.name, conns, err)
			}
			// CPU counts the warm-up too: per request it is over the
			// requests of the whole load, which load's count includes.
			r.fwdCPU += cpuOf(fwd) - f0
			r.ownerCPU += cpuOf(owner) - o0
			done[i] += n
			elapsed[i] += d
			r.roundRPS = append(r.roundRPS, float64(n)/d.Seconds())
		}
	}
	for i, r := range rows {
		r.rps = float64(done[i]) / elapsed[i].Seconds()
		total := float64(done[i]) * float64(loadDuration+loadWarm) / float64(loadDuration)
		r.fwdPerReq = float64(r.fwdCPU.Microseconds()) / total
		r.ownPer = float64(r.ownerCPU.Microseconds()) / total
	}
}

// throughputRounds is loadRounds, or HOP_ROUNDS: more rounds narrow the
// interval on the req/s ratio when one run's must decide.
func throughputRounds(b testing.TB) int {
	v := os.Getenv("HOP_ROUNDS")
	if v == "" {
		return loadRounds
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 2 {
		b.Fatalf("HOP_ROUNDS=%q: want a number of rounds, at least 2", v)
	}
	return n
}

func load(u string) (int64, time.Duration, error) {
	var (
		counting atomic.Bool
		stop     atomic.Bool
		count    atomic.Int64
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	for range conns {
		c, err := newGetter(u)
		if err != nil {
			return 0, 0, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.close()
			for !stop.Load() {
				if err := c.get(); err != nil {
					errOnce.Do(func() { firstErr = err })
					stop.Store(true)
					return
				}
				if counting.Load() {
					count.Add(1)
				}
			}
		}()
	}
	time.Sleep(loadWarm)
	t0 := time.Now()
	counting.Store(true)
	time.Sleep(loadDuration)
	counting.Store(false)
	d := time.Since(t0)
	n := count.Load()
	stop.Store(true)
	wg.Wait()
	return n, d, firstErr
}

// rateRounds and rateWindow shape the fixed-rate phase (HOP_RATE).
const (
	rateRounds = 3
	rateWindow = 4 * time.Second
)

// measureAtRate offers rows (the hop and nginx; in an A/B also the B
// build's hop) the same request rate, in windows taken in turn, and
// reports CPU per request of the forwarder, the owner's pinnedd and its
// plugins apart. At 16 connections each row serves as fast as it can, and
// a process's CPU per request moves with the rate (more requests per
// wake-up when busier); at one rate the rows' processes are compared like
// for like.
func measureAtRate(b *testing.B, rate int, rows ...*row) string {
	b.Helper()
	type sums struct {
		served              int64
		fwd, owner, plugins time.Duration
	}
	got := map[*row]*sums{}
	for _, r := range rows {
		got[r] = &sums{}
	}
	for round := range rateRounds {
		order := slices.Clone(rows)
		if round%2 == 1 {
			slices.Reverse(order)
		}
		for _, r := range order {
			fwd, all := r.fwd(), r.owner()
			owner, plugins := all[:1], all[1:]
			f0, o0, p0 := cpuOf(fwd), cpuOf(owner), cpuOf(plugins)
			n, err := loadAt(r.url, rate, rateWindow)
			if err != nil {
				b.Fatalf("%s at %d req/s: %v", r.name, rate, err)
			}
			g := got[r]
			g.served += n
			g.fwd += cpuOf(fwd) - f0
			g.owner += cpuOf(owner) - o0
			g.plugins += cpuOf(plugins) - p0
		}
	}
	var s strings.Builder
	fmt.Fprintf(&s, "\nAt a fixed offered rate (HOP_RATE=%d: %d connections, each sending on a fixed schedule; %d rounds of one %s window per row, the rows' order reversed every other round), CPU µs per request:\n\n", rate, conns, rateRounds, rateWindow)
	s.WriteString("| row | served req/s | forwarder | owner's pinnedd | owner's plugins |\n|---|---:|---:|---:|---:|\n")
	for _, r := range rows {
		g := got[r]
		per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(g.served) }
		fmt.Fprintf(&s, "| %s | %.0f | %.1f | %.1f | %.1f |\n", r.name, float64(g.served)/(rateRounds*rateWindow).Seconds(),
			per(g.fwd), per(g.owner), per(g.plugins))
	}
	return s.String()
}

// loadAt sends rate requests a second to u for d over conns connections,
// each on a fixed schedule (a late answer delays only its own connection's
// next request), and returns how many were answered.
func loadAt(u string, rate int, d time.Duration) (int64, error) {
	period := time.Duration(float64(time.Second) * float64(conns) / float64(rate))
	var (
		count    atomic.Int64
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	start := time.Now()
	end := start.Add(d)
	for i := range conns {
		c, err := newGetter(u)
		if err != nil {
			return 0, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.close()
			next := start.Add(period * time.Duration(i) / time.Duration(conns)) // phases spread over one period
			for next.Before(end) {
				time.Sleep(time.Until(next))
				if err := c.get(); err != nil {
					errOnce.Do(func() { firstErr = err })
					return
				}
				count.Add(1)
				next = next.Add(period)
			}
		}()
	}
	wg.Wait()
	return count.Load(), firstErr
}

// sseResult is the memory held proxied streams cost the forwarding node.
type sseResult struct {
	streams             int
	rssBefore, rssAfter int64 // bytes
	perStreamKB         float64
	goroutinesPerStream float64
	heapKBPerStream     float64
	stackKBPerStream    float64
}

// measureSSE opens sseStreams streams to an id on the owner through the
// entry node, each read as it flows, and compares the entry node's RSS
// before and after. It runs first, on a fresh entry node, so no memory freed
// by earlier load can be reused and hide the cost.
func measureSSE(b *testing.B, f *fleet) sseResult {
	b.Helper()
	id := f.place(b, "/misc", "/ping")
	u := f.entry.URL + "/misc/" + id + "/sse"
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: sseStreams, DisableCompression: true}}
	defer client.CloseIdleConnections()

	ctx, cancel := context.WithCancel(context.Background())
	var readers sync.WaitGroup
	defer func() { cancel(); readers.Wait() }()
	open := func(ctx context.Context) error {
		req, _ := http.NewRequestWithContext(ctx, "GET", u, nil)
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		if resp.StatusCode != 200 {
			resp.Body.Close()
			return fmt.Errorf("GET %s: status %d", u, resp.StatusCode)
		}
		br := bufio.NewReader(resp.Body)
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				resp.Body.Close()
				return fmt.Errorf("stream ended before its first event: %w", err)
			}
			if strings.HasPrefix(line, "data:") {
				break
			}
		}
		readers.Add(1)
		go func() {
			defer readers.Done()
			defer resp.Body.Close()
			_, _ = io.Copy(io.Discard, br)
		}()
		return nil
	}

	// Warm the forwarding path (proxy, transport, code pages) with one
	// stream and a few requests, so the baseline is a node that has
	// forwarded before.
	warmCtx, warmCancel := context.WithCancel(context.Background())
	if err := open(warmCtx); err != nil {
		b.Fatalf("SSE warm-up through the entry node: %v", err)
	}
	for range 20 {
		if err := getOK(http.DefaultClient, f.entry.URL+"/misc/"+id+"/ping"); err != nil {
			b.Fatal(err)
		}
	}
	warmCancel()
	time.Sleep(500 * time.Millisecond)

	pid := f.entry.PID()
	var res sseResult
	res.streams = sseStreams
	g0, h0, s0 := f.entry.Metric("go_goroutines"), f.entry.Metric("go_memstats_heap_inuse_bytes"), f.entry.Metric("go_memstats_stack_inuse_bytes")
	res.rssBefore = sampleRSS(b, pid)

	sem := make(chan struct{}, 16)
	errs := make(chan error, sseStreams)
	var opening sync.WaitGroup
	for range sseStreams {
		opening.Add(1)
		sem <- struct{}{}
		go func() {
			defer opening.Done()
			defer func() { <-sem }()
			if err := open(ctx); err != nil {
				errs <- err
			}
		}()
	}
	opening.Wait()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatalf("opening %d SSE streams through the entry node: %v", sseStreams, err)
	}
	time.Sleep(time.Second) // steady state: every stream flowing
	res.rssAfter = sampleRSS(b, pid)
	g1, h1, s1 := f.entry.Metric("go_goroutines"), f.entry.Metric("go_memstats_heap_inuse_bytes"), f.entry.Metric("go_memstats_stack_inuse_bytes")
	n := float64(sseStreams)
	res.perStreamKB = float64(res.rssAfter-res.rssBefore) / 1024 / n
	res.goroutinesPerStream = (g1 - g0) / n
	res.heapKBPerStream = (h1 - h0) / 1024 / n
	res.stackKBPerStream = (s1 - s0) / 1024 / n

	cancel()
	readers.Wait()
	client.CloseIdleConnections()
	// The streams are gone from the entry node once its goroutines are
	// back; the latency rows start on a quiet node.
	if err := testutil.Eventually(5*time.Second, func() bool { return f.entry.Metric("go_goroutines") <= g0+2 }); err != nil {
		b.Fatalf("closed SSE streams still held by the entry node: %v", err)
	}
	return res
}

// sampleRSS is the median of five VmRSS readings 100ms apart.
func sampleRSS(b *testing.B, pid int) int64 {
	b.Helper()
	var xs []int64
	for i := range 5 {
		if i > 0 {
			time.Sleep(100 * time.Millisecond)
		}
		v, err := vmRSS(pid)
		if err != nil {
			b.Fatal(err)
		}
		xs = append(xs, v)
	}
	slices.Sort(xs)
	return xs[len(xs)/2]
}

func vmRSS(pid int) (int64, error) {
	s, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(s), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb * 1024, err
		}
	}
	return 0, errors.New("no VmRSS in /proc/" + strconv.Itoa(pid) + "/status")
}

// startReverseProxy runs baseline 3 in its own process (this test binary,
// re-executed) and returns its URL; the benchmark's cleanup ends it.
func startReverseProxy(b *testing.B, target string) (string, int) {
	b.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), rproxyEnv+"="+target)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatalf("start the ReverseProxy baseline: %v", err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		b.Fatalf("ReverseProxy baseline did not start: %v", err)
	}
	return "http://" + strings.TrimSpace(strings.TrimPrefix(line, "listening ")), cmd.Process.Pid
}

func findNginx(b *testing.B) string {
	b.Helper()
	if p, err := exec.LookPath("nginx"); err == nil {
		return p
	}
	if _, err := os.Stat("/usr/sbin/nginx"); err == nil {
		return "/usr/sbin/nginx"
	}
	b.Fatal("nginx not found: the nginx baseline needs it; run scripts/bench-hop.sh, which installs it (apt-get install -y nginx-light || nginx)")
	return ""
}

func nginxVersion(bin string) string {
	out, _ := exec.Command(bin, "-v").CombinedOutput()
	v := strings.TrimSpace(string(out))
	if i := strings.Index(v, "nginx/"); i >= 0 {
		return strings.Fields(v[i+len("nginx/"):])[0]
	}
	return "?"
}

// upstreamTLS is how nginx reaches an owner's cluster port: as the node
// whose <data-dir>/tls it is given (its certificate and key, the cluster
// CA), checking that the owner's certificate names the node id name.
type upstreamTLS struct {
	dir, name string
}

// startNginx runs an nginx baseline: nginx in the foreground (daemon off)
// with a generated config in a temp dir, proxying to target (http://: the
// owner's front door; https:// with tls: its cluster port) over a
// keepalive upstream pool. The benchmark's cleanup ends it and its workers.
//
// In the foreground it stays in the benchmark's session, with every other
// process of the run. A daemon starts a session of its own, and where the
// kernel groups sessions for scheduling (sched_autogroup_enabled) that
// changes its share of the two cores: measured against one owner on this
// machine, the same config daemonized served about 10% fewer req/s.
func startNginx(b *testing.B, bin, target string, upTLS *upstreamTLS) (string, int) {
	b.Helper()
	dir := b.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	addr := testutil.FreeAddr(b)
	scheme, upstream, _ := strings.Cut(target, "://")
	v, _ := exec.Command(bin, "-V").CombinedOutput()
	var temps strings.Builder
	for _, m := range []string{"client_body", "proxy", "fastcgi", "uwsgi", "scgi"} {
		if m != "client_body" && m != "proxy" && strings.Contains(string(v), "--without-http_"+m+"_module") {
			continue
		}
		fmt.Fprintf(&temps, "\t%s_temp_path %s;\n", m, filepath.Join(dir, m))
	}
	user := ""
	if os.Geteuid() == 0 {
		user = "user root;\n"
	}
	var ssl string
	if upTLS != nil {
		// The node's key is sealed under the deployment token; nginx gets
		// a copy in clear, in its own directory.
		keyPEM := testutil.OpenSealed(b, filepath.Join(upTLS.dir, clustertls.KeyFile), clustertls.LabelNodeKey)
		keyPath := filepath.Join(dir, "node-key.pem")
		if err := os.WriteFile(keyPath, keyPEM, 0o600); err != nil {
			b.Fatal(err)
		}
		// nginx checks proxy_ssl_name with OpenSSL's X509_check_host: DNS
		// names only, so the raft host IP a node certificate carries never
		// matches; with no DNS name in the certificate it checks the
		// CommonName, a node's id. So the owner is verified as nodes verify
		// each other: signed by the cluster CA, and the node expected.
		ssl = fmt.Sprintf(`			proxy_ssl_certificate %s;
			proxy_ssl_certificate_key %s;
			proxy_ssl_trusted_certificate %s;
			proxy_ssl_verify on;
			proxy_ssl_name %s;
			proxy_ssl_protocols TLSv1.3;
			proxy_ssl_session_reuse on;
`, filepath.Join(upTLS.dir, clustertls.CertFile), keyPath,
			filepath.Join(upTLS.dir, clustertls.CAFile), upTLS.name)
	}
	conf := fmt.Sprintf(`daemon off;
master_process on;
worker_processes auto;
%spid %[2]s/nginx.pid;
error_log %[2]s/error.log warn;
events { worker_connections 4096; }
http {
	access_log off;
%[3]s	keepalive_requests 1000000;
	upstream owner {
		server %[4]s;
		keepalive 64;
		keepalive_requests 1000000;
	}
	server {
		listen %[5]s;
		location / {
			proxy_pass %[6]s://owner;
			proxy_http_version 1.1;
			proxy_set_header Connection "";
			proxy_set_header Host $host;
			proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
%[7]s		}
	}
}
`, user, dir, temps.String(), upstream, addr, scheme, ssl)
	confPath := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		b.Fatal(err)
	}
	var logs strings.Builder
	var logsMu sync.Mutex
	cmd := exec.Command(bin, "-p", dir, "-e", filepath.Join(dir, "error.log"), "-c", confPath)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Stdout = lockedWriter{&logsMu, &logs}
	cmd.Stderr = lockedWriter{&logsMu, &logs}
	if err := cmd.Start(); err != nil {
		b.Fatalf("start nginx: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	pgid := cmd.Process.Pid
	b.Cleanup(func() {
		// Fast shutdown: the master stops its workers and exits.
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			b.Errorf("nginx ignored SIGTERM for 5s; killing its process group")
		}
		// Anything of the group still there (a worker) goes too.
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-exited
	})
	u := "http://" + addr
	if err := testutil.Eventually(10*time.Second, func() bool {
		select {
		case <-exited:
			return true
		default:
		}
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return true
		}
		return false
	}); err != nil {
		b.Fatalf("nginx did not listen on %s: %v", addr, err)
	}
	select {
	case <-exited:
		logsMu.Lock()
		defer logsMu.Unlock()
		errLog, _ := os.ReadFile(filepath.Join(dir, "error.log"))
		b.Fatalf("nginx exited at start:\n%s\n%s\nconfig:\n%s", logs.String(), errLog, conf)
	default:
	}
	return u, cmd.Process.Pid
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func renderTable(rows []*row, sse, tlsSSE sseResult) string {
	var s strings.Builder
	s.WriteString("| # | request | p50 µs | p99 µs | req/s @16 conns | hop +p50 µs | hop +p99 µs | forwarder CPU µs/req | owner node CPU µs/req |\n")
	s.WriteString("|---|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for i, r := range rows {
		add50, add99, fwd := "—", "—", "—"
		if i != r.base {
			add50 = fmt.Sprintf("%+.0f", r.p50-rows[r.base].p50)
			add99 = fmt.Sprintf("%+.0f", r.p99-rows[r.base].p99)
		}
		if r.fwd != nil {
			fwd = fmt.Sprintf("%.0f", r.fwdPerReq)
		}
		fmt.Fprintf(&s, "| %d | %s | %.0f | %.0f | %.0f | %s | %s | %s | %.0f |\n", i+1, r.name, r.p50, r.p99, r.rps, add50, add99, fwd, r.ownPer)
	}
	for i, r := range rows {
		if r.note == "" {
			continue
		}
		last := i
		for j, o := range rows {
			if o.base == i {
				last = j
			}
		}
		fmt.Fprintf(&s, "\nRows %d–%d %s, measured in the same interleaved rounds; their hop columns are against row %d.\n",
			i+1, last+1, r.note, i+1)
	}
	fmt.Fprintf(&s, "\nHeld proxied SSE streams (%d, entry node → owner, /misc/<id>/sse): entry node RSS %.1f → %.1f MiB, "+
		"**%.1f KB per stream** (target ≤ %d KB); per stream: %.1f goroutines, %.1f KB Go heap in use (garbage included), %.1f KB goroutine stacks.\n",
		sse.streams, float64(sse.rssBefore)/(1<<20), float64(sse.rssAfter)/(1<<20),
		sse.perStreamKB, sseTargetKB, sse.goroutinesPerStream, sse.heapKBPerStream, sse.stackKBPerStream)
	fmt.Fprintf(&s, "Over mutual TLS (the rows 5–7 fleet; such streams stay in net/http): entry node RSS %.1f → %.1f MiB, "+
		"%.1f KB per stream; per stream: %.1f goroutines, %.1f KB Go heap in use, %.1f KB goroutine stacks.\n",
		float64(tlsSSE.rssBefore)/(1<<20), float64(tlsSSE.rssAfter)/(1<<20),
		tlsSSE.perStreamKB, tlsSSE.goroutinesPerStream, tlsSSE.heapKBPerStream, tlsSSE.stackKBPerStream)

	hop, ngx := rows[1], rows[3]
	verdict := func(ok bool) string {
		if ok {
			return "met"
		}
		return "NOT met"
	}
	fmt.Fprintf(&s, "\nTargets:\n")
	// The plain gate (rows 2 and 4): p50 within nginx's, and at least 97%
	// of nginx's req/s.
	fmt.Fprintf(&s, "- plain hop's p50 within nginx's (the round-by-round difference's 95%% CI reaches 0): p50 %+.0f vs %+.0f µs — %s; p99 %+.0f vs %+.0f µs\n",
		hop.p50-rows[hop.base].p50, ngx.p50-rows[ngx.base].p50, verdict(p50Within(hop, ngx)),
		hop.p99-rows[hop.base].p99, ngx.p99-rows[ngx.base].p99)
	fmt.Fprintf(&s, "  - p50 round by round, hop minus nginx: %s\n  - p99 round by round, hop minus nginx: %s\n",
		diffCI(hop.roundP50, ngx.roundP50), diffCI(hop.roundP99, ngx.roundP99))
	fmt.Fprintf(&s, "- plain hop at least 97%% of nginx's req/s at %d connections: %.0f vs %.0f (%.0f%%) — %s\n",
		conns, hop.rps, ngx.rps, 100*hop.rps/ngx.rps, verdict(hop.rps >= 0.97*ngx.rps))
	fmt.Fprintf(&s, "  - round by round, hop vs nginx: %s; %s\n", roundRatios(hop, ngx), ratioCI(hop, ngx))
	if r := withRole(rows, "ab-hop"); r != nil {
		fmt.Fprintf(&s, "  - this build's hop vs the B build's (row 2 vs row %d), round by round: %s; %s\n",
			slices.Index(rows, r)+1, roundRatios(hop, r), ratioCI(hop, r))
	}
	if th, tn := withRole(rows, "tls-hop"), withRole(rows, "tls-nginx"); th != nil && tn != nil {
		// The mTLS gate: req/s at least nginx's, p50 within nginx's, both
		// read as the p50 gate is: not measurably worse (the round-by-round
		// interval reaches parity). The point estimate is printed too.
		fmt.Fprintf(&s, "- mTLS hop vs nginx proxy_ssl (row %d vs row %d; req/s not below nginx's: the round-by-round ratio's 95%% CI reaches 100%%; p50 within nginx's): req/s %.0f%% (%s), p50 %+.0f µs (round by round: %s) — %s\n",
			slices.Index(rows, th)+1, slices.Index(rows, tn)+1, 100*th.rps/tn.rps, ratioCI(th, tn),
			th.p50-tn.p50, diffCI(th.roundP50, tn.roundP50), verdict(rpsNotBelow(th, tn) && p50Within(th, tn)))
		fmt.Fprintf(&s, "  - req/s round by round, hop vs nginx: %s; p99 %+.0f µs (round by round: %s)\n",
			roundRatios(th, tn), th.p99-tn.p99, diffCI(th.roundP99, tn.roundP99))
	}
	if r := withRole(rows, "hostname-hop"); r != nil {
		fmt.Fprintf(&s, "- hostname-aware hop with %d hostnames bound (row %d) vs single mode's (row 2): req/s round by round: %s; %s; p50 %+.0f µs over its own no-hop row (single mode's %+.0f)\n",
			boundHostnames, slices.Index(rows, r)+1, roundRatios(r, hop), ratioCI(r, hop), r.p50-rows[r.base].p50, hop.p50-rows[hop.base].p50)
	}
	if r := withRole(rows, "slow-hop"); r != nil {
		fmt.Fprintf(&s, "- with --fast-path=false (row %d) the hop serves %.0f req/s, %.0f%% of the fast path's; p50 %+.0f µs over its own no-hop row\n",
			slices.Index(rows, r)+1, r.rps, 100*r.rps/hop.rps, r.p50-rows[r.base].p50)
	}
	fmt.Fprintf(&s, "- ≤ %d KB per held proxied SSE stream: %.1f KB — %s\n", sseTargetKB, sse.perStreamKB, verdict(sse.perStreamKB <= sseTargetKB))
	return s.String()
}

// rpsNotBelow: a's req/s is not below b's within this run's interval (the
// round-by-round ratio's 95% CI reaches 100% or above).
func rpsNotBelow(a, b *row) bool {
	mean, half, ok := meanCI(logRatios(a, b))
	return ok && mean+half >= 0
}

// logRatios are a's req/s over b's, round by round, as logarithms.
func logRatios(a, b *row) []float64 {
	logs := make([]float64, min(len(a.roundRPS), len(b.roundRPS)))
	for i := range logs {
		logs[i] = math.Log(a.roundRPS[i] / b.roundRPS[i])
	}
	return logs
}

// p50Within: a's p50 is no worse than b's within this run's interval (the
// round-by-round difference's 95% CI reaches zero or below).
func p50Within(a, b *row) bool {
	mean, half, ok := meanCI(diffs(a.roundP50, b.roundP50))
	return ok && mean-half <= 0
}

// withRole is the row playing role, nil if none does.
func withRole(rows []*row, role string) *row {
	for _, r := range rows {
		if r.role == role {
			return r
		}
	}
	return nil
}

// roundRatios is a's req/s over b's in each throughput round: the spread
// says how far one run's verdict can be trusted.
func roundRatios(a, b *row) string {
	var out []string
	for i := range min(len(a.roundRPS), len(b.roundRPS)) {
		out = append(out, fmt.Sprintf("%.0f%%", 100*a.roundRPS[i]/b.roundRPS[i]))
	}
	return strings.Join(out, ", ")
}

// percentile is the p-th of sorted latencies, µs.
func percentile(sorted []time.Duration, p float64) float64 {
	return float64(sorted[int(p*float64(len(sorted)-1))].Nanoseconds()) / 1e3
}

// diffCI summarises per-round differences a[i]-b[i] (µs): their mean and
// its 95% confidence interval.
func diffCI(a, b []float64) string {
	mean, half, ok := meanCI(diffs(a, b))
	if !ok {
		return "too few rounds for an interval"
	}
	return fmt.Sprintf("mean %+.0f µs, 95%% CI %+.0f to %+.0f µs", mean, mean-half, mean+half)
}

// diffs is a - b, round by round.
func diffs(a, b []float64) []float64 {
	d := make([]float64, min(len(a), len(b)))
	for i := range d {
		d[i] = a[i] - b[i]
	}
	return d
}

// ratioCI summarises the per-round ratios of a's req/s to b's: their
// geometric mean and its 95% confidence interval (Student's t over the
// log-ratios, rounds taken as independent pairs). An interval that holds
// 100% says this run cannot tell the two apart.
func ratioCI(a, b *row) string {
	mean, half, ok := meanCI(logRatios(a, b))
	if !ok {
		return "too few rounds for an interval"
	}
	return fmt.Sprintf("geometric mean %.1f%%, 95%% CI %.1f–%.1f%%", 100*math.Exp(mean), 100*math.Exp(mean-half), 100*math.Exp(mean+half))
}

// meanCI is the mean of xs and the half-width of its 95% confidence
// interval (Student's t); ok false with fewer than 3 values.
func meanCI(xs []float64) (mean, half float64, ok bool) {
	n := len(xs)
	if n < 3 {
		return 0, 0, false
	}
	for _, x := range xs {
		mean += x
	}
	mean /= float64(n)
	var ss float64
	for _, x := range xs {
		ss += (x - mean) * (x - mean)
	}
	return mean, tCrit95(n-1) * math.Sqrt(ss/float64(n-1)/float64(n)), true
}

// tCrit95 is Student's t two-sided 95% critical value for df degrees of
// freedom.
func tCrit95(df int) float64 {
	table := []float64{0, 12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
		2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086}
	if df < len(table) {
		return table[df]
	}
	return 1.96 + 2.4/float64(df) // close enough past 20
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func writeResults(b *testing.B, cmd string, started time.Time, loadBefore, table string) {
	b.Helper()
	rounds := throughputRounds(b)
	commit, _ := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	var s strings.Builder
	fmt.Fprintf(&s, "# Forwarding-hop benchmark\n\n")
	fmt.Fprintf(&s, "- date: %s\n", started.UTC().Format(time.RFC3339))
	fmt.Fprintf(&s, "- command: `%s`\n", cmd)
	fmt.Fprintf(&s, "- commit: %s\n", strings.TrimSpace(string(commit)))
	fmt.Fprintf(&s, "- machine: %s/%s, %d CPUs, %s; load average before the run %s\n",
		runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version(), loadBefore)
	fmt.Fprintf(&s, "- run took %s; load average after %s\n\n", time.Since(started).Round(time.Second), loadavg())
	s.WriteString("Method, all in one run on loopback: two-node pinnedd fleets (`--plugin /counters=counter --plugin /misc=testhost`, " +
		"`--trusted-proxies 127.0.0.1/32` so the benchmark can place the id on the owner node; default timings but for a " +
		"5 s lease renewed every second, so the cold-start quarantine is short). Rows 1-4 come from a fleet started with " +
		"`--insecure-cluster` (node-to-node HTTP in plain text), rows 5-7 from one with mutual TLS between nodes (the default). " +
		"Every row requests `GET /counters/<id>/value` for an id owned by its fleet's second node: rows 1 and 5 sent to the " +
		"owner itself, rows 2 and 6 to the other node (one attested forwarding hop; row 6's to the owner's cluster port, over " +
		"mutual TLS), rows 3 and 4 to a proxy in front of the owner's front door: a plain " +
		"`httputil.ReverseProxy` in its own process, and nginx (`worker_processes auto`, `proxy_http_version 1.1`, " +
		"`proxy_set_header Connection \"\"`, upstream `keepalive 64`, `keepalive_requests` raised so no side recycles " +
		"connections); row 7 to the same nginx setup proxying to the owner's cluster port (its `--raft-addr`) over TLS 1.3: " +
		"`proxy_ssl_certificate` the entry node's certificate and key, the cluster CA trusted, `proxy_ssl_verify on` with " +
		"`proxy_ssl_name` the owner's node id (nginx matches a name against DNS SANs or, with none, the CommonName, never " +
		"an IP SAN), `proxy_ssl_session_reuse on`; an increment sent through it is checked to reach the owner's counter " +
		"before measuring. Further rows are named under the table. " +
		"Latency: " + strconv.Itoa(seqRounds*seqPerRound) + " sequential keep-alive requests per row, in " +
		strconv.Itoa(seqRounds) + " interleaved rounds after warm-up. Throughput: " + strconv.Itoa(conns) +
		" goroutines, one keep-alive connection each, " + (time.Duration(rounds) * loadDuration).String() +
		" per row over " + strconv.Itoa(rounds) + " interleaved rounds; the load generator shares the machine " +
		"(both use a minimal HTTP/1.1 client: GET, fixed-length answers, far cheaper than net/http's). " +
		"CPU per request: /proc/<pid>/stat user+system time over each throughput run, warm-up included, of the " +
		"forwarding process (the entry node, the ReverseProxy, nginx's master and workers) and of the owner node " +
		"(pinnedd and its plugin processes). " +
		"SSE: measured first, on the plain fleet's fresh entry node, after one warm-up stream; RSS is /proc/<pid>/status VmRSS " +
		"(median of 5 readings), heap and stacks from the node's /metrics.\n\n")
	s.WriteString(table)
	if err := os.WriteFile("RESULTS.md", []byte(s.String()), 0o644); err != nil {
		b.Fatal(err)
	}
}

// profileHop, with HOP_PROFILE=<dir>, loads a fleet's pinnedd hop row again
// while taking 5 s CPU profiles of both nodes, written to
// <dir>/<prefix>entry.pprof and <prefix>owner.pprof, then its nginx row while
// profiling the owner, to <prefix>owner-under-nginx.pprof (go tool pprof
// -top <file>; -diff_base compares the owner's two).
func profileHop(b *testing.B, f *fleet, hop, ngx, dir, prefix string) {
	b.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	profileWhile(b, hop, dir, map[string]*testutil.Agent{prefix + "entry": f.entry, prefix + "owner": f.owner})
	profileWhile(b, ngx, dir, map[string]*testutil.Agent{prefix + "owner-under-nginx": f.owner})
}

// profileWhile loads u while taking a 5 s CPU profile of each node.
func profileWhile(b *testing.B, u, dir string, nodes map[string]*testutil.Agent) {
	var wg sync.WaitGroup
	for name, a := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := testutil.Do(context.Background(), "GET", a.URL+"/_pinned/debug/pprof/profile?seconds=5", "",
				map[string]string{"Authorization": "Bearer " + testutil.Token})
			if err != nil || r.Code != 200 {
				b.Errorf("%s profile: %v %d", name, err, r.Code)
				return
			}
			if err := os.WriteFile(filepath.Join(dir, name+".pprof"), []byte(r.Body), 0o644); err != nil {
				b.Error(err)
			}
		}()
	}
	profiled := make(chan struct{})
	go func() { wg.Wait(); close(profiled) }()
	for {
		if _, _, err := load(u); err != nil {
			b.Errorf("load while profiling: %v", err)
		}
		select {
		case <-profiled:
			return
		default:
		}
	}
}
