package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pinnedd/pinnedd/internal/testutil"
	"github.com/pinnedd/pinnedd/statestore/pgstore/pgtest"
)

// netnsFleet starts n1 (bootstrap), n2 and n3 (joining n1), each in its own
// namespace of nw with its front door at <ip>:8080 and its cluster port at
// <ip>:8300, the counter host, a 3 s lease and extra arguments, and waits
// until each sees the three workers.
func netnsFleet(t *testing.T, nw *testutil.Net, extra ...string) []*node {
	t.Helper()
	counter := testutil.Bin(t, "counter")
	nodes := make([]*node, 3)
	for i := range nodes {
		ip := nw.IP(i + 1)
		n := &node{id: fmt.Sprintf("n%d", i+1), http: ip + ":8080", raft: ip + ":8300"}
		n.dir = filepath.Join(t.TempDir(), n.id)
		n.args = append([]string{
			"--node-id", n.id, "--http-addr", n.http, "--raft-addr", n.raft, "--data-dir", n.dir,
			"--plugin", "/counters=" + counter,
			"--lease-ttl", "3s", "--heartbeat-interval", "500ms", "--raft-timeout", "300ms",
		}, extra...)
		if i == 0 {
			n.args = append(n.args, "--bootstrap")
		} else {
			n.args = append(n.args, "--join", nodes[0].url())
		}
		n.a = testutil.StartAgentIn(t, nw.NS(i+1), fleetEnv, n.args...)
		nodes[i] = n
	}
	for _, n := range nodes {
		testutil.WaitFor(t, 15*time.Second, n.id+" sees 3 workers", func() bool { return len(liveWorkers(t, n)) == 3 })
	}
	return nodes
}

// The issue: "at no moment do two nodes serve the same id". Three nodes,
// each in its own network namespace on a private bridge, share Postgres
// (through a forwarder on the bridge: Postgres listens on the root
// namespace's loopback). Load increments and reads /counters/p1 through
// every node and records every answer. The owner of p1 is then cut off
// from the other nodes and from Postgres, while the test still reaches
// it: the isolated owner must stop serving p1 once its lease lapses, the
// survivors must re-place p1 and continue from Postgres, and no two nodes
// may ever serve p1 together. Healed, the old owner rejoins and forwards p1
// to its new owner.
func TestPartitionedOwnerNeverServesAlongsideItsSuccessor(t *testing.T) {
	t.Parallel()
	nw := testutil.NewNet(t, 3)
	nodeDSN := forwardedDSN(t, pgtest.NewDatabase(t), nw.AuxIP)

	// The test poses as client IPs (placeOnLeader).
	nodes := netnsFleet(t, nw, "--database-url", nodeDSN, "--trusted-proxies", nw.HostIP+"/32")
	testutil.WaitFor(t, 15*time.Second, "quarantine over", func() bool {
		r, err := nodes[0].a.Do("GET", "/counters/warmup/value", "")
		return err == nil && r.Code == 200
	})

	leader := placeOnLeader(t, nodes, "p1")

	h := newPartitionHistory(nw.HostIP, nodes)
	h.start()
	defer h.stop() // on a failure below; idempotent
	testutil.WaitFor(t, 15*time.Second, "p1 served through every node", func() bool {
		for i := range nodes {
			if h.count(func(s serve) bool { return s.via == i && s.op == "inc" && s.code == 200 }) < 2 {
				return false
			}
		}
		return true
	})
	var oi int
	var g1 uint64
	testutil.WaitFor(t, 5*time.Second, "a node's status lists p1", func() bool {
		oi, g1 = h.holder(-1)
		return oi >= 0
	})
	old := nodes[oi]
	session := liveWorkers(t, nodes[(oi+1)%3])[old.id].SessionID
	if session == "" {
		t.Fatalf("no live session for %s", old.id)
	}
	if old.id != leader {
		t.Logf("p1 was placed on the leader %s, but %s holds it now", leader, old.id)
	}
	t.Logf("p1 is on %s (generation %d); raft leader %s; partitioning %s", old.id, g1, leader, old.id)

	// The partition: old <-> other nodes and old -> Postgres forwarder
	// drop every packet silently; the test still talks to old.
	cutFrom := time.Now()
	nw.Cut(oi + 1)
	cutAt := time.Now()
	h.mark("cut", cutAt)

	testutil.WaitFor(t, 15*time.Second, old.id+" refuses p1: lease expired", func() bool {
		return h.count(func(s serve) bool {
			return s.via == oi && !s.send.Before(cutAt) && s.code == 503 && strings.Contains(s.body, "lease expired")
		}) > 0
	})
	isSurvivorAck := func(s serve) bool {
		return s.via != oi && s.op == "inc" && s.code == 200 && !s.send.Before(cutAt)
	}
	if err := testutil.Eventually(40*time.Second, func() bool { return h.count(isSurvivorAck) >= 20 }); err != nil {
		// Say what the survivors answered instead, to tell a slow machine
		// from a placement that never moved.
		t.Fatalf("survivors do not serve p1 again within 40s; their answers since the cut: %s", h.summary(func(s serve) bool {
			return s.via != oi && !s.send.Before(cutAt)
		}))
	}
	var ni int
	var g2 uint64
	testutil.WaitFor(t, 5*time.Second, "a survivor's status lists p1", func() bool {
		ni, g2 = h.holder(oi)
		return ni >= 0
	})
	if g2 <= g1 {
		t.Fatalf("p1 re-placed on %s with generation %d, not above the old owner's %d", nodes[ni].id, g2, g1)
	}
	if st, ok := h.lastStatus(oi); !ok || st.Worker.Lease != "expired" {
		t.Fatalf("isolated %s's lease = %q (status ok %v), want expired", old.id, st.Worker.Lease, ok)
	}

	// Heal: the old owner re-registers, quits p1 and forwards it.
	healFrom := time.Now()
	nw.Heal(oi + 1)
	healAt := time.Now()
	h.mark("heal", healAt)
	var rejoined workerView
	testutil.WaitFor(t, 20*time.Second, old.id+" live again in the directory", func() bool {
		var ok bool
		rejoined, ok = liveWorkers(t, nodes[ni])[old.id]
		return ok
	})
	// Its lease lapsed and p1 moved: the directory must make it register
	// again (a new session, told which ids it lost), not renew the old one.
	if rejoined.SessionID == session {
		t.Errorf("%s is live again under its pre-partition session %s: the directory renewed a lapsed lease instead of making it re-register", old.id, session)
	}
	testutil.WaitFor(t, 20*time.Second, old.id+" healthy without p1", func() bool {
		st, ok := h.lastStatus(oi)
		return ok && st.Worker.Lease == "healthy" && st.Gen("/counters", "p1") == 0
	})
	testutil.WaitFor(t, 20*time.Second, "p1 served through the healed node", func() bool {
		return h.count(func(s serve) bool {
			return s.via == oi && s.code == 200 && s.send.After(healAt)
		}) >= 6
	})
	h.stop()

	if got, _ := h.holder(-1); got != ni {
		t.Errorf("after the heal p1 is on node index %d, want %s", got, nodes[ni].id)
	}
	final := int64(-1)
	for _, n := range nodes {
		r, err := n.a.Do("GET", "/counters/p1/value", "")
		if err != nil || r.Code != 200 {
			t.Fatalf("final read via %s: %v %d %s", n.id, err, r.Code, r.Body)
		}
		v, err := counterValue(r.Body)
		if err != nil || (final >= 0 && v != final) {
			t.Fatalf("final read via %s = %s, others %d", n.id, r.Body, final)
		}
		final = v
	}
	h.check(t, oi, cutFrom, cutAt, healFrom, healAt, final)
	logLeaseEvents(t, old, cutAt)
}

// placeOnLeader places /counters/<id> on the Raft leader's worker and
// returns the leader's node id. Isolating an owner that also leads is the
// harder partition: the survivors must elect a leader before they can
// re-place the id, and every follower's in-flight directory write to the
// old leader goes into the silence. Placement prefers one worker per client
// IP, and the nodes trust the test's forwarding header, so the test poses as
// client IPs until one's ids land on the leader, then touches id as it.
func placeOnLeader(t *testing.T, nodes []*node, id string) string {
	t.Helper()
	leader, _ := health(t, nodes[0])["leader"].(string)
	li := slices.IndexFunc(nodes, func(n *node) bool { return n.id == leader })
	if li < 0 {
		t.Fatalf("no leader among the nodes (health says %q)", leader)
	}
	touch := func(probe, ip string) bool {
		r, err := testutil.Do(context.Background(), "GET", nodes[li].url()+"/counters/"+probe+"/value", "",
			map[string]string{"Authorization": "Bearer " + testutil.Token, "X-Forwarded-For": ip})
		if err != nil || r.Code != 200 {
			t.Fatalf("touch /counters/%s as %s: %v %d %s", probe, ip, err, r.Code, r.Body)
		}
		return ownerOf(t, nodes, "/counters", probe) == nodes[li]
	}
	for i := 1; i <= 60; i++ {
		ip := fmt.Sprintf("10.9.0.%d", i)
		if touch(fmt.Sprintf("probe%d", i), ip) {
			if !touch(id, ip) {
				t.Fatalf("/counters/%s did not follow its client IP %s to the leader %s", id, ip, leader)
			}
			return leader
		}
	}
	t.Fatalf("no client IP of 60 placed on the leader %s", leader)
	return ""
}

// logLeaseEvents logs, relative to the partition, what the old owner said
// about its lease, registration and instances after it was cut off.
func logLeaseEvents(t *testing.T, n *node, cutAt time.Time) {
	t.Helper()
	var out []string
	for _, line := range strings.Split(n.a.Logs(), "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) != nil {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, fmt.Sprint(rec["time"]))
		msg := fmt.Sprint(rec["msg"])
		if err != nil || at.Before(cutAt.Add(-time.Second)) {
			continue
		}
		switch {
		case msg == "lease restored", msg == "worker re-registered", msg == "leader changed",
			strings.HasPrefix(msg, "instance fenced"), msg == "lease renewal failed":
			delete(rec, "time")
			delete(rec, "msg")
			delete(rec, "level")
			extra, _ := json.Marshal(rec)
			out = append(out, fmt.Sprintf("  %+6dms %s %s", at.Sub(cutAt).Milliseconds(), msg, extra))
		}
	}
	t.Logf("%s's lease and instance events (0 = partition made):\n%s", n.id, strings.Join(out, "\n"))
}

// forwardedDSN runs a TCP forwarder on host (the root namespace's address
// on the test bridge) to the database of dsn and returns dsn pointing at it.
func forwardedDSN(t *testing.T, dsn, host string) string {
	t.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatalf("parse database URL: %v", err)
	}
	if strings.HasPrefix(cfg.Host, "/") {
		t.Fatalf("Postgres at a unix socket (%s): the namespaced nodes need it over TCP", cfg.Host)
	}
	fwd := testutil.ForwardTCP(t, net.JoinHostPort(host, "0"), net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
	fh, fp, _ := net.SplitHostPort(fwd)
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			t.Fatalf("parse database URL: %v", err)
		}
		u.Host = fwd
		return u.String()
	}
	return dsn + " host=" + fh + " port=" + fp // later keywords win
}

// serve is one request of the load and its answer.
type serve struct {
	via        int    // node index the request went to
	op         string // "inc" or "get"
	send, recv time.Time
	code       int // 0: no answer (timeout, connection error)
	value      int64
	body       string
}

// statusSample is one GET /_pinned/status of a node.
type statusSample struct {
	node       int
	send, recv time.Time
	st         status
}

// partitionHistory drives the load and the status pollers and keeps what
// they saw.
type partitionHistory struct {
	nodes  []*node
	client *http.Client
	quit   chan struct{}
	once   sync.Once
	wg     sync.WaitGroup

	mu       sync.Mutex
	serves   []serve
	statuses []statusSample
	marks    map[string]time.Time
}

func newPartitionHistory(hostIP string, nodes []*node) *partitionHistory {
	// From the test's own address on the bridge, which a cut leaves
	// connected to every node. The timeout bounds requests a silent
	// partition swallows; their outcome is unknown.
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(hostIP)}, Timeout: time.Second}
	return &partitionHistory{
		nodes: nodes,
		client: &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
			DialContext: dialer.DialContext, MaxIdleConnsPerHost: 16, IdleConnTimeout: 30 * time.Second,
		}},
		quit:  make(chan struct{}),
		marks: map[string]time.Time{},
	}
}

func (h *partitionHistory) start() {
	for i := range h.nodes {
		h.loop(25*time.Millisecond, func() { h.request(i, "inc") })
		h.loop(10*time.Millisecond, func() { h.request(i, "get") })
		h.loop(50*time.Millisecond, func() { h.poll(i) })
	}
}

func (h *partitionHistory) loop(pause time.Duration, f func()) {
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		for {
			select {
			case <-h.quit:
				return
			default:
			}
			f()
			select {
			case <-h.quit:
				return
			case <-time.After(pause):
			}
		}
	}()
}

// stop ends the load and waits for every request in flight to finish.
func (h *partitionHistory) stop() {
	h.once.Do(func() { close(h.quit) })
	h.wg.Wait()
	h.client.CloseIdleConnections()
}

func (h *partitionHistory) do(i int, method, path string) (int, string, error) {
	req, err := http.NewRequest(method, h.nodes[i].url()+path, nil)
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Authorization", "Bearer "+testutil.Token)
	resp, err := h.client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, "", err
	}
	return resp.StatusCode, string(b), nil
}

func (h *partitionHistory) request(i int, op string) {
	method, path := "POST", "/counters/p1/increment"
	if op == "get" {
		method, path = "GET", "/counters/p1/value"
	}
	s := serve{via: i, op: op, send: time.Now()}
	code, body, err := h.do(i, method, path)
	s.recv = time.Now()
	if err != nil {
		s.body = err.Error()
	} else {
		s.code, s.body = code, strings.TrimSpace(body)
		if code == 200 {
			v, err := counterValue(body)
			if err != nil {
				s.code, s.body = -1, "unparsable 200: "+body
			}
			s.value = v
		}
	}
	h.mu.Lock()
	h.serves = append(h.serves, s)
	h.mu.Unlock()
}

func (h *partitionHistory) poll(i int) {
	s := statusSample{node: i, send: time.Now()}
	code, body, err := h.do(i, "GET", "/_pinned/status")
	s.recv = time.Now()
	if err != nil || code != 200 || json.Unmarshal([]byte(body), &s.st) != nil {
		return
	}
	h.mu.Lock()
	h.statuses = append(h.statuses, s)
	h.mu.Unlock()
}

func (h *partitionHistory) mark(name string, at time.Time) {
	h.mu.Lock()
	h.marks[name] = at
	h.mu.Unlock()
}

func (h *partitionHistory) count(pred func(serve) bool) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, s := range h.serves {
		if pred(s) {
			n++
		}
	}
	return n
}

// summary counts the matching serves by status and body.
func (h *partitionHistory) summary(pred func(serve) bool) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	counts := map[string]int{}
	for _, s := range h.serves {
		if pred(s) {
			b := s.body
			if len(b) > 60 {
				b = b[:60]
			}
			counts[fmt.Sprintf("%s %d %s", s.op, s.code, strings.TrimSpace(b))]++
		}
	}
	return fmt.Sprint(counts)
}

// lastStatus is node i's latest status sample.
func (h *partitionHistory) lastStatus(i int) (status, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for j := len(h.statuses) - 1; j >= 0; j-- {
		if h.statuses[j].node == i {
			return h.statuses[j].st, true
		}
	}
	return status{}, false
}

// holder is the node (other than skip) whose latest status lists p1, and
// its generation; -1 if none.
func (h *partitionHistory) holder(skip int) (int, uint64) {
	for i := range h.nodes {
		if i == skip {
			continue
		}
		if st, ok := h.lastStatus(i); ok && st.Gen("/counters", "p1") > 0 {
			return i, st.Gen("/counters", "p1")
		}
	}
	return -1, 0
}

// check judges the whole history. oi is the isolated owner; the partition
// was made between cutFrom and cutAt and healed between healFrom and healAt.
func (h *partitionHistory) check(t *testing.T, oi int, cutFrom, cutAt, healFrom, healAt time.Time, final int64) {
	t.Helper()
	h.mu.Lock()
	serves := slices.Clone(h.serves)
	statuses := slices.Clone(h.statuses)
	h.mu.Unlock()
	rel := func(at time.Time) string {
		if at.IsZero() {
			return "never"
		}
		return fmt.Sprintf("%+dms", at.Sub(cutAt).Milliseconds())
	}
	describe := func(s serve) string {
		return fmt.Sprintf("%s via %s sent %s answered %s: %d %s", s.op, h.nodes[s.via].id, rel(s.send), rel(s.recv), s.code, s.body)
	}

	// Acknowledged increments: distinct values, increasing in real time.
	var acked []serve
	unknown, refused := 0, 0
	for _, s := range serves {
		switch {
		case s.op != "inc":
		case s.code == 200:
			acked = append(acked, s)
		case s.code == 0 || !isFrontDoorRefusal(s.body):
			unknown++ // may or may not have reached the counter
		default:
			refused++
		}
	}
	seen := map[int64]serve{}
	for _, s := range acked {
		if prev, dup := seen[s.value]; dup {
			t.Errorf("value %d acknowledged twice:\n  %s\n  %s", s.value, describe(prev), describe(s))
		}
		seen[s.value] = s
	}
	// maxAckedBefore(at): the highest value acknowledged before at.
	byRecv := slices.Clone(acked)
	sort.Slice(byRecv, func(a, b int) bool { return byRecv[a].recv.Before(byRecv[b].recv) })
	prefixMax := make([]int64, len(byRecv))
	for j, s := range byRecv {
		prefixMax[j] = s.value
		if j > 0 {
			prefixMax[j] = max(prefixMax[j], prefixMax[j-1])
		}
	}
	maxAckedBefore := func(at time.Time) (int64, serve) {
		j := sort.Search(len(byRecv), func(k int) bool { return !byRecv[k].recv.Before(at) })
		if j == 0 {
			return 0, serve{}
		}
		for k := j - 1; k >= 0; k-- {
			if byRecv[k].value == prefixMax[j-1] {
				return prefixMax[j-1], byRecv[k]
			}
		}
		return prefixMax[j-1], serve{}
	}
	stale := 0
	for _, s := range serves {
		if s.code != 200 {
			continue
		}
		floor, by := maxAckedBefore(s.send)
		if s.op == "inc" && s.value <= floor || s.op == "get" && s.value < floor {
			if stale++; stale <= 5 {
				t.Errorf("%s: stale answer, %d had been acknowledged before it was sent (%s)", describe(s), floor, describe(by))
			}
		}
	}
	if stale > 5 {
		t.Errorf("... %d stale answers in all", stale)
	}
	var maxAcked int64
	for _, s := range acked {
		maxAcked = max(maxAcked, s.value)
	}
	if final < maxAcked || final < int64(len(acked)) || final > int64(len(acked)+unknown) {
		t.Errorf("final value %d: %d increments acknowledged (highest %d), %d with unknown outcome: acknowledged increments lost or applied twice",
			final, len(acked), maxAcked, unknown)
	}

	// During the partition: what old answered (nothing else can reach it)
	// against what the survivors answered (they cannot reach old).
	inPartition := func(s serve) bool { return !s.send.Before(cutAt) && s.recv.Before(healFrom) }
	var oldLast, newFirst, expiredFirst serve
	oldServes := 0
	for _, s := range serves {
		if !inPartition(s) {
			continue
		}
		switch {
		case s.via == oi && s.code == 200:
			oldServes++
			if s.recv.After(oldLast.recv) {
				oldLast = s
			}
			if s.op == "inc" {
				t.Errorf("isolated owner acknowledged an increment it cannot have stored: %s", describe(s))
			}
		case s.via == oi && s.code == 503 && strings.Contains(s.body, "lease expired"):
			if expiredFirst.recv.IsZero() || s.recv.Before(expiredFirst.recv) {
				expiredFirst = s
			}
		case s.via != oi && s.code == 200:
			if newFirst.recv.IsZero() || s.recv.Before(newFirst.recv) {
				newFirst = s
			}
		}
	}
	if expiredFirst.recv.IsZero() {
		t.Errorf("isolated owner never answered 503 lease expired")
	}
	if newFirst.recv.IsZero() {
		t.Errorf("survivors never served p1 during the partition")
	}
	for _, s := range serves {
		if inPartition(s) && s.via == oi && s.code == 200 && !expiredFirst.recv.IsZero() && s.send.After(expiredFirst.recv) {
			t.Errorf("isolated owner served p1 after refusing it for an expired lease: %s (first refusal %s)", describe(s), describe(expiredFirst))
		}
	}
	if !oldLast.recv.IsZero() && !newFirst.recv.IsZero() && !oldLast.recv.Before(newFirst.recv) {
		t.Errorf("two owners served p1 in overlapping intervals:\n  old  %s\n  new  %s", describe(oldLast), describe(newFirst))
	}

	// The status pollers: old running p1 under a lease that still lets it
	// serve (healthy or unhealthy), seen after a survivor was seen running
	// p1, is two servers at once.
	var newHeld statusSample
	for _, s := range statuses {
		if s.node != oi && s.st.Gen("/counters", "p1") > 0 && !s.send.Before(cutAt) && (newHeld.recv.IsZero() || s.recv.Before(newHeld.recv)) {
			newHeld = s
		}
	}
	var oldServable statusSample
	for _, s := range statuses {
		if s.node == oi && s.st.Gen("/counters", "p1") > 0 && (s.st.Worker.Lease == "healthy" || s.st.Worker.Lease == "unhealthy") {
			if s.send.After(oldServable.send) {
				oldServable = s
			}
			if !newHeld.recv.IsZero() && s.send.After(newHeld.recv) {
				t.Errorf("status: %s runs p1 (generation %d) with lease %s at %s, after %s ran it (generation %d) at %s",
					h.nodes[oi].id, s.st.Gen("/counters", "p1"), s.st.Worker.Lease, rel(s.send), h.nodes[newHeld.node].id, newHeld.st.Gen("/counters", "p1"), rel(newHeld.recv))
			}
		}
	}
	var leaseUnhealthy, leaseExpired time.Time
	for _, s := range statuses {
		if s.node != oi || s.send.Before(cutAt) || s.recv.After(healFrom) {
			continue
		}
		if s.st.Worker.Lease == "unhealthy" && leaseUnhealthy.IsZero() {
			leaseUnhealthy = s.recv
		}
		if s.st.Worker.Lease == "expired" && leaseExpired.IsZero() {
			leaseExpired = s.recv
		}
	}
	var healedFirst time.Time
	for _, s := range serves {
		if s.via == oi && s.code == 200 && s.send.After(healAt) && (healedFirst.IsZero() || s.recv.Before(healedFirst)) {
			healedFirst = s.recv
		}
	}

	t.Logf("timeline (0 = partition made; the cut took %dms, the heal %dms):\n"+
		"  old owner %s: lease unhealthy seen %s, last 200 for p1 answered %s, first 503 lease expired %s, lease expired seen %s, last status with p1 under a servable lease %s\n"+
		"  survivors: first 200 for p1 %s (via %s, sent %s), status with p1 first seen %s on %s\n"+
		"  gap between the old owner's last 200 and the new owner's first: %dms\n"+
		"  heal %s; first 200 for p1 through the healed node %s\n"+
		"  %d requests: %d increments acknowledged (highest %d), %d refused by a front door, %d with unknown outcome; %d 200s from the isolated owner during the partition; final value %d",
		cutAt.Sub(cutFrom).Milliseconds(), healAt.Sub(healFrom).Milliseconds(),
		h.nodes[oi].id, rel(leaseUnhealthy), rel(oldLast.recv), rel(expiredFirst.recv), rel(leaseExpired), rel(oldServable.recv),
		rel(newFirst.recv), nodeName(h.nodes, newFirst), rel(newFirst.send), rel(newHeld.recv), nodeIDOf(h.nodes, newHeld),
		newFirst.recv.Sub(oldLast.recv).Milliseconds(),
		rel(healAt), rel(healedFirst),
		len(serves), len(acked), maxAcked, refused, unknown, oldServes, final)
}

// isFrontDoorRefusal reports whether a non-200 body is pinnedd refusing
// before the counter ran (nothing applied), as opposed to the counter
// failing a write (its memory moved on).
func isFrontDoorRefusal(body string) bool {
	for _, m := range []string{"lease expired", "lease unhealthy", "owner unreachable", "quarantine", "owner refused",
		"placement moved", "not registered", "no live workers", "node is starting", "draining", "cluster secret"} {
		if strings.Contains(body, m) {
			return true
		}
	}
	return false
}

func nodeName(nodes []*node, s serve) string {
	if s.recv.IsZero() {
		return "-"
	}
	return nodes[s.via].id
}

func nodeIDOf(nodes []*node, s statusSample) string {
	if s.recv.IsZero() {
		return "-"
	}
	return nodes[s.node].id
}
