package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testutil"
)

// node is one fleet member with fixed addresses, so it can be restarted
// with the same command line as systemd would.
type node struct {
	id, http, raft, dir string
	// wd, if set, is the agent's working directory (dir is then relative
	// to it, as an operator types it).
	wd   string
	args []string
	a    *testutil.Agent
}

var fleetEnv = []string{"PINBOARD_TOKEN=" + testutil.Token}

func newNode(t *testing.T, id string, extra ...string) *node {
	n := &node{id: id, http: testutil.FreeAddr(t), raft: testutil.FreeAddr(t), dir: filepath.Join(t.TempDir(), id)}
	if !slices.Contains(extra, "--database-url") {
		extra = append(extra, "--local-state")
	}
	n.args = append([]string{
		"--node-id", id, "--http-addr", n.http, "--raft-addr", n.raft, "--data-dir", n.dir,
		"--plugin", "/counters=" + testutil.Bin(t, "counter"),
		"--lease-ttl", "3s", "--heartbeat-interval", "500ms", "--raft-timeout", "300ms",
	}, extra...)
	return n
}

func (n *node) url() string { return "http://" + n.http }

// start launches the node; ready waits until its worker is registered.
func (n *node) start(t *testing.T, ready bool) *node {
	t.Helper()
	if ready {
		n.a = testutil.StartAgentAt(t, n.wd, fleetEnv, n.args...)
	} else {
		n.a = testutil.LaunchAgentAt(t, n.wd, fleetEnv, n.args...)
	}
	return n
}

type member struct {
	ID      string `json:"id"`
	Voter   bool   `json:"voter"`
	Leader  bool   `json:"leader"`
	APIAddr string `json:"api_addr"`
}

func members(t *testing.T, via *node) []member {
	t.Helper()
	out, err := testutil.CLI(t, "members", "--json", "--addr", via.url())
	if err != nil {
		t.Fatalf("pinnedd members: %v\n%s", err, out)
	}
	var ms []member
	if err := json.Unmarshal([]byte(out), &ms); err != nil {
		t.Fatalf("members output %q: %v", out, err)
	}
	return ms
}

func memberSummary(ms []member) string {
	var parts []string
	for _, m := range ms {
		s := m.ID
		if !m.Voter {
			s += "(nonvoter)"
		}
		if m.Leader {
			s += "*"
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, " ")
}

type workerView struct {
	ClientID     string   `json:"clientId"`
	NodeID       string   `json:"nodeId"`
	AdvertiseURL string   `json:"advertiseUrl"`
	SessionID    string   `json:"sessionId"`
	Namespaces   []string `json:"namespaces"`
	Live         bool     `json:"live"`
}

func liveWorkers(t *testing.T, via *node) map[string]workerView {
	t.Helper()
	r, err := via.a.Do("GET", "/registry/workers", "")
	if err != nil || r.Code != 200 {
		return nil
	}
	var out struct{ Workers []workerView }
	r.JSON(t, &out)
	m := map[string]workerView{}
	for _, w := range out.Workers {
		if w.Live {
			m[w.NodeID] = w
		}
	}
	return m
}

func health(t *testing.T, n *node) map[string]any {
	t.Helper()
	r, err := n.a.Do("GET", "/registry/health", "")
	if err != nil {
		return nil
	}
	var h map[string]any
	_ = r.JSONErr(&h)
	return h
}

// The walkthrough: bootstrap, join at start, join at runtime
// through a follower, kill -9 the leader, restart it, leave, and a fourth
// node beyond the voter count.
func TestFleetMembership(t *testing.T) {
	t.Parallel()
	n1 := newNode(t, "n1", "--bootstrap").start(t, true)
	n2 := newNode(t, "n2", "--join", n1.url()).start(t, true)
	n3 := newNode(t, "n3").start(t, false)
	if r := n3.a.MustDo("GET", "/readyz", ""); r.Code != 503 {
		t.Fatalf("unjoined node ready: %d %s", r.Code, r.Body)
	}
	// It says what it waits for, instead of failing lease renewals.
	if _, err := n3.a.WaitLog(10*time.Second, "waits to be joined", "pinnedd join --addr "+n3.url()); err != nil {
		t.Fatalf("an unjoined node does not say it waits to be joined: %v\n%s", err, n3.a.Logs())
	}
	// Runtime join through a follower (n2 forwards to the leader).
	if out, err := testutil.CLI(t, "join", "--addr", n3.url(), n2.url()); err != nil {
		t.Fatalf("pinnedd join: %v\n%s", err, out)
	}
	if err := n3.a.WaitReady(20 * time.Second); err != nil {
		t.Fatalf("n3 not ready after join: %v", err)
	}
	testutil.WaitFor(t, 10*time.Second, "3 voters", func() bool { return memberSummary(members(t, n3)) == "n1* n2 n3" })
	testutil.WaitFor(t, 10*time.Second, "3 workers", func() bool { return len(liveWorkers(t, n1)) == 3 })
	for id, w := range liveWorkers(t, n2) {
		if w.ClientID == "" || w.SessionID == "" || !strings.HasPrefix(w.AdvertiseURL, "http://127.0.0.1:") || strings.Join(w.Namespaces, ",") != "/counters" {
			t.Fatalf("worker %s: %+v", id, w)
		}
	}
	oldClient := liveWorkers(t, n1)["n1"].ClientID

	// kill -9 the leader: a new leader among the survivors, directory intact.
	n1.a.Signal(syscall.SIGKILL)
	if _, err := n1.a.Wait(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 15*time.Second, "new leader", func() bool {
		h := health(t, n2)
		return h != nil && (h["leader"] == "n2" || h["leader"] == "n3")
	})
	testutil.WaitFor(t, 5*time.Second, "survivors keep the directory", func() bool {
		w := liveWorkers(t, n3)
		return w["n2"].ClientID != "" && w["n3"].ClientID != ""
	})

	// Restart n1 with its same command line (--bootstrap included).
	n1.start(t, true)
	testutil.WaitFor(t, 20*time.Second, "n1 back as a member", func() bool {
		return strings.Contains(memberSummary(members(t, n2)), "n1")
	})
	testutil.WaitFor(t, 20*time.Second, "n1 catches up", func() bool {
		h1, h2 := health(t, n1), health(t, n2)
		return h1 != nil && h2 != nil && h1["leader"] == h2["leader"] && h1["leader"] != "" &&
			h1["appliedIndex"].(float64) >= h2["appliedIndex"].(float64)-3
	})
	testutil.WaitFor(t, 10*time.Second, "n1's new worker registered", func() bool {
		w := liveWorkers(t, n2)["n1"]
		return w.ClientID != "" && w.ClientID != oldClient
	})

	// A node that is not a member cannot be removed: an error, not "removed".
	if out, err := testutil.CLI(t, "remove", "--addr", n2.url(), "nosuchnode"); err == nil || !strings.Contains(out, "no member named") {
		t.Fatalf("pinnedd remove nosuchnode: err=%v\n%s", err, out)
	}

	// leave: n3 drains, deregisters, leaves Raft and exits 0; two members
	// and two workers stay.
	if out, err := testutil.CLI(t, "leave", "--addr", n3.url(), "--deadline", "1s"); err != nil {
		t.Fatalf("pinnedd leave: %v\n%s", err, out)
	}
	if code, err := n3.a.Wait(30 * time.Second); err != nil || code != 0 {
		t.Fatalf("a node that left exits 0: code %d, %v\n%s", code, err, n3.a.Logs())
	}
	testutil.WaitFor(t, 10*time.Second, "2 members after leave", func() bool {
		s := memberSummary(members(t, n2))
		return len(strings.Fields(s)) == 2 && !strings.Contains(s, "n3")
	})
	if w := liveWorkers(t, n2); len(w) != 2 || w["n3"].ClientID != "" {
		t.Fatalf("the node that left is still a live worker: %+v", w)
	}

	// With 3 voters as the cap, a fourth and fifth: n4 votes (only two
	// voters left), n5 does not.
	n4 := newNode(t, "n4", "--join", n2.url()).start(t, true)
	n5 := newNode(t, "n5", "--join", n4.url()).start(t, true)
	testutil.WaitFor(t, 10*time.Second, "n5 as nonvoter", func() bool {
		s := memberSummary(members(t, n5))
		return strings.Contains(s, "n4") && !strings.Contains(s, "n4(") && strings.Contains(s, "n5(nonvoter)")
	})
}

// A node restarted on its data dir after `pinnedd leave` is no member: it
// says so and names the `pinnedd join` to run, and running that command
// makes it a member (and a worker) again.
func TestRestartAfterLeaveNamesTheJoin(t *testing.T) {
	t.Parallel()
	n1 := newNode(t, "n1", "--bootstrap").start(t, true)
	n2 := newNode(t, "n2", "--join", n1.url()).start(t, true)
	n3 := newNode(t, "n3", "--join", n1.url()).start(t, true)
	testutil.WaitFleet(t, 10*time.Second, n1.a, n2.a, n3.a)
	before := liveWorkers(t, n2)["n1"].ClientID
	if out, err := testutil.CLI(t, "leave", "--addr", n1.url(), "--deadline", "1s"); err != nil {
		t.Fatalf("pinnedd leave: %v\n%s", err, out)
	}
	if code, err := n1.a.Wait(30 * time.Second); err != nil || code != 0 {
		t.Fatalf("a node that left exits 0: code %d, %v", code, err)
	}
	// Restarted with its same command line (--bootstrap, an existing data dir).
	n1.start(t, false)
	line, err := n1.a.WaitLog(20*time.Second, "this node left the cluster", "pinnedd join --addr "+n1.url()+" ")
	if err != nil {
		t.Fatalf("no hint that the restarted node left and how to join: %v\n%s", err, n1.a.Logs())
	}
	m := regexp.MustCompile("run `pinnedd (join --addr [^ `]+ [^ `]+)`").FindStringSubmatch(line)
	if m == nil || !strings.HasSuffix(m[1], " "+n2.url()) && !strings.HasSuffix(m[1], " "+n3.url()) {
		t.Fatalf("the hint names no member to join through: %s", line)
	}
	if out, err := testutil.CLI(t, strings.Fields(m[1])...); err != nil {
		t.Fatalf("pinnedd %s: %v\n%s", m[1], err, out)
	}
	if err := n1.a.WaitReady(30 * time.Second); err != nil {
		t.Fatalf("not ready after joining again: %v\n%s", err, n1.a.Logs())
	}
	testutil.WaitFor(t, 10*time.Second, "n1 a member and a live worker again", func() bool {
		w := liveWorkers(t, n2)["n1"]
		return strings.Contains(memberSummary(members(t, n2)), "n1") && w.ClientID != "" && w.ClientID != before
	})
}

// A worker that cannot renew its lease refuses by itself: unhealthy (new
// activations 503 + in-band refusal marker) and then expired (every request
// 503 lease expired, not ready), with no message from anyone.
func TestLeaseLossRefusesByItself(t *testing.T) {
	t.Parallel()
	n1 := newNode(t, "n1", "--bootstrap").start(t, true)
	n2 := newNode(t, "n2", "--join", n1.url()).start(t, true)
	n3 := newNode(t, "n3", "--join", n1.url()).start(t, true)
	testutil.WaitFor(t, 10*time.Second, "3 workers", func() bool { return len(liveWorkers(t, n1)) == 3 })

	// Cold-start quarantine: the fresh directory refuses placements for one
	// TTL from the first attempt.
	r := n3.a.MustDo("POST", "/counters/q/increment", "")
	if r.Code != 503 || !strings.Contains(r.Body, "quarantine") || r.Header.Get("Retry-After") == "" {
		t.Fatalf("first placement: %d %s", r.Code, r.Body)
	}
	// n3's replica applies the stamping entry a moment after the leader.
	testutil.WaitFor(t, 5*time.Second, "quarantineMs on /registry/health", func() bool {
		q, _ := health(t, n3)["quarantineMs"].(float64)
		return q > 0 && q <= 3000
	})
	testutil.WaitFor(t, 10*time.Second, "placement after quarantine", func() bool {
		r := n3.a.MustDo("POST", "/counters/q/increment", "")
		return r.Code == 200 && strings.TrimSpace(r.Body) == `{"value":1}`
	})

	// Take quorum away from q's owner: kill the other two.
	nodes := []*node{n1, n2, n3}
	owner := ownerOf(t, nodes, "/counters", "q")
	if owner == nil {
		t.Fatal("no owner for q")
	}
	for _, n := range nodes {
		if n == owner {
			continue
		}
		n.a.Signal(syscall.SIGKILL)
		if _, err := n.a.Wait(10 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	n3 = owner
	// Unhealthy: the live instance still serves, a new one is refused in-band.
	testutil.WaitFor(t, 20*time.Second, "lease unhealthy", func() bool { return getStatus(t, n3.a).Worker.Lease == "unhealthy" })
	if r := n3.a.MustDo("GET", "/readyz", ""); r.Code != 200 {
		t.Fatalf("unhealthy but unexpired must stay ready: %d", r.Code)
	}
	if r := n3.a.MustDo("POST", "/counters/q/increment", ""); r.Code != 200 {
		t.Fatalf("live instance refused while merely unhealthy: %d %s", r.Code, r.Body)
	}
	// A new id is not activated here (n3 will not place on itself, and
	// the directory it would ask has no leader): 503 + Retry-After.
	if r := n3.a.MustDo("POST", "/counters/fresh/increment", ""); r.Code != 503 || r.Header.Get("Retry-After") == "" {
		t.Fatalf("new activation while unhealthy: %d %v %s", r.Code, r.Header, r.Body)
	}
	if got := getStatus(t, n3.a).Instances; len(got) != 1 || got[0].ID != "q" {
		t.Fatalf("instances while unhealthy = %+v, want only q", got)
	}
	// Expired: everything refused, not ready.
	testutil.WaitFor(t, 20*time.Second, "lease expired", func() bool {
		r := n3.a.MustDo("POST", "/counters/q/increment", "")
		return r.Code == 503 && strings.Contains(r.Body, "lease expired")
	})
	if r := n3.a.MustDo("GET", "/readyz", ""); r.Code != 503 {
		t.Fatalf("expired lease must not be ready: %d", r.Code)
	}
	if got := n3.a.Metric("pinned_lease_healthy"); got != 0 {
		t.Fatalf("pinned_lease_healthy = %v", got)
	}
}

// Registry input that is malformed, unauthenticated or unverifiable gets a
// clear 4xx and changes nothing.
func TestRegistryBadInput(t *testing.T) {
	t.Parallel()
	// Heartbeats every 2 s (the lease is 3 s).
	n1 := newNode(t, "n1", "--bootstrap", "--heartbeat-interval", "2s").start(t, true)
	applied := func() float64 { v, _ := health(t, n1)["appliedIndex"].(float64); return v }
	// What bad input could change in the directory: its workers (lapsed
	// ones too) by identity, and its placements. Heartbeats, which may land
	// at any time, move none of it.
	directory := func() string {
		r := n1.a.MustDo("GET", "/registry/workers?all=1", "")
		var out struct {
			Workers []struct {
				ClientID     string   `json:"clientId"`
				SessionID    string   `json:"sessionId"`
				AdvertiseURL string   `json:"advertiseUrl"`
				Namespaces   []string `json:"namespaces"`
				RegisteredAt int64    `json:"registeredAt"`
			} `json:"workers"`
		}
		r.JSON(t, &out)
		return fmt.Sprintf("%+v placements %v", out.Workers, health(t, n1)["placements"])
	}
	// Ready is before the node's own worker registers (a write of its own).
	testutil.WaitFor(t, 10*time.Second, "the node's own worker registered", func() bool { return len(liveWorkers(t, n1)) == 1 })
	workersBefore := len(liveWorkers(t, n1))

	// A fake worker whose challenge endpoint echoes whatever it is told to:
	// it proves nothing about exclusivity, but passes the probe.
	values := map[string]string{}
	fake := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, values[r.URL.Query().Get("challenge")])
	}))
	defer fake.Close()

	post := func(path, token, body string) testutil.Response {
		h := map[string]string{}
		if token != "" {
			h["Authorization"] = "Bearer " + token
		}
		r, err := testutil.Do(t.Context(), "POST", n1.url()+path, body, h)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	valid := func(client string) string {
		values["c-"+client] = "v-" + client
		return fmt.Sprintf(`{"clientId":%q,"advertiseUrl":%q,"namespaces":["/counters"],"headroom":5,"challenge":"c-%s","challengeValue":"v-%s"}`,
			client, fake.URL, client, client)
	}
	before, dirBefore, start := applied(), directory(), time.Now()
	for _, c := range []struct {
		path, token, body string
		code              int
	}{
		{"/registry/register", "", valid("a"), 401},
		{"/registry/register", "nope", valid("a"), 401},
		{"/registry/register", testutil.Token, `{`, 400},
		{"/registry/register", testutil.Token, `[]`, 400},
		{"/registry/register", testutil.Token, `{"clientId":"a"} {}`, 400},
		{"/registry/register", testutil.Token, `{"clientId":5}`, 400},
		{"/registry/register", testutil.Token, `{"clientId":"a","advertiseUrl":"ftp://x","namespaces":["/counters"],"challenge":"c","challengeValue":"v"}`, 400},
		{"/registry/register", testutil.Token, `{"clientId":"a","advertiseUrl":"http://x","namespaces":["/Bad"],"challenge":"c","challengeValue":"v"}`, 400},
		{"/registry/register", testutil.Token, `{"clientId":"a","advertiseUrl":"http://x","namespaces":["/counters"]}`, 400},
		{"/registry/register", testutil.Token, `{"clientId":"a","advertiseUrl":"` + fake.URL + `","namespaces":["/counters"],"headroom":-1,"challenge":"c","challengeValue":"v"}`, 400},
		// The advertise URL does not know this challenge: 403.
		{"/registry/register", testutil.Token, `{"clientId":"a","advertiseUrl":"` + fake.URL + `","namespaces":["/counters"],"challenge":"c-x","challengeValue":"v-x"}`, 403},
		// Another node's URL cannot answer our challenge either.
		{"/registry/register", testutil.Token, `{"clientId":"a","advertiseUrl":"` + n1.url() + `","namespaces":["/counters"],"challenge":"c","challengeValue":"v"}`, 403},
		{"/registry/heartbeat", testutil.Token, `{"clientId":"a"}`, 400},
		{"/registry/heartbeat", testutil.Token, `nonsense`, 400},
	} {
		if r := post(c.path, c.token, c.body); r.Code != c.code {
			t.Errorf("POST %s %s: %d %s, want %d", c.path, c.body, r.Code, r.Body, c.code)
		}
	}
	if after := directory(); after != dirBefore {
		t.Fatalf("bad input changed the directory:\n%s\n->\n%s", dirBefore, after)
	}
	// Nor did it write to the log: the entries applied meanwhile are the
	// node's own heartbeats, at most one per interval begun (each bad
	// request writing one would be 14).
	if after, most := applied(), before+math.Ceil(time.Since(start).Seconds()/2)+1; after > most {
		t.Fatalf("bad input wrote to the directory's log: applied index %v -> %v, heartbeats explain at most %v", before, after, most)
	}

	// Go's profiles are an operator's: no token or an unknown one 401.
	for token, want := range map[string]int{"": 401, "nope": 401, testutil.Token: 200} {
		h := map[string]string{}
		if token != "" {
			h["Authorization"] = "Bearer " + token
		}
		for _, path := range []string{"/_pinned/debug/pprof/", "/_pinned/debug/pprof/heap?debug=1"} {
			if r, err := testutil.Do(t.Context(), "GET", n1.url()+path, "", h); err != nil || r.Code != want {
				t.Errorf("GET %s with token %q: %v %d, want %d", path, token, err, r.Code, want)
			}
		}
	}
	if got := len(liveWorkers(t, n1)); got != workersBefore {
		t.Fatalf("bad input added workers: %d -> %d", workersBefore, got)
	}

	// A valid registration, then a second process claiming the same URL.
	if r := post("/registry/register", testutil.Token, valid("a")); r.Code != 200 || !strings.Contains(r.Body, `"expiresInMs":3000`) {
		t.Fatalf("register: %d %s", r.Code, r.Body)
	}
	if r := post("/registry/register", testutil.Token, valid("b")); r.Code != 409 {
		t.Fatalf("second worker on one advertise URL: %d %s, want 409", r.Code, r.Body)
	}
	// An unknown session is told to re-register.
	r := post("/registry/heartbeat", testutil.Token, `{"clientId":"a","sessionId":"stale","headroom":1,"challenge":"c-a","challengeValue":"v-a"}`)
	if r.Code != 409 || !strings.Contains(r.Body, `"reregister":true`) {
		t.Fatalf("stale heartbeat: %d %s", r.Code, r.Body)
	}
}

// With --local-state an id's state is on its node: an idle eviction keeps
// the placement, so the next request, through any node, re-activates it
// where its state is instead of starting it empty elsewhere.
func TestLocalStateKeepsIdleIDsOnTheirNode(t *testing.T) {
	t.Parallel()
	n1 := newNode(t, "n1", "--bootstrap", "--detached-timeout", "300ms").start(t, true)
	n2 := newNode(t, "n2", "--join", n1.url(), "--detached-timeout", "300ms").start(t, true)
	testutil.WaitFor(t, 20*time.Second, "2 workers", func() bool { return len(liveWorkers(t, n1)) == 2 })
	nodes := map[string]*node{"n1": n1, "n2": n2}
	inc := func(via *node) string {
		t.Helper()
		var r testutil.Response
		testutil.WaitFor(t, 20*time.Second, "an increment", func() bool { // the fresh directory's quarantine first
			r, _ = via.a.Do("POST", "/counters/kept/increment", "")
			return r.Code == 200
		})
		return strings.TrimSpace(r.Body)
	}
	for i := 1; i <= 3; i++ {
		if got := inc(n1); got != fmt.Sprintf(`{"value":%d}`, i) {
			t.Fatalf("increment %d: %s", i, got)
		}
	}
	var owner, other *node
	testutil.WaitFor(t, 5*time.Second, "the owner", func() bool {
		for id, n := range nodes {
			if n.a.Metric(`pinned_instances{namespace="/counters"}`) == 1 {
				owner = n
				other = nodes[map[string]string{"n1": "n2", "n2": "n1"}[id]]
				return true
			}
		}
		return false
	})
	gen := func() uint64 {
		st := getStatus(t, owner.a)
		if len(st.Instances) != 1 {
			t.Fatalf("%s serves %d instances, want 1", owner.id, len(st.Instances))
		}
		return st.Instances[0].Generation
	}
	placedAt := gen()
	testutil.WaitFor(t, 10*time.Second, "the idle eviction", func() bool {
		return owner.a.Metric(`pinned_evictions_total{namespace="/counters",reason="idle"}`) == 1
	})
	var out struct {
		Workers []struct {
			NodeID     string `json:"nodeId"`
			Placements int    `json:"placements"`
		} `json:"workers"`
	}
	other.a.MustDo("GET", "/registry/workers", "").JSON(t, &out)
	for _, w := range out.Workers {
		if w.NodeID == owner.id && w.Placements != 1 {
			t.Fatalf("after its idle eviction %s holds %d placements, want the id kept (1)", owner.id, w.Placements)
		}
	}
	if got := inc(other); got != `{"value":4}` {
		t.Fatalf("after an idle eviction, through the other node: %s, want 4 (the state on %s)", got, owner.id)
	}
	// The same placement, not a new claim that happened to land here.
	if now := gen(); now != placedAt {
		t.Fatalf("re-activated under generation %d, want the kept placement's %d", now, placedAt)
	}
}

// A fleet node must say where instance state lives: shared (Postgres) or
// on this node with its consequence accepted.
func TestFleetNodeNeedsAStateChoice(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, testutil.Bin(t, "pinnedd"), "agent", "--bootstrap", "--http-addr", "127.0.0.1:0",
		"--raft-addr", "127.0.0.1:0", "--data-dir", t.TempDir(), "--plugin", "/counters="+testutil.Bin(t, "counter"))
	cmd.Env = append(os.Environ(), "PINBOARD_TOKEN="+testutil.Token, "DATABASE_URL=")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "--database-url") || !strings.Contains(string(out), "--local-state") {
		t.Fatalf("a fleet node with neither --database-url nor --local-state: %v\n%s", err, out)
	}
}
