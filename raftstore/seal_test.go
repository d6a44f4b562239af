package raftstore

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/clustertls"
	"github.com/pinnedd/pinnedd/internal/testutil"
)

func sealedTLS(tokens ...string) func(*Config) {
	return func(c *Config) {
		s, err := clustertls.NewSealer(tokens...)
		if err != nil {
			panic(err)
		}
		tlsOpts(c).Sealer = s
	}
}

// clearKeys lists the files under dirs that hold a private key in clear (a PEM key block,
// also as it appears inside a JSON log entry or snapshot).
func clearKeys(t *testing.T, dirs ...string) []string {
	t.Helper()
	var found []string
	for _, dir := range dirs {
		err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			if bytes.Contains(b, []byte("PRIVATE KEY-----")) {
				found = append(found, path)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return found
}

// snapshotAll makes every node take a snapshot, so the CA goes into each one's snapshot store.
func snapshotAll(t *testing.T, nodes []*testNode) {
	t.Helper()
	for _, n := range nodes {
		if err := n.s.raft.Snapshot().Error(); err != nil {
			t.Fatalf("%s: snapshot: %v", n.id, err)
		}
	}
}

// With a sealer, no key reaches a data dir in clear: not the CA key (its file, its log entry,
// the snapshots), not a node's key; the nodes restart from their sealed keys.
func TestTLSKeysAtRestAreSealed(t *testing.T) {
	seal := sealedTLS("secret")
	nodes := tlsClusterWith(t, 2, seal)
	n1, n2 := nodes[0], nodes[1]
	mustApply(t, n1, "a")
	converged(t, nodes, []string{"a"})
	testutil.WaitFor(t, 5*time.Second, "n2 holds the cluster CA", func() bool { return n2.s.fsm.cas.Issuer() != nil })
	snapshotAll(t, nodes)
	a1, a2 := n1.s.RaftAddr(), n2.s.RaftAddr()
	for _, n := range nodes {
		n.close()
	}
	if found := clearKeys(t, n1.dir, n2.dir); len(found) > 0 {
		t.Fatalf("keys in clear: %v", found)
	}

	// Restarted, both open their keys, and the log's CA with them.
	nodes = []*testNode{
		startNode(t, "n1", n1.dir, a1, false, seal),
		startNode(t, "n2", n2.dir, a2, false, seal),
	}
	waitLeader(t, nodes[0])
	mustApply(t, leaderOf(t, nodes), "b")
	converged(t, nodes, []string{"a", "b"})
	for _, n := range nodes {
		if n.s.fsm.cas.Issuer() == nil {
			t.Fatalf("%s: the recorded CA does not open", n.id)
		}
	}
}

// Another token does not open a sealed data dir: the node refuses to start and says why.
func TestTLSSealedKeyRefusesAnotherToken(t *testing.T) {
	n1 := startNode(t, "n1", t.TempDir(), "", true, sealedTLS("secret"))
	waitLeader(t, n1)
	n1.close()
	cfg := n1.cfg
	cfg.Cluster = nil // a cluster port opens once
	sealedTLS("another")(&cfg)
	withCluster(&cfg)
	_, err := Open(t.Context(), cfg, &listSM{})
	if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "PINBOARD_TOKEN") {
		t.Fatalf("open with another token: %v", err)
	}
}

// A cluster an older version ran, its keys in clear, has them sealed once it runs with a
// sealer: the key files in place, the CA in the log by the leader (and so in the snapshots
// after it).
func TestTLSKeysInClearAreSealedOnUpgrade(t *testing.T) {
	older := tlsCluster(t, 2)
	n1, n2 := older[0], older[1]
	mustApply(t, n1, "a")
	converged(t, []*testNode{n1, n2}, []string{"a"})
	testutil.WaitFor(t, 5*time.Second, "n2 holds the cluster CA", func() bool { return n2.s.fsm.cas.Issuer() != nil })
	a1, a2 := n1.s.RaftAddr(), n2.s.RaftAddr()
	n1.close()
	n2.close()
	if len(clearKeys(t, filepath.Join(n1.dir, "tls"))) == 0 {
		t.Fatal("the older layout has no key in clear: nothing to upgrade")
	}

	seal := sealedTLS("secret")
	nodes := []*testNode{
		startNode(t, "n1", n1.dir, a1, false, seal),
		startNode(t, "n2", n2.dir, a2, false, seal),
	}
	waitLeader(t, nodes[0])
	testutil.WaitFor(t, 10*time.Second, "the CA recorded again with its key sealed", func() bool {
		return nodes[0].s.fsm.cas.KeyToSeal() == nil && nodes[1].s.fsm.cas.KeyToSeal() == nil
	})
	if found := clearKeys(t, filepath.Join(n1.dir, "tls"), filepath.Join(n2.dir, "tls")); len(found) > 0 {
		t.Fatalf("key files still in clear: %v", found)
	}
	// No snapshot was taken before the upgrade: the ones taken now are all there are.
	snapshotAll(t, nodes)
	for _, n := range nodes {
		if found := clearKeys(t, filepath.Join(n.dir, "raft", "snapshots")); len(found) > 0 {
			t.Fatalf("%s: a snapshot holds a key in clear: %v", n.id, found)
		}
	}
}

// A token rotation: run with the new token first and the old one after, the nodes seal their
// key files again under the new one and the leader records the CA's key again under it, so
// that the old token can go: with the new one alone, the nodes start and the CA opens.
func TestTLSKeysSealedAgainWhenTheTokenRotates(t *testing.T) {
	nodes := tlsClusterWith(t, 2, sealedTLS("old-token"))
	n1, n2 := nodes[0], nodes[1]
	mustApply(t, n1, "a")
	converged(t, nodes, []string{"a"})
	testutil.WaitFor(t, 5*time.Second, "n2 holds the cluster CA", func() bool { return n2.s.fsm.cas.Issuer() != nil })
	a1, a2 := n1.s.RaftAddr(), n2.s.RaftAddr()
	n1.close()
	n2.close()

	rolling := sealedTLS("new-token", "old-token")
	nodes = []*testNode{startNode(t, "n1", n1.dir, a1, false, rolling), startNode(t, "n2", n2.dir, a2, false, rolling)}
	waitLeader(t, nodes[0])
	testutil.WaitFor(t, 10*time.Second, "the CA's key sealed again under the new token", func() bool {
		return nodes[0].s.fsm.cas.KeyToSeal() == nil && nodes[1].s.fsm.cas.KeyToSeal() == nil
	})
	mustApply(t, leaderOf(t, nodes), "b")
	converged(t, nodes, []string{"a", "b"})
	for _, n := range nodes {
		n.close()
	}

	only := sealedTLS("new-token")
	nodes = []*testNode{startNode(t, "n1", n1.dir, a1, false, only), startNode(t, "n2", n2.dir, a2, false, only)}
	waitLeader(t, nodes[0])
	mustApply(t, leaderOf(t, nodes), "c")
	converged(t, nodes, []string{"a", "b", "c"})
	for _, n := range nodes {
		if n.s.fsm.cas.Issuer() == nil {
			t.Fatalf("%s: the CA does not open with the new token alone", n.id)
		}
	}
}
