// Package frontdoor holds the benchmark of what HTTPS at the front door
// costs: one --dev node each serving plain HTTP (the kept-alive loop on),
// plain HTTP with --fast-path=false (net/http throughout) and HTTPS over
// HTTP/1.1 and HTTP/2 (net/http: the loop takes plain connections only),
// measured in the same interleaved rounds.
//
//	scripts/bench-frontdoor-tls.sh
//	go test -run XXX -bench BenchmarkFrontDoorTLS -benchtime 1x ./bench/frontdoor/
//
// Each row is kept-alive clients reading one counter's value on the node
// that owns it; it reports req/s and the pinnedd process's CPU per request
// (user+system from /proc, plugins not counted: they do the same work in
// every row). A plain go test ./... runs none of it.
package frontdoor

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/clustertls"
	"github.com/pinnedd/pinnedd/internal/procstat"
	"github.com/pinnedd/pinnedd/internal/testutil"
)

const (
	rounds   = 6
	perRound = 2 * time.Second
	clients  = 8
	path     = "/counters/bench/value"
)

type row struct {
	name   string
	agent  *testutil.Agent
	client *http.Client
	proto  string
	key    string // a bearer key sent with every request, if set
	rps    []float64
	cpuUs  []float64 // per request
}

func BenchmarkFrontDoorTLS(b *testing.B) {
	dir := b.TempDir()
	ca, err := clustertls.NewCA("bench")
	if err != nil {
		b.Fatal(err)
	}
	cert, key, err := ca.Issue("front", []string{"127.0.0.1"})
	if err != nil {
		b.Fatal(err)
	}
	certFile, keyFile, caFile := filepath.Join(dir, "front.pem"), filepath.Join(dir, "front-key.pem"), filepath.Join(dir, "ca.pem")
	for f, data := range map[string][]byte{certFile: cert, keyFile: key, caFile: ca.CertPEM()} {
		if err := os.WriteFile(f, data, 0o600); err != nil {
			b.Fatal(err)
		}
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.CertPEM())
	tr := func(h2 bool, tlsOn bool) *http.Client {
		t := &http.Transport{MaxIdleConnsPerHost: clients, MaxConnsPerHost: clients}
		if tlsOn {
			t.TLSClientConfig = &tls.Config{RootCAs: roots}
			if h2 {
				t.ForceAttemptHTTP2 = true
			} else {
				t.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
			}
		}
		return &http.Client{Transport: t, Timeout: 10 * time.Second}
	}
	plain := testutil.StartAgent(b, nil, "--dev")
	slow := testutil.StartAgent(b, nil, "--dev", "--fast-path=false")
	https := testutil.LaunchAgent(b, nil, "--dev", "--http-tls-cert", certFile, "--http-tls-key", keyFile, "--http-tls-ca", caFile)
	https.Client = tr(false, true)
	if err := https.WaitReady(30 * time.Second); err != nil {
		b.Fatal(err)
	}
	keys3 := testutil.StartAgent(b, passportEnv(3), "--dev")
	keys1000 := testutil.StartAgent(b, passportEnv(1000), "--dev")
	rows := []*row{
		{name: "plain HTTP/1.1, kept-alive loop (default)", agent: plain, client: tr(false, false), proto: "HTTP/1.1"},
		{name: "plain HTTP/1.1, --fast-path=false (net/http)", agent: slow, client: tr(false, false), proto: "HTTP/1.1"},
		{name: "HTTPS, HTTP/1.1 (net/http)", agent: https, client: tr(false, true), proto: "HTTP/1.1"},
		{name: "HTTPS, HTTP/2 (net/http)", agent: https, client: tr(true, true), proto: "HTTP/2.0"},
		{name: "plain, bearer key, passport of 1,000 keys (net/http)", agent: keys1000, client: tr(false, false), proto: "HTTP/1.1", key: appKey},
		{name: "plain, bearer key, passport of 3 keys (net/http)", agent: keys3, client: tr(false, false), proto: "HTTP/1.1", key: appKey},
	}
	for _, r := range rows {
		if r.key == "" {
			continue
		}
		// The key is checked (--dev admits a loopback request with no
		// Authorization header, never one with a wrong key).
		bad := map[string]string{"Authorization": "Bearer not-a-key-0123456789abcdef0123456789"}
		if resp, err := testutil.DoWith(context.Background(), r.client, "GET", r.agent.URL+path, "", bad); err != nil || resp.Code != 401 {
			b.Fatalf("%s with a wrong key: %v %+v", r.name, err, resp)
		}
	}
	for _, r := range rows {
		resp, err := testutil.DoWith(context.Background(), r.client, "GET", r.agent.URL+path, "", r.headers())
		if err != nil || resp.Code != 200 || resp.Proto != r.proto {
			b.Fatalf("%s: %v %+v", r.name, err, resp)
		}
	}
	b.ResetTimer()
	for round := range rounds {
		order := slices.Clone(rows)
		if round%2 == 1 {
			// The last rows measured in a round fare a little worse on
			// this VM: the two passport rows take turns at the end.
			order[4], order[5] = order[5], order[4]
		}
		for _, r := range order {
			n, cpu := load(b, r)
			r.rps = append(r.rps, float64(n)/perRound.Seconds())
			r.cpuUs = append(r.cpuUs, float64(cpu.Microseconds())/float64(n))
		}
	}
	b.StopTimer()
	base := median(rows[1].cpuUs)
	fmt.Printf("\n| front door | req/s (median of %d) | pinnedd CPU µs/req | CPU vs plain net/http |\n|---|---:|---:|---:|\n", rounds)
	for _, r := range rows {
		fmt.Printf("| %s | %.0f | %.1f | %.2f× |\n", r.name, median(r.rps), median(r.cpuUs), median(r.cpuUs)/base)
	}
	fmt.Printf("\n%d kept-alive clients, %s per row per round, rows interleaved; GET %s on a --dev node (its own id).\n", clients, perRound, path)
	b.ReportMetric(median(rows[2].cpuUs)/base, "https-h1-cpu-ratio")
	b.ReportMetric(median(rows[4].cpuUs)/median(rows[5].cpuUs), "passport-1000-vs-3-cpu-ratio")
	b.ReportMetric(median(rows[0].cpuUs)/base, "loop-cpu-ratio")
}

// load runs clients kept-alive clients against r for perRound; it returns
// the requests answered 200 and the agent's CPU meanwhile.
func load(b *testing.B, r *row) (int64, time.Duration) {
	var n atomic.Int64
	ctx, cancel := context.WithTimeout(context.Background(), perRound)
	defer cancel()
	pid := r.agent.PID()
	before := procstat.CPUOf(pid)
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for ctx.Err() == nil {
				req, _ := http.NewRequestWithContext(ctx, "GET", r.agent.URL+path, nil)
				if r.key != "" {
					req.Header.Set("Authorization", "Bearer "+r.key)
				}
				resp, err := r.client.Do(req)
				if err != nil {
					continue
				}
				var buf [256]byte
				for {
					if _, err := resp.Body.Read(buf[:]); err != nil {
						break
					}
				}
				resp.Body.Close()
				if resp.StatusCode == 200 {
					n.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return n.Load(), procstat.CPUOf(pid) - before
}

func (r *row) headers() map[string]string {
	if r.key == "" {
		return nil
	}
	return map[string]string{"Authorization": "Bearer " + r.key}
}

const (
	nodeKey = "bench-node-key-0123456789abcdef0123456789"
	appKey  = "bench-app-key-0123456789abcdef01234567890"
)

// passportEnv is the environment of a --dev node under a passport of n
// keys (n >= 3): the node's own, a client key for /counters (which needs
// one), and n-2 others.
func passportEnv(n int) []string {
	env := []string{"PINBOARD_TOKEN=" + nodeKey, "BENCH_APP=" + appKey}
	keys := []string{
		`{"name":"node","token":{"env":"PINBOARD_TOKEN"},"scopes":["pinboard:worker"],"claims":{"pinboard":{"namespaces":["*"],"allowedBackendHosts":["*"]}}}`,
		`{"name":"app","token":{"env":"BENCH_APP"},"scopes":["pinboard:worker"],"claims":{"pinboard":{"namespaces":["/counters"]}}}`,
	}
	for i := range n - 2 {
		env = append(env, fmt.Sprintf("BENCH_K%d=bench-filler-key-%06d-0123456789abcdef", i, i))
		keys = append(keys, fmt.Sprintf(`{"name":"k%d","token":{"env":"BENCH_K%d"},"scopes":["pinboard:worker"],"claims":{"pinboard":{"namespaces":["/counters"]}}}`, i, i))
	}
	doc := `{"providers":[{"type":"staticToken","id":"pinboard","keys":[` + strings.Join(keys, ",") +
		`]}],"namespaces":{"/counters":{"allow":"authenticated"},"*":{"allow":"anonymous"}}}`
	return append(env, "PINBOARD_PASSPORT="+doc)
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
