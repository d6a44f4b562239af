package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testutil"
)

// Keys of the rotation test: the nodes' own key and a client key, each
// rolled from A to B. The operator key is the one testutil's helpers send.
const (
	nodeA = "node-key-a-0123456789abcdef0123456789"
	nodeB = "node-key-b-0123456789abcdef0123456789"
	appA  = "app-key-a-0123456789abcdef01234567890"
	appB  = "app-key-b-0123456789abcdef01234567890"
)

// rotationPassport lists the node key's and the client key's values from
// the given environment variables.
func rotationPassport(nodeEnvs, appEnvs []string) string {
	refs := func(envs []string) string {
		var r []string
		for _, e := range envs {
			r = append(r, fmt.Sprintf(`{"env":%q}`, e))
		}
		return "[" + strings.Join(r, ",") + "]"
	}
	return `{"providers":[{"type":"staticToken","id":"pinboard","keys":[
  {"name":"node","token":` + refs(nodeEnvs) + `,"scopes":["pinboard:worker"],
   "claims":{"pinboard":{"namespaces":["*"],"allowedBackendHosts":["*"]}}},
  {"name":"ops","token":{"env":"OPS_KEY"},"scopes":["pinboard:operator"],
   "claims":{"pinboard":{"namespaces":["*"],"hostnames":["*"],"envs":["*"],"allowedBackendHosts":["*"]}}},
  {"name":"app","token":` + refs(appEnvs) + `,"scopes":["pinboard:worker"],
   "claims":{"pinboard":{"namespaces":["/counters"]}}}]}],
 "namespaces":{"/counters":{"allow":"authenticated"},"*":{"allow":"anonymous"}}}`
}

// A three-node fleet rolls both its node key and a client key from A to B
// as the README says (list both, roll; switch to B, roll; drop A, roll)
// under client load, and no request fails: a client, like a load
// balancer, retries a node that is restarting (a refused connection, a
// 503) on the next, but a 401 or 403 is a failure. Between the second
// roll and the third the leader seals the keys at rest again under B, and
// every node reports none left under A; afterwards A is refused.
func TestRotationUnderLoad(t *testing.T) {
	t.Parallel()
	base := []string{"NODE_A=" + nodeA, "NODE_B=" + nodeB, "APP_A=" + appA, "APP_B=" + appB, "OPS_KEY=" + testutil.Token}
	envFor := func(token string, nodeEnvs, appEnvs []string) []string {
		return append(append([]string{}, base...), "PINBOARD_TOKEN="+token, "PINBOARD_PASSPORT="+rotationPassport(nodeEnvs, appEnvs))
	}
	env := envFor(nodeA, []string{"NODE_A"}, []string{"APP_A"})
	n1 := newNode(t, "n1", "--bootstrap")
	n1.a = testutil.StartAgentAt(t, n1.wd, env, n1.args...)
	n2 := newNode(t, "n2", "--join", n1.url())
	n2.a = testutil.StartAgentAt(t, n2.wd, env, n2.args...)
	n3 := newNode(t, "n3", "--join", n1.url())
	n3.a = testutil.StartAgentAt(t, n3.wd, env, n3.args...)
	nodes := []*node{n1, n2, n3}
	testutil.WaitFleet(t, 20*time.Second, n1.a, n2.a, n3.a)

	var key atomic.Pointer[string]
	first := appA
	key.Store(&first)
	var ok atomic.Int64
	var mu sync.Mutex
	var failures []string
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { stop(); wg.Wait() }) // a failed roll ends the load too
	for c := range 4 {
		wg.Go(func() {
			tr := &http.Transport{}
			defer tr.CloseIdleConnections()
			client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
			for i := 0; ctx.Err() == nil; i++ {
				if err := balanced(ctx, client, nodes, fmt.Sprintf("/counters/rot-%d-%d/increment", c, i%5), *key.Load()); err != nil {
					if ctx.Err() != nil {
						return
					}
					mu.Lock()
					failures = append(failures, fmt.Sprintf("%s client %d request %d: %v", time.Now().Format("15:04:05.000"), c, i, err))
					mu.Unlock()
				} else {
					ok.Add(1)
				}
			}
		})
	}
	roll := func(token string, nodeEnvs, appEnvs []string) {
		t.Helper()
		for _, n := range nodes {
			before := ok.Load()
			n.a.Signal(syscall.SIGTERM)
			if code, err := n.a.Wait(30 * time.Second); err != nil || code != 0 {
				t.Fatalf("%s: exit %d, %v", n.id, code, err)
			}
			n.a = testutil.StartAgentAt(t, n.wd, envFor(token, nodeEnvs, appEnvs), n.args...)
			testutil.WaitFleet(t, 30*time.Second, n1.a, n2.a, n3.a)
			testutil.WaitFor(t, 20*time.Second, "requests served after "+n.id+" came back", func() bool { return ok.Load() > before+20 })
		}
	}
	roll(nodeA, []string{"NODE_A", "NODE_B"}, []string{"APP_A", "APP_B"})
	second := appB
	key.Store(&second)
	roll(nodeB, []string{"NODE_A", "NODE_B"}, []string{"APP_A", "APP_B"})
	for _, n := range nodes {
		if !strings.Contains(n.a.Logs(), "sealed a key again under this node's token") {
			t.Errorf("%s, started with B first, did not seal its key files again", n.id)
		}
	}
	testutil.WaitFor(t, 20*time.Second, "no key at rest left under the old node key", func() bool {
		for _, n := range nodes {
			var st struct {
				KeysToSeal *[]string `json:"keysToSeal"`
			}
			r, err := n.a.Do("GET", "/_pinned/status", "")
			if err != nil || r.Code != 200 || r.JSONErr(&st) != nil || st.KeysToSeal == nil || len(*st.KeysToSeal) != 0 {
				return false
			}
		}
		return true
	})
	roll(nodeB, []string{"NODE_B"}, []string{"APP_B"})
	stop()
	wg.Wait()
	if len(failures) > 0 {
		t.Fatalf("%d requests failed (of %d served):\n%s", len(failures), ok.Load(), strings.Join(failures, "\n"))
	}
	t.Logf("%d requests served across three rolls", ok.Load())

	// A is refused now: the client key on its namespace, the node key on
	// a worker route (B gets past the key to the body check).
	for _, c := range []struct {
		method, path, key string
		want              int
	}{
		{"POST", "/counters/after/increment", appA, 401},
		{"POST", "/counters/after/increment", appB, 200},
		{"POST", "/registry/heartbeat", nodeA, 401},
		{"POST", "/registry/heartbeat", nodeB, 400},
	} {
		r, err := testutil.Do(context.Background(), c.method, n2.url()+c.path, "{}", map[string]string{"Authorization": "Bearer " + c.key})
		if err != nil || r.Code != c.want {
			t.Errorf("%s %s with %.10s...: %v %d %s, want %d", c.method, c.path, c.key, err, r.Code, r.Body, c.want)
		}
	}
}

// balanced sends one request as a load balancer in front of nodes would:
// to the first node, then the next while one refuses the connection or
// answers 503, until one answers or 30 s pass. Any other answer than 200
// is an error.
func balanced(ctx context.Context, client *http.Client, nodes []*node, path, key string) error {
	deadline := time.Now().Add(30 * time.Second)
	var last string
	for i := 0; time.Now().Before(deadline); i++ {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		n := nodes[i%len(nodes)]
		req, _ := http.NewRequestWithContext(ctx, "POST", n.url()+path, nil)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := client.Do(req)
		if err != nil {
			last = err.Error()
			time.Sleep(20 * time.Millisecond)
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusOK:
			return nil
		case http.StatusServiceUnavailable:
			last = fmt.Sprintf("%s: 503 %s", n.id, body)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		return fmt.Errorf("%s: %d %s", n.id, resp.StatusCode, body)
	}
	return fmt.Errorf("no node answered within 30 s; last: %s", last)
}
