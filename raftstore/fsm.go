package raftstore

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"sync"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pinnedd/pinnedd/clusterport"
)

// StateMachine is the deterministic state the log drives. Implementations must be pure:
// same entries in the same order => same state and same results on every node.
//
// Apply, Snapshot and Restore are called from one goroutine, never concurrently with each
// other; reads from other goroutines need the implementation's own lock.
type StateMachine interface {
	// Apply applies the command committed at index. The result bytes are returned to the
	// proposer (also across forwarding). It must not fail for reasons outside the command
	// itself: encode rejections in the result.
	Apply(index uint64, cmd []byte) []byte
	// Snapshot captures the state cheaply (under the state machine's lock); WriteTo runs
	// later, outside it and concurrently with Apply. If the WriterTo also has a Release()
	// method, it is called once the snapshot is persisted or abandoned.
	Snapshot() (io.WriterTo, error)
	// Restore replaces the state wholesale with what a Snapshot wrote.
	Restore(r io.Reader) error
}

// Entry kinds: the first byte of every log entry raftstore writes. A kind with
// ignoreUnknownFlag set may be skipped by a node that does not know it (as in Nomad's FSM);
// any other unknown kind stops the node, because silently skipping it would let its state
// diverge from the rest of the group.
const (
	kindUser          byte = 0x01 // a StateMachine command
	kindMeta          byte = 0x02 // raftstore-internal member metadata
	ignoreUnknownFlag byte = 0x80
)

// metaCommand is the raftstore-internal command that maintains member metadata.
type metaCommand struct {
	Op      string `json:"op"` // "set", "delete", "fence", or a clusterport.CAOp
	ID      string `json:"id,omitempty"`
	APIAddr string `json:"api_addr,omitempty"`
	// A cluster CA, PEM (ops "ca", "ca-rotate"; "ca-retire" names it by CACert alone).
	CACert string `json:"ca_cert,omitempty"`
	CAKey  string `json:"ca_key,omitempty"`
}

const (
	metaSet    = "set"
	metaDelete = "delete"
	// metaFence raises the membership fence to the entry's own index, before a member (ID) is
	// removed: a join must name a fence at least as high (see Store.joinLocal).
	metaFence = "fence"
)

func encodeUser(cmd []byte) []byte {
	b := make([]byte, 1+len(cmd))
	b[0] = kindUser
	copy(b[1:], cmd)
	return b
}

func encodeMeta(c metaCommand) []byte {
	j, err := json.Marshal(c)
	if err != nil {
		panic(fmt.Sprintf("raftstore: encoding meta command: %v", err)) // plain strings cannot fail
	}
	return append([]byte{kindMeta}, j...)
}

// fsm adapts a StateMachine to raft.FSM and keeps the member metadata (node id -> API URL).
type fsm struct {
	sm      StateMachine
	onMeta  func() // called after the metadata changed (outside the lock)
	log     *slog.Logger
	skipped *prometheus.CounterVec // by reason
	// onConfiguration is called with every committed Raft configuration. Optional.
	onConfiguration func(raft.Configuration)
	mu              sync.RWMutex
	members         map[string]string
	// cas are the cluster CAs the log records (the cluster port's ledger; its own lock).
	cas   *clusterport.Ledger
	fence uint64 // index of the latest metaFence entry
}

var (
	_ raft.FSM                = (*fsm)(nil)
	_ raft.ConfigurationStore = (*fsm)(nil)
)

// StoreConfiguration is raft's hook for a committed configuration entry.
func (f *fsm) StoreConfiguration(_ uint64, c raft.Configuration) {
	if f.onConfiguration != nil {
		f.onConfiguration(c)
	}
}

// Why an entry is skipped (pinned_raft_entries_skipped_total{reason}).
const (
	skipUndecodable = "undecodable"
	skipUnknownKind = "unknown-kind"
)

func newFSM(sm StateMachine, onMeta func(), log *slog.Logger, reg prometheus.Registerer, cas *clusterport.Ledger) *fsm {
	f := &fsm{sm: sm, onMeta: onMeta, log: log, members: map[string]string{}, cas: cas}
	f.skipped = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pinned_raft_entries_skipped_total",
		Help: "Committed Raft entries this node could not decode and skipped (the same on every node of its version).",
	}, []string{"reason"})
	for _, r := range []string{skipUndecodable, skipUnknownKind} {
		f.skipped.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(f.skipped)
	}
	cas.CountUnusable(f.skipped.WithLabelValues(skipUndecodable).Inc)
	return f
}

// skip passes over a committed entry this node cannot apply. Every node
// of one version decides the same from the same bytes, so skipping keeps
// them identical, where a panic would stop each one that applies the entry,
// at every restart.
func (f *fsm) skip(l *raft.Log, reason string, err error) {
	f.skipped.WithLabelValues(reason).Inc()
	f.log.Error("skipped a committed Raft entry this node cannot apply", "index", l.Index, "term", l.Term, "reason", reason, "err", err)
}

func (f *fsm) Apply(l *raft.Log) any {
	if len(l.Data) == 0 {
		return nil
	}
	switch kind := l.Data[0]; kind {
	case kindUser:
		return f.sm.Apply(l.Index, l.Data[1:])
	case kindMeta:
		var c metaCommand
		if err := json.Unmarshal(l.Data[1:], &c); err != nil {
			f.skip(l, skipUndecodable, err)
			return nil
		}
		f.applyMeta(l.Index, c)
		return nil
	default:
		if kind&ignoreUnknownFlag != 0 {
			return nil
		}
		// A newer node's kind (new kinds that older nodes may skip carry
		// ignoreUnknownFlag; others need every node upgraded first).
		f.skip(l, skipUnknownKind, fmt.Errorf("entry kind %#x: upgrade this node", kind))
		return nil
	}
}

func (f *fsm) applyMeta(index uint64, c metaCommand) {
	if op := clusterport.CAOp(c.Op); op == clusterport.OpCA || op == clusterport.OpCARotate || op == clusterport.OpCARetire {
		// A change wakes a certificate request waiting for the CA, and renews this node's own.
		if f.cas.Apply(op, c.CACert, c.CAKey) && f.onMeta != nil {
			f.onMeta()
		}
		return
	}
	f.mu.Lock()
	switch c.Op {
	case metaFence:
		f.fence = index
	case metaSet:
		f.members[c.ID] = c.APIAddr
	case metaDelete:
		delete(f.members, c.ID)
	}
	f.mu.Unlock()
	if f.onMeta != nil {
		f.onMeta()
	}
}

// membershipFence is the index of the latest removal's fence entry (0: none yet).
func (f *fsm) membershipFence() uint64 {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.fence
}

func (f *fsm) apiAddr(id string) string {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.members[id]
}

func (f *fsm) metaCopy() map[string]string {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return maps.Clone(f.members)
}

// Snapshot format, version 1:
//
//	magic "PNDRS\x00\x00\x01" | uint32 big-endian length n | n bytes JSON snapshotMeta | user state
//
// The user state runs to the end of the stream and is handed to StateMachine.Restore as is.
var snapshotMagic = []byte("PNDRS\x00\x00\x01")

type snapshotMeta struct {
	Members map[string]string `json:"members"`
	// CACert and CAKey are the issuing CA, for a node of a version before rotation; CAs all
	// of them.
	CACert string                 `json:"ca_cert,omitempty"`
	CAKey  string                 `json:"ca_key,omitempty"`
	CAs    []clusterport.CARecord `json:"cas,omitempty"`
	Fence  uint64                 `json:"fence,omitempty"`
}

func (f *fsm) Snapshot() (raft.FSMSnapshot, error) {
	f.mu.RLock()
	sm := snapshotMeta{Members: maps.Clone(f.members), Fence: f.fence}
	f.mu.RUnlock()
	var issuer int
	if sm.CAs, issuer = f.cas.Records(); issuer >= 0 {
		sm.CACert, sm.CAKey = sm.CAs[issuer].Cert, sm.CAs[issuer].Key
	}
	meta, err := json.Marshal(sm)
	if err != nil {
		return nil, fmt.Errorf("raftstore: snapshot meta: %w", err)
	}
	wt, err := f.sm.Snapshot()
	if err != nil {
		return nil, fmt.Errorf("raftstore: state machine snapshot: %w", err)
	}
	return &fsmSnapshot{meta: meta, state: wt}, nil
}

func (f *fsm) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	head := make([]byte, len(snapshotMagic)+4)
	if _, err := io.ReadFull(rc, head); err != nil {
		return fmt.Errorf("raftstore: restore: reading header: %w", err)
	}
	if !bytes.Equal(head[:len(snapshotMagic)], snapshotMagic) {
		return fmt.Errorf("raftstore: restore: not a raftstore v1 snapshot (header %q)", head[:len(snapshotMagic)])
	}
	n := binary.BigEndian.Uint32(head[len(snapshotMagic):])
	const maxMeta = 64 << 20
	if n > maxMeta {
		return fmt.Errorf("raftstore: restore: member metadata of %d bytes is implausible", n)
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(rc, buf); err != nil {
		return fmt.Errorf("raftstore: restore: reading member metadata: %w", err)
	}
	var meta snapshotMeta
	if err := json.Unmarshal(buf, &meta); err != nil {
		return fmt.Errorf("raftstore: restore: decoding member metadata: %w", err)
	}
	if err := f.sm.Restore(rc); err != nil {
		return fmt.Errorf("raftstore: restore: state machine: %w", err)
	}
	if meta.Members == nil {
		meta.Members = map[string]string{}
	}
	f.mu.Lock()
	f.members = meta.Members
	f.fence = meta.Fence
	f.mu.Unlock()
	if len(meta.CAs) == 0 && meta.CACert != "" {
		meta.CAs = []clusterport.CARecord{{Cert: meta.CACert, Key: meta.CAKey}} // an older version's
	}
	f.cas.Restore(meta.CAs)
	if f.onMeta != nil {
		f.onMeta()
	}
	return nil
}

type fsmSnapshot struct {
	meta  []byte
	state io.WriterTo
}

func (s *fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	head := make([]byte, len(snapshotMagic)+4)
	copy(head, snapshotMagic)
	binary.BigEndian.PutUint32(head[len(snapshotMagic):], uint32(len(s.meta)))
	err := func() error {
		if _, err := sink.Write(head); err != nil {
			return err
		}
		if _, err := sink.Write(s.meta); err != nil {
			return err
		}
		_, err := s.state.WriteTo(sink)
		return err
	}()
	if err != nil {
		_ = sink.Cancel()
		return fmt.Errorf("raftstore: persisting snapshot: %w", err)
	}
	if err := sink.Close(); err != nil {
		return fmt.Errorf("raftstore: closing snapshot: %w", err)
	}
	return nil
}

func (s *fsmSnapshot) Release() {
	if r, ok := s.state.(interface{ Release() }); ok {
		r.Release()
	}
}
