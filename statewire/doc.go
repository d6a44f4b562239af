package statewire

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sync"

	"github.com/pinnedd/pinnedd/statewire/wire"
)

// Path addresses a value in the document: object keys as strings, array
// indexes as ints.
type Path = wire.Path

// Doc is an instance's state document: a JSON tree that every attached
// stream mirrors. Each Update becomes one ops frame with the next version,
// so a stream sees all of an update or none of it.
type Doc struct {
	mu      sync.Mutex
	root    any
	version uint64
	epoch   string
	subs    map[*subscriber]struct{}
	buffer  int
}

// subscriber is one attached stream: frames queue in a bounded channel;
// one that fills up is cut loose (lagged closes) rather than slowing the
// instance down.
type subscriber struct {
	frames chan []byte
	lagged chan struct{}
}

func newDoc(initial any, buffer int) (*Doc, error) {
	root, err := normalize(initial)
	if err != nil {
		return nil, err
	}
	if root == nil {
		root = map[string]any{}
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	return &Doc{root: root, epoch: hex.EncodeToString(b[:]), subs: map[*subscriber]struct{}{}, buffer: buffer}, nil
}

// normalize turns any JSON-encodable Go value into the generic tree form.
func normalize(v any) (any, error) {
	if v == nil {
		return nil, nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("state value: %w", err)
	}
	var out any
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, fmt.Errorf("state value: %w", err)
	}
	return out, nil
}

// Tx is a batch of changes inside Doc.Update. Changes apply at once (later
// reads in the same Tx see them) and go out together when Update returns.
type Tx struct {
	d   *Doc
	ops []wire.Op
}

// Set sets path to v (any JSON-encodable value), creating missing objects
// on the way.
func (tx *Tx) Set(path Path, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("set %v: %w", path, err)
	}
	return tx.apply(wire.Op{Op: wire.OpSet, Path: clonePath(path), Value: b})
}

// Delete removes path (an array element is spliced out).
func (tx *Tx) Delete(path Path) error {
	return tx.apply(wire.Op{Op: wire.OpDelete, Path: clonePath(path)})
}

// AppendText appends text to the string at path (a missing one starts
// empty). It costs the appended bytes on the wire, not the whole string.
func (tx *Tx) AppendText(path Path, text string) error {
	return tx.apply(wire.Op{Op: wire.OpAppend, Path: clonePath(path), Text: text})
}

// Lookup returns the value at path in its generic form. The value is the
// document's own: read it, never change it.
func (tx *Tx) Lookup(path Path) (any, bool) { return wire.Lookup(tx.d.root, path) }

// Get decodes the value at path into v; false if there is none.
func (tx *Tx) Get(path Path, v any) (bool, error) {
	cur, ok := wire.Lookup(tx.d.root, path)
	if !ok {
		return false, nil
	}
	b, err := json.Marshal(cur)
	if err != nil {
		return true, fmt.Errorf("get %v: %w", path, err)
	}
	return true, json.Unmarshal(b, v)
}

// Raw returns the value at path as JSON, or nil if there is none.
func (tx *Tx) Raw(path Path) (json.RawMessage, error) {
	cur, ok := wire.Lookup(tx.d.root, path)
	if !ok {
		return nil, nil
	}
	b, err := json.Marshal(cur)
	if err != nil {
		return nil, fmt.Errorf("get %v: %w", path, err)
	}
	return b, nil
}

func (tx *Tx) apply(op wire.Op) error {
	root, err := wire.Apply(tx.d.root, op)
	if err != nil {
		return err
	}
	tx.d.root = root
	tx.ops = append(tx.ops, op)
	return nil
}

func clonePath(p Path) Path { return append(Path(nil), p...) }

// Update runs fn with the document locked and publishes the changes it
// made as one frame. Changes made before fn returns an error are kept and
// published too: the document never differs from what streams were told.
func (d *Doc) Update(fn func(tx *Tx) error) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	tx := &Tx{d: d}
	err := fn(tx)
	if len(tx.ops) > 0 {
		d.version++
		d.publishLocked(wire.Frame{Type: wire.TypeOps, Version: d.version, Ops: tx.ops})
	}
	return err
}

// View runs fn with the document locked, for reading.
func (d *Doc) View(fn func(tx *Tx) error) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return fn(&Tx{d: d})
}

// Set, Delete and AppendText are one-op Updates.
func (d *Doc) Set(path Path, v any) error {
	return d.Update(func(tx *Tx) error { return tx.Set(path, v) })
}

// Delete is a one-op Update.
func (d *Doc) Delete(path Path) error {
	return d.Update(func(tx *Tx) error { return tx.Delete(path) })
}

// AppendText is a one-op Update.
func (d *Doc) AppendText(path Path, text string) error {
	return d.Update(func(tx *Tx) error { return tx.AppendText(path, text) })
}

// Snapshot returns the whole document as JSON and its version.
func (d *Doc) Snapshot() (json.RawMessage, uint64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	b, err := json.Marshal(d.root)
	return b, d.version, err
}

// Subscribers is the number of attached streams.
func (d *Doc) Subscribers() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.subs)
}

func (d *Doc) publishLocked(f wire.Frame) {
	if len(d.subs) == 0 {
		return
	}
	b, err := json.Marshal(f)
	if err != nil {
		return // ops hold only JSON we produced
	}
	b = append(b, '\n')
	for s := range d.subs {
		select {
		case s.frames <- b:
		default:
			// Never block the instance on a slow reader: cut it loose,
			// it reconnects and starts over from a snapshot.
			delete(d.subs, s)
			close(s.lagged)
		}
	}
}

// subscribe returns the snapshot frame and a subscriber that receives every
// later frame: both are taken under one lock, so nothing falls between.
func (d *Doc) subscribe() ([]byte, *subscriber, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	state, err := json.Marshal(d.root)
	if err != nil {
		return nil, nil, fmt.Errorf("snapshot: %w", err)
	}
	b, err := json.Marshal(wire.Frame{Type: wire.TypeSnapshot, Epoch: d.epoch, Version: d.version, State: state})
	if err != nil {
		return nil, nil, fmt.Errorf("snapshot: %w", err)
	}
	s := &subscriber{frames: make(chan []byte, d.buffer), lagged: make(chan struct{})}
	d.subs[s] = struct{}{}
	return append(b, '\n'), s, nil
}

func (d *Doc) unsubscribe(s *subscriber) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.subs, s)
}
