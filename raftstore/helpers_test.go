package raftstore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testutil"
)

// listSM is the state machine under test: an append-only list of commands. Apply returns the
// new length, so a proposer can see its own result.
//
// With countOnly (benchmarks) it keeps just the count, so snapshots stay small and the
// state machine does not dominate what is measured.
type listSM struct {
	mu        sync.Mutex
	countOnly bool
	count     int
	entries   []string
	restores  int
	// Apply of the command holdCmd waits until hold is closed (nil: never waits).
	holdCmd string
	hold    chan struct{}
}

func (m *listSM) Apply(_ uint64, cmd []byte) []byte {
	if m.hold != nil && string(cmd) == m.holdCmd {
		<-m.hold
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.count++
	if !m.countOnly {
		m.entries = append(m.entries, string(cmd))
	}
	return []byte(strconv.Itoa(m.count))
}

func (m *listSM) Snapshot() (io.WriterTo, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, err := json.Marshal(snapState{Count: m.count, Entries: m.entries})
	if err != nil {
		return nil, err
	}
	return bytes.NewReader(b), nil
}

type snapState struct {
	Count   int      `json:"count"`
	Entries []string `json:"entries"`
}

func (m *listSM) Restore(r io.Reader) error {
	var st snapState
	if err := json.NewDecoder(r).Decode(&st); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.count, m.entries = st.Count, st.Entries
	m.restores++
	return nil
}

func (m *listSM) list() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.entries)
}

func (m *listSM) restoreCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.restores
}

// testNode is one pinnedd-like node: a Store behind a real HTTP server.
type testNode struct {
	t       testing.TB
	id      string
	dir     string
	cfg     Config
	sm      *listSM
	s       *Store
	srv     *httptest.Server
	handler atomic.Pointer[http.Handler]
	// closeErr: the test expects Close to fail (it checked the error itself).
	closeErr error
	// abandoned: Close hung and the test failed; the cleanup leaves the node to the process exit.
	abandoned bool
}

func testLogger() *slog.Logger {
	if os.Getenv("RAFTSTORE_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// fastConfig returns timeouts short enough for tests on a loaded 2-core machine, yet long
// enough that -race does not make leaders flap.
func fastConfig(c Config) Config {
	c.HeartbeatTimeout = 500 * time.Millisecond
	c.ElectionTimeout = 500 * time.Millisecond
	c.LeaderLeaseTimeout = 250 * time.Millisecond
	c.CommitTimeout = 20 * time.Millisecond
	c.ApplyTimeout = 5 * time.Second
	c.Logger = testLogger()
	return c
}

// startNode opens a node in dir. raftAddr "" picks a free port.
func startNode(t testing.TB, id, dir, raftAddr string, bootstrap bool, mod func(*Config)) *testNode {
	t.Helper()
	return startNodeSM(t, id, dir, raftAddr, bootstrap, mod, &listSM{})
}

func startNodeSM(t testing.TB, id, dir, raftAddr string, bootstrap bool, mod func(*Config), sm *listSM) *testNode {
	t.Helper()
	if raftAddr == "" {
		raftAddr = "127.0.0.1:0"
	}
	n := &testNode{t: t, id: id, dir: dir, sm: sm}
	n.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := n.handler.Load()
		if h == nil {
			http.Error(w, "starting", http.StatusServiceUnavailable)
			return
		}
		(*h).ServeHTTP(w, r)
	}))
	n.cfg = fastConfig(Config{
		NodeID:    id,
		RaftAddr:  raftAddr,
		APIAddr:   n.srv.URL,
		DataDir:   dir,
		Bootstrap: bootstrap,
		Token:     "secret",
	})
	if mod != nil {
		mod(&n.cfg)
	}
	withCluster(&n.cfg)
	s, err := Open(context.Background(), n.cfg, n.sm)
	if err != nil {
		n.srv.Close()
		t.Fatalf("open %s: %v", id, err)
	}
	n.s = s
	// As the agent does: the cluster port's HTTP, for forwards to the leader over TLS.
	if c := n.cfg.Cluster; c != nil {
		rpc := s.PeerHandler()
		c.Serve(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.HasPrefix(r.URL.Path, HandlerPrefix) {
				rpc.ServeHTTP(w, r)
				return
			}
			_, _ = io.WriteString(w, "peer "+r.URL.Path)
		}))
	}
	h := s.Handler(func(r *http.Request) error {
		if r.Header.Get("Authorization") != "Bearer secret" {
			return errors.New("missing or wrong bearer token")
		}
		return nil
	})
	n.handler.Store(&h)
	t.Cleanup(n.close)
	return n
}

// close shuts the node down gracefully (idempotent).
func (n *testNode) close() {
	if n.abandoned {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.s.Close(ctx); err != nil && !errors.Is(err, n.closeErr) {
		n.t.Errorf("close %s: %v", n.id, err)
	}
	n.srv.Close()
}

// kill stops the node the hard way: no leadership transfer, HTTP gone at once.
func (n *testNode) kill() {
	n.srv.CloseClientConnections()
	n.srv.Close()
	if err := n.s.shutdown(context.Background(), false); err != nil {
		n.t.Errorf("kill %s: %v", n.id, err)
	}
}

func ctxTimeout(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func waitLeader(t testing.TB, n *testNode) {
	t.Helper()
	if err := n.s.WaitForLeader(ctxTimeout(t, 10*time.Second)); err != nil {
		t.Fatalf("%s: %v", n.id, err)
	}
}

// newCluster bootstraps nodes[0] and joins the rest through the first node's HTTP API.
func newCluster(t testing.TB, size int, mod func(*Config)) []*testNode {
	t.Helper()
	return newClusterSM(t, size, mod, func() *listSM { return &listSM{} })
}

func newClusterSM(t testing.TB, size int, mod func(*Config), newSM func() *listSM) []*testNode {
	t.Helper()
	nodes := []*testNode{startNodeSM(t, "n1", t.TempDir(), "", true, mod, newSM())}
	waitLeader(t, nodes[0])
	for i := 2; i <= size; i++ {
		n := startNodeSM(t, fmt.Sprintf("n%d", i), t.TempDir(), "", false, mod, newSM())
		join(t, nodes[0].srv.URL, n)
		nodes = append(nodes, n)
	}
	for _, n := range nodes {
		waitLeader(t, n)
	}
	return nodes
}

func leaderOf(t testing.TB, nodes []*testNode) *testNode {
	t.Helper()
	var leader *testNode
	testutil.WaitForErr(t, 10*time.Second, "a single leader", func() error {
		leader = nil
		for _, n := range nodes {
			if n.s.closed.Load() || !n.s.IsLeader() {
				continue
			}
			if leader != nil {
				return fmt.Errorf("two leaders: %s and %s", leader.id, n.id)
			}
			leader = n
		}
		if leader == nil {
			return fmt.Errorf("no leader")
		}
		return nil
	})
	return leader
}

// followerOf is the first of nodes that is not leader.
func followerOf(nodes []*testNode, leader *testNode) *testNode {
	for _, n := range nodes {
		if n != leader {
			return n
		}
	}
	return nil
}

// converged waits until every node has applied the same entries as want.
func converged(t testing.TB, nodes []*testNode, want []string) {
	t.Helper()
	for _, n := range nodes {
		testutil.WaitForErr(t, 10*time.Second, n.id+" caught up", func() error {
			if got := n.sm.list(); !slices.Equal(got, want) {
				return fmt.Errorf("%s has %d entries, want %d", n.id, len(got), len(want))
			}
			return nil
		})
	}
}

func membersByID(t testing.TB, n *testNode) map[string]Member {
	t.Helper()
	ms, err := n.s.Members(ctxTimeout(t, 5*time.Second))
	if err != nil {
		t.Fatalf("members via %s: %v", n.id, err)
	}
	out := map[string]Member{}
	for _, m := range ms {
		out[m.ID] = m
	}
	return out
}

func mustApply(t testing.TB, n *testNode, cmd string) string {
	t.Helper()
	res, err := n.s.Apply(ctxTimeout(t, 10*time.Second), []byte(cmd))
	if err != nil {
		t.Fatalf("apply %q via %s: %v", cmd, n.id, err)
	}
	return string(res)
}

// join asks the member at url to add n, as an agent started with --join does: joining is
// idempotent, so an unknown outcome (leadership lost mid-change) is simply retried.
func join(t testing.TB, url string, n *testNode) {
	t.Helper()
	ctx := ctxTimeout(t, 20*time.Second)
	for {
		err := JoinVia(ctx, nil, url, "secret", n.id, n.s.RaftAddr(), n.srv.URL)
		if err == nil {
			return
		}
		if !errors.Is(err, ErrOutcomeUnknown) || ctx.Err() != nil {
			t.Fatalf("join %s via %s: %v", n.id, url, err)
		}
	}
}
