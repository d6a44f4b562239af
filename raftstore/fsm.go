package raftstore

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pinnedd/pinnedd/internal/clustertls"
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
	Op      string `json:"op"` // "set", "delete", "ca", "ca-rotate", "ca-retire" or "fence"
	ID      string `json:"id,omitempty"`
	APIAddr string `json:"api_addr,omitempty"`
	// A cluster CA, PEM (ops "ca", "ca-rotate"; "ca-retire" names it by CACert alone).
	CACert string `json:"ca_cert,omitempty"`
	CAKey  string `json:"ca_key,omitempty"`
}

const (
	metaSet    = "set"
	metaDelete = "delete"
	metaCA     = "ca"
	// metaCARotate records a new CA that issues from then on; the ones before stay trusted
	// until metaCARetire retires them (never the one that issues).
	metaCARotate = "ca-rotate"
	metaCARetire = "ca-retire"
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
	// The cluster CAs recorded, oldest first, as the log recorded them (keys sealed, or in
	// clear by an older node or one without a token); the last one not retired issues
	// (ca, when this node can open its key), every one not retired is trusted.
	cas          []caRecord
	ca           *clustertls.CA // the issuing CA opened, once caOpened (clusterCA)
	caOpened     bool
	sealer       *clustertls.Sealer
	nodeValidity time.Duration // of the certificates ca issues
	fence        uint64        // index of the latest metaFence entry
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

func newFSM(sm StateMachine, onMeta func(), log *slog.Logger, reg prometheus.Registerer, sealer *clustertls.Sealer, nodeValidity time.Duration) *fsm {
	f := &fsm{sm: sm, onMeta: onMeta, log: log, members: map[string]string{}, sealer: sealer, nodeValidity: nodeValidity}
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
	if c.Op == metaCA || c.Op == metaCARotate || c.Op == metaCARetire {
		f.applyCA(c)
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

// caRecord is one cluster CA as the log recorded it.
type caRecord struct {
	Cert    string `json:"cert"`
	Key     string `json:"key"`
	Retired bool   `json:"retired,omitempty"`
}

// applyCA applies the CA ops. "ca" records the cluster CA if none is recorded: the first one
// stays, so a second bootstrap's CA (a mistake) cannot replace the one every certificate
// chains to; a CA recorded again with its key sealed replaces what was recorded (in clear, or
// sealed under a token being rotated out: sealCA).
// "ca-rotate" adds a CA not recorded yet, which issues from then on; "ca-retire" retires a
// CA that does not issue. What was recorded stays, for snapshots, even where this node cannot
// open or use it: that is logged, and this node issues no certificate.
func (f *fsm) applyCA(c metaCommand) {
	f.mu.Lock()
	at := slices.IndexFunc(f.cas, func(r caRecord) bool { return r.Cert == c.CACert })
	changed := true
	switch {
	case c.Op == metaCA && len(f.cas) == 0, c.Op == metaCARotate && at < 0 && len(f.cas) > 0:
		f.cas = append(f.cas, caRecord{Cert: c.CACert, Key: c.CAKey})
	case c.Op != metaCARetire && at >= 0 && !f.cas[at].Retired && clustertls.IsSealed([]byte(c.CAKey)) && c.CAKey != f.cas[at].Key:
		f.cas[at].Key = c.CAKey // sealed (again, under the leader's current token)
	case c.Op == metaCARetire && at >= 0 && at != f.issuerLocked() && !f.cas[at].Retired:
		// Its key goes with it: nothing signs with a retired CA, and the
		// snapshots after this no longer hold it for anyone to open.
		f.cas[at].Retired, f.cas[at].Key = true, ""
	default:
		changed = false
	}
	if changed {
		f.ca, f.caOpened = nil, false
	}
	f.mu.Unlock()
	if changed && f.onMeta != nil {
		f.onMeta() // wakes a certificate request waiting for the CA, renews this node's own
	}
}

// issuerLocked is the index of the CA that issues (the last one not retired), or -1.
func (f *fsm) issuerLocked() int {
	for i := len(f.cas) - 1; i >= 0; i-- {
		if !f.cas[i].Retired {
			return i
		}
	}
	return -1
}

// openCALocked is the issuing CA with its key opened, or nil (logged) if this node cannot.
func (f *fsm) openCALocked() *clustertls.CA {
	i := f.issuerLocked()
	if i < 0 {
		return nil
	}
	rec := f.cas[i]
	key := []byte(rec.Key)
	if clustertls.IsSealed(key) {
		if f.sealer == nil {
			f.log.Error("the cluster CA's key is sealed with the deployment token, and this node has none: it issues no certificates")
			return nil
		}
		var err error
		if key, err = f.sealer.Open(clustertls.LabelCAKey, key); err != nil {
			f.skipped.WithLabelValues(skipUndecodable).Inc()
			f.log.Error("the cluster CA's key does not open with this node's deployment token: it issues no certificates", "err", err)
			return nil
		}
	}
	ca, err := clustertls.ParseCA([]byte(rec.Cert), key)
	if err != nil {
		f.skipped.WithLabelValues(skipUndecodable).Inc()
		f.log.Error("the cluster CA recorded in the log is unusable here", "err", err)
		return nil
	}
	ca.NodeValidity = f.nodeValidity
	return ca
}

// caKeyToSeal is a CA whose key this node would seal (again): recorded in
// clear, or sealed under a token of its being rotated out (not its first);
// nil if there is none, or this node has no sealer.
func (f *fsm) caKeyToSeal() *caRecord {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if f.sealer == nil {
		return nil
	}
	for _, r := range f.cas {
		if r.Retired {
			continue // its key is gone
		}
		if !clustertls.IsSealed([]byte(r.Key)) {
			return &r
		}
		if _, stale, err := f.sealer.OpenStale(clustertls.LabelCAKey, []byte(r.Key)); err == nil && stale {
			return &r
		}
	}
	return nil
}

// retirable are the certificates (as recorded) of the CAs trusted that do not issue.
func (f *fsm) retirable() []string {
	f.mu.RLock()
	defer f.mu.RUnlock()
	var out []string
	for i, r := range f.cas {
		if !r.Retired && i != f.issuerLocked() {
			out = append(out, r.Cert)
		}
	}
	return out
}

// trusted is the bundle of the CAs trusted, the issuer first (nil before any is recorded),
// and how many there are.
func (f *fsm) trusted() ([]byte, int) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	var b []byte
	n := 0
	for i := len(f.cas) - 1; i >= 0; i-- {
		if !f.cas[i].Retired {
			b = append(b, f.cas[i].Cert...)
			n++
		}
	}
	return b, n
}

// clusterCA is the recorded cluster CA, or nil. It is opened when first asked for after a
// change, not as each change applies: a log replayed from before a token rotation holds
// records this node no longer opens, replaced by entries further on.
func (f *fsm) clusterCA() *clustertls.CA {
	f.mu.RLock()
	ca, opened := f.ca, f.caOpened
	f.mu.RUnlock()
	if opened {
		return ca
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.caOpened {
		f.ca, f.caOpened = f.openCALocked(), true
	}
	return f.ca
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
	CACert string     `json:"ca_cert,omitempty"`
	CAKey  string     `json:"ca_key,omitempty"`
	CAs    []caRecord `json:"cas,omitempty"`
	Fence  uint64     `json:"fence,omitempty"`
}

func (f *fsm) Snapshot() (raft.FSMSnapshot, error) {
	f.mu.RLock()
	sm := snapshotMeta{Members: maps.Clone(f.members), Fence: f.fence, CAs: slices.Clone(f.cas)}
	if i := f.issuerLocked(); i >= 0 {
		sm.CACert, sm.CAKey = f.cas[i].Cert, f.cas[i].Key
	}
	f.mu.RUnlock()
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
	f.cas = meta.CAs
	if len(f.cas) == 0 && meta.CACert != "" {
		f.cas = []caRecord{{Cert: meta.CACert, Key: meta.CAKey}} // an older version's
	}
	f.ca, f.caOpened = nil, false // opened when asked for (clusterCA)
	f.fence = meta.Fence
	f.mu.Unlock()
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
