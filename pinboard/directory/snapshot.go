package directory

import (
	"bufio"
	"cmp"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"maps"
	"slices"
)

// Snapshot format: magic, version, then the state with every collection
// sorted (so two nodes with the same state write the same bytes), then a
// CRC-32C of everything before it.
const (
	snapshotMagic   = "PDIR"
	snapshotVersion = 7 // 2: lastGen after coldStart; 3: Worker.Draining; 4: Worker.Revoked; 5: node drains; 6: Worker.Unconfirmed, the clock; 7: hostname-aware mode
	// oldestSnapshot is the oldest version Restore still reads: a node
	// upgraded on a data dir restores the snapshot its old version wrote.
	oldestSnapshot = 4
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// snapshot is a point-in-time copy of the state. Building it copies values
// under the read lock (no sorting, no encoding); WriteTo sorts and encodes
// outside the lock.
type snapshot struct {
	applied    uint64
	coldStart  int64
	lastGen    uint64
	clock      int64
	secret     []byte
	workers    []Worker
	placements []Placement
	drains     []Drain
	nodeDrains []Drain
	bindings   []Binding
	envs       []EnvPolicy
}

// Snapshot captures the state for raftstore to persist. Worker namespaces are
// shared with the live state: appliers replace that slice, never write into it.
func (m *Machine) Snapshot() (io.WriterTo, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	s := &snapshot{
		applied:    m.st.applied,
		coldStart:  m.st.coldStart,
		lastGen:    m.st.lastGen,
		clock:      m.st.clock,
		secret:     m.st.secret, // set once, never modified
		workers:    make([]Worker, 0, m.st.workers.len()),
		placements: make([]Placement, 0, m.st.placements.n),
		drains:     make([]Drain, 0, len(m.st.drains)),
		nodeDrains: make([]Drain, 0, len(m.st.nodeDrains)),
	}
	for _, w := range m.st.workers.all() {
		s.workers = append(s.workers, *w)
	}
	m.st.placements.each(func(p Placement) {
		s.placements = append(s.placements, p)
	})
	for _, d := range m.st.drains {
		s.drains = append(s.drains, d)
	}
	for _, d := range m.st.nodeDrains {
		s.nodeDrains = append(s.nodeDrains, d)
	}
	s.bindings = slices.Collect(maps.Values(m.st.bindings))
	s.envs = slices.Collect(maps.Values(m.st.envs))
	return s, nil
}

// countingWriter tracks bytes written and the running checksum.
type countingWriter struct {
	w   *bufio.Writer
	n   int64
	crc uint32
}

func (c *countingWriter) write(b []byte) error {
	c.crc = crc32.Update(c.crc, crcTable, b)
	n, err := c.w.Write(b)
	c.n += int64(n)
	return err
}

// WriteTo writes the snapshot. It may run while Apply continues: it touches
// only the copies taken by Snapshot.
func (s *snapshot) WriteTo(w io.Writer) (int64, error) {
	slices.SortFunc(s.workers, func(a, b Worker) int { return cmp.Compare(a.ClientID, b.ClientID) })
	slices.SortFunc(s.placements, func(a, b Placement) int { return a.Key.Compare(b.Key) })
	slices.SortFunc(s.drains, func(a, b Drain) int { return cmp.Compare(a.ClientID, b.ClientID) })
	slices.SortFunc(s.nodeDrains, func(a, b Drain) int { return cmp.Compare(a.NodeID, b.NodeID) })
	slices.SortFunc(s.bindings, compareBindings)
	slices.SortFunc(s.envs, func(a, b EnvPolicy) int { return cmp.Compare(a.Env, b.Env) })

	cw := &countingWriter{w: bufio.NewWriterSize(w, 64<<10)}
	b := make([]byte, 0, 4096)
	// flush hands the buffer over once it is large, keeping memory flat for
	// big directories.
	flush := func(force bool) error {
		if len(b) < 32<<10 && !force {
			return nil
		}
		err := cw.write(b)
		b = b[:0]
		return err
	}

	b = append(b, snapshotMagic...)
	b = append(b, snapshotVersion)
	b = binary.AppendUvarint(b, s.applied)
	b = binary.AppendVarint(b, s.coldStart)
	b = binary.AppendUvarint(b, s.lastGen)
	b = binary.AppendUvarint(b, uint64(len(s.secret)))
	b = append(b, s.secret...)

	b = binary.AppendUvarint(b, uint64(len(s.workers)))
	for _, wk := range s.workers {
		b = appendWorker(b, wk)
		if err := flush(false); err != nil {
			return cw.n, err
		}
	}
	b = binary.AppendUvarint(b, uint64(len(s.placements)))
	for _, p := range s.placements {
		b = appendPlacement(b, p)
		if err := flush(false); err != nil {
			return cw.n, err
		}
	}
	b = binary.AppendUvarint(b, uint64(len(s.drains)))
	for _, d := range s.drains {
		b = appendDrain(b, d)
	}
	b = binary.AppendUvarint(b, uint64(len(s.nodeDrains)))
	for _, d := range s.nodeDrains {
		b = appendString(b, d.NodeID)
		b = binary.AppendVarint(b, d.Deadline)
		b = appendBool(b, d.Cordon)
		b = binary.AppendVarint(b, d.SetAt)
	}
	// Version 6 added the rest at the end, so an older version is a
	// prefix of it.
	b = binary.AppendVarint(b, s.clock)
	var unconfirmed []string
	for _, wk := range s.workers {
		if wk.Unconfirmed {
			unconfirmed = append(unconfirmed, wk.ClientID)
		}
	}
	b = appendStrings(b, unconfirmed)
	b = s.appendHostnames(b)
	if err := flush(true); err != nil {
		return cw.n, err
	}
	var sum [4]byte
	binary.BigEndian.PutUint32(sum[:], cw.crc)
	n, err := cw.w.Write(sum[:])
	cw.n += int64(n)
	if err != nil {
		return cw.n, err
	}
	return cw.n, cw.w.Flush()
}

// appendHostnames writes what version 7 added (hostname-aware mode): the
// routes of the workers that have some, the hostname and fence of the
// placements that have one, the bindings and the env policies.
func (s *snapshot) appendHostnames(b []byte) []byte {
	var routed []Worker
	for _, wk := range s.workers {
		if len(wk.Routes) != 0 {
			routed = append(routed, wk)
		}
	}
	b = binary.AppendUvarint(b, uint64(len(routed)))
	for _, wk := range routed {
		b = appendRoutes(appendString(b, wk.ClientID), wk.Routes)
	}
	var hosted []Placement
	for _, p := range s.placements {
		if p.Hostname != "" || p.FenceUntil != 0 {
			hosted = append(hosted, p)
		}
	}
	b = binary.AppendUvarint(b, uint64(len(hosted)))
	for _, p := range hosted {
		b = appendString(appendKey(b, p.Key), p.Hostname)
		b = binary.AppendVarint(b, p.FenceUntil)
	}
	b = binary.AppendUvarint(b, uint64(len(s.bindings)))
	for _, bd := range s.bindings {
		b = appendString(appendString(appendString(b, bd.Hostname), bd.Namespace), bd.Env)
		b = binary.AppendUvarint(b, bd.Epoch)
		b = binary.AppendVarint(b, bd.DisplacedUntil)
	}
	b = binary.AppendUvarint(b, uint64(len(s.envs)))
	for _, e := range s.envs {
		b = append(appendString(b, e.Env), byte(e.Takeover))
		b = binary.AppendUvarint(b, e.Epoch)
	}
	return b
}

// readHostnames reads what appendHostnames wrote into st.
func readHostnames(d *decoder, st *state) {
	for n := d.count(2); n > 0 && d.err == nil; n-- {
		id, rs := d.string(), d.routes()
		if _, ok := st.workers.get(id); !ok || len(rs) == 0 {
			d.fail() // names a worker the snapshot does not hold
			return
		}
		st.workers.edit(id).Routes = rs
	}
	for n := d.count(5); n > 0 && d.err == nil; n-- {
		k, host, fence := d.key(), d.string(), d.varint()
		p, ok := st.placements.get(k)
		if !ok {
			d.fail()
			return
		}
		p.Hostname, p.FenceUntil = host, fence
		st.placements.set(p)
	}
	for n := d.count(5); n > 0 && d.err == nil; n-- {
		b := Binding{Hostname: d.string(), Namespace: d.string(), Env: d.string(), Epoch: d.uvarint(), DisplacedUntil: d.varint()}
		st.bindings[hostNS{b.Hostname, b.Namespace}] = b
	}
	for n := d.count(3); n > 0 && d.err == nil; n-- {
		e := EnvPolicy{Env: d.string(), Takeover: TakeoverPolicy(d.byte()), Epoch: d.uvarint()}
		if e.Takeover > TakeoverDeny {
			d.fail()
			return
		}
		st.envs[e.Env] = e
	}
}

func appendWorker(b []byte, w Worker) []byte {
	b = appendString(b, w.ClientID)
	b = appendString(b, w.SessionID)
	b = appendString(b, w.NodeID)
	b = appendString(b, w.AdvertiseURL)
	b = appendStrings(b, w.Namespaces)
	b = binary.AppendVarint(b, w.Headroom)
	b = binary.AppendVarint(b, w.LeaseExpiry)
	b = appendBool(b, w.Degraded)
	b = binary.AppendVarint(b, w.RegisteredAt)
	b = binary.AppendVarint(b, w.LastHeartbeat)
	b = appendBool(b, w.Draining)
	return appendBool(b, w.Revoked)
}

// Restore replaces the state with the snapshot read from r. It decodes into
// a fresh state and swaps it in only when the whole snapshot checked out, so
// a corrupt snapshot leaves the machine as it was; the lock-free readers
// move to the new state in one step.
func (m *Machine) Restore(r io.Reader) error {
	data, err := io.ReadAll(r)
	if err != nil {
		return fmt.Errorf("directory: read snapshot: %w", err)
	}
	st, err := decodeSnapshot(data)
	if err != nil {
		return err
	}
	m.mu.Lock()
	m.st = st
	m.index = 0
	clear(m.removedNow)
	m.publish()
	m.mu.Unlock()
	return nil
}

func decodeSnapshot(data []byte) (state, error) {
	if len(data) < len(snapshotMagic)+1+4 || string(data[:len(snapshotMagic)]) != snapshotMagic {
		return state{}, fmt.Errorf("%w: bad header", ErrSnapshot)
	}
	body, sum := data[:len(data)-4], binary.BigEndian.Uint32(data[len(data)-4:])
	if crc32.Checksum(body, crcTable) != sum {
		return state{}, fmt.Errorf("%w: checksum mismatch", ErrSnapshot)
	}
	v := body[len(snapshotMagic)]
	if v < oldestSnapshot || v > snapshotVersion {
		return state{}, fmt.Errorf("%w: snapshot version %d", ErrVersion, v)
	}
	d := decoder{b: body[len(snapshotMagic)+1:]}
	st := newState()
	st.applied = d.uvarint()
	st.coldStart = d.varint()
	st.lastGen = d.uvarint()
	if sec := d.bytes(); len(sec) != 0 {
		st.secret = append([]byte(nil), sec...)
	}
	for n := d.count(10); n > 0 && d.err == nil; n-- {
		dw := Worker{
			ClientID: d.string(), SessionID: d.string(), NodeID: d.string(),
			AdvertiseURL: d.string(), Namespaces: d.strings(), Headroom: d.varint(),
			LeaseExpiry: d.varint(), Degraded: d.bool(), RegisteredAt: d.varint(),
			LastHeartbeat: d.varint(), Draining: d.bool(), Revoked: d.bool(),
		}
		w := st.workers.edit(dw.ClientID)
		*w = dw
		if w.AdvertiseURL != "" {
			st.byURL[w.AdvertiseURL] = w.ClientID
		}
	}
	for n := d.count(7); n > 0 && d.err == nil; n-- {
		p := Placement{Key: d.key(), Owner: d.string(), OwnerSession: d.string(),
			Generation: d.uvarint(), PlacedAt: d.varint()}
		if w, ok := st.workers.get(p.Owner); ok {
			p.Owner = w.ClientID // one copy of each client id string
		}
		st.placements.set(p)
	}
	for n := d.count(4); n > 0 && d.err == nil; n-- {
		dr := Drain{ClientID: d.string(), Deadline: d.varint(), Cordon: d.bool(), SetAt: d.varint()}
		st.drains[dr.ClientID] = dr
	}
	if v >= 5 {
		for n := d.count(4); n > 0 && d.err == nil; n-- {
			dr := Drain{NodeID: d.string(), Deadline: d.varint(), Cordon: d.bool(), SetAt: d.varint()}
			st.nodeDrains[dr.NodeID] = dr
		}
	}
	if v >= 6 {
		st.clock = d.varint()
		for _, id := range d.strings() {
			if _, ok := st.workers.get(id); !ok {
				d.fail() // names a worker the snapshot does not hold
				break
			}
			st.workers.edit(id).Unconfirmed = true
		}
	}
	if v >= 7 {
		readHostnames(&d, &st)
	}
	if err := d.done(); err != nil {
		return state{}, fmt.Errorf("%w: %w", ErrSnapshot, err)
	}
	st.placements.commit()
	if v < 6 {
		st.clock = clockOf(&st)
	}
	return st, nil
}

// clockOf is the clock of a state restored from a snapshot older than
// version 6, which did not record it: the latest time its records carry.
func clockOf(st *state) int64 {
	t := st.coldStart
	st.placements.each(func(p Placement) { t = max(t, p.PlacedAt) })
	for _, w := range st.workers.all() {
		t = max(t, w.LastHeartbeat, w.RegisteredAt)
	}
	for _, drains := range []map[string]Drain{st.drains, st.nodeDrains} {
		for _, d := range drains {
			t = max(t, d.SetAt)
		}
	}
	return t
}
