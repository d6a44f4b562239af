// Package testdir commits directory commands in process, without Raft, for
// the tests of the packages over the directory (pinboard, frontdoor).
package testdir

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/pinboard/directory"
)

// Applier commits commands straight to the state machine, one index each,
// in order: the directory of a one-node cluster without the Raft log
// under it.
type Applier struct {
	mu    sync.Mutex
	M     *directory.Machine
	Index uint64
}

// Apply commits cmd at the next index.
func (a *Applier) Apply(_ context.Context, cmd []byte) ([]byte, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.Index++
	return a.M.Apply(a.Index, cmd), nil
}

// Apply applies cmd to m at index as a committed Raft entry would.
func Apply(m *directory.Machine, index uint64, cmd directory.Command) directory.Result {
	r, err := directory.DecodeResult(m.Apply(index, directory.Encode(cmd)))
	if err != nil {
		panic(err) // the machine's own encoding
	}
	return r
}

// Doer commits a command (pinboard.Directory).
type Doer interface {
	Do(ctx context.Context, cmd directory.Command) (directory.Result, error)
}

// Register puts a worker serving namespaces into the directory, its lease
// good for ttl from now (negative: lapsed), advertised at
// http://<nodeID>.internal:8080.
func Register(t testing.TB, dir Doer, clientID, nodeID string, ttl time.Duration, namespaces ...string) {
	t.Helper()
	now := time.Now()
	res, err := dir.Do(t.Context(), directory.Register{
		ClientID: clientID, SessionID: "s-" + clientID, NodeID: nodeID, AdvertiseURL: "http://" + nodeID + ".internal:8080",
		Namespaces: namespaces, Headroom: 10, TTLMs: time.Hour.Milliseconds(), Now: now.Add(ttl - time.Hour).UnixMilli(),
	})
	if err != nil || res.Code != directory.CodeOK {
		t.Fatalf("register %s: %v %v %s", clientID, err, res.Code, res.Reason)
	}
}
