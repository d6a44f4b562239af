package sdk

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pinnedd/pinnedd/plugins/proto"
	"github.com/pinnedd/pinnedd/statestore"
)

// Errors of durable state.
var (
	// ErrFenced: a newer activation of this id exists (it was placed
	// elsewhere); this instance's writes are rejected and it stops.
	ErrFenced = errors.New("fenced: a newer activation of this instance exists")

	// ErrStateUnavailable: a commit failed (the state store is down or did
	// not answer in time). It may still have been stored, so an answer
	// built on its writes has an unknown outcome (pinnedd's front door says
	// 504, "may have run"), never "nothing happened". The instance's
	// memory may now hold writes the store never took: every write still
	// queued is dropped, every later one refused, and the instance is
	// reset from the store (see the package doc, "Output gates").
	ErrStateUnavailable = errors.New("state store unavailable")
)

// TrayKey names a tray within its instance, e.g. {"log", "~"}.
type TrayKey struct{ NS, ID string }

// Item is one unit of durable work in a tray. Applied means a handler
// declared the batch applied before the process stopped: it comes back with
// Run.Resume set.
type Item struct {
	Seq     int64
	Payload json.RawMessage
	Applied bool
}

// state is an instance's durable state: its trays, cached in memory, and
// the queue of writes on their way to pinnedd's store. Writes apply to the
// cache at once and reach the store in order, batched; Durable and the
// output gate wait for the frontier.
type state struct {
	inst  *Instance
	store proto.StoreClient // nil: no store, state lives in memory only
	host  Host

	mu    sync.Mutex
	trays map[TrayKey]*Tray
	queue []queued
	// enq counts the writes queued so far and done those committed; both
	// move under mu only, and are atomic so the output gate can tell
	// "nothing in flight" (done == enq) without the lock.
	enq      atomic.Uint64
	done     atomic.Uint64
	err      error // sticky: ErrFenced, or ErrStateUnavailable (reset)
	flushing bool
	changed  chan struct{} // closed and replaced whenever done or err moves
}

type queued struct {
	m    *proto.StoreMutation
	seqs *[]int64 // AppendItems: where the store's seqs go
	tray *Tray    // AppendItems: whose cache gets the items once stored
}

// storedLocked puts an append's items, numbered, in its tray's cache: once
// they are stored, whether or not the Append that queued them still waits
// (it may have given up on a failed commit that a retry then stored).
func (q queued) storedLocked() {
	if q.tray == nil {
		return
	}
	raw := q.m.GetAppendItems().GetPayloads()
	for i, s := range *q.seqs {
		if i < len(raw) {
			q.tray.items = append(q.tray.items, Item{Seq: s, Payload: raw[i]})
		}
	}
}

func newState(inst *Instance, store proto.StoreClient, host Host, loaded []*proto.TrayData) *state {
	st := &state{inst: inst, store: store, host: host, trays: map[TrayKey]*Tray{}, changed: make(chan struct{})}
	for _, td := range loaded {
		t := st.tray(TrayKey{td.TrayNs, td.TrayId})
		for k, v := range td.Fields {
			t.fields[k] = v
		}
		for _, it := range td.Items {
			t.items = append(t.items, Item{Seq: it.Seq, Payload: it.Payload, Applied: it.Applied})
		}
	}
	return st
}

// tray returns the cached tray, creating an empty one. Caller holds no lock
// or st.mu (it only touches the map under st.mu when called by Tray).
func (st *state) tray(k TrayKey) *Tray {
	t := st.trays[k]
	if t == nil {
		t = &Tray{st: st, key: k, fields: map[string][]byte{}}
		st.trays[k] = t
	}
	return t
}

// enqueue adds a write; the flusher takes it to the store.
func (st *state) enqueueLocked(q queued) {
	st.queue = append(st.queue, q)
	st.enq.Add(1)
	if st.store == nil {
		st.done.Store(st.enq.Load())
		st.queue = st.queue[:0]
		q.storedLocked()
		return
	}
	if !st.flushing {
		st.flushing = true
		go st.flush()
	}
}

// flush commits queued writes in batches until the queue is empty. A
// fence stops everything; any other failure too, and resets the instance:
// the failed commit may or may not have been stored, so the memory that
// holds its writes can no longer be trusted (see Instance.reset).
func (st *state) flush() {
	for {
		st.mu.Lock()
		if len(st.queue) == 0 || st.err != nil {
			st.flushing = false
			st.mu.Unlock()
			return
		}
		batch := slices.Clone(st.queue[:batchLen(st.queue)])
		st.mu.Unlock()

		req := &proto.StoreCommitRequest{Namespace: st.inst.ns, Id: st.inst.id, Generation: st.inst.generation}
		for _, q := range batch {
			req.Mutations = append(req.Mutations, q.m)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		resp, err := st.store.Commit(ctx, req)
		cancel()

		var stored []*Tray
		st.mu.Lock()
		switch {
		case err == nil:
			i := 0
			for _, q := range batch {
				if q.seqs != nil && i < len(resp.Seqs) {
					*q.seqs = resp.Seqs[i].Seqs
				}
				if q.m.GetAppendItems() != nil {
					i++
				}
				if q.tray != nil {
					q.storedLocked()
					stored = append(stored, q.tray)
				}
			}
			st.queue = st.queue[len(batch):]
			st.done.Add(uint64(len(batch)))
		case status.Code(err) == codes.Aborted:
			st.err = fmt.Errorf("%w (%v)", ErrFenced, status.Convert(err).Message())
		case status.Code(err) == codes.InvalidArgument:
			// A write the store will never take: drop it rather than
			// block every later one, and say so loudly.
			st.inst.logger.Error("state write rejected; dropped", "err", err)
			st.queue = st.queue[len(batch):]
			st.done.Add(uint64(len(batch)))
		default:
			st.err = fmt.Errorf("%w: %v", ErrStateUnavailable, err)
			st.inst.logger.Warn("state write failed; the instance is reset from the store", "err", err,
				"dropped_writes", len(st.queue))
		}
		failed := st.err
		if failed != nil {
			// Nothing more of this activation reaches the store: done
			// stays short of enq, so every output held behind the
			// dropped writes fails.
			st.queue = nil
			if !errors.Is(failed, ErrFenced) {
				// Out of the runtime's hands before a held answer says
				// 504: a request sent after it reaches the fresh
				// activation, never this one.
				st.mu.Unlock()
				st.inst.reset()
				st.mu.Lock()
			}
		}
		close(st.changed)
		st.changed = make(chan struct{})
		st.mu.Unlock()
		for _, t := range stored {
			st.kick(t)
		}
		if errors.Is(failed, ErrFenced) {
			st.inst.fenced()
		}
		if failed != nil {
			return
		}
	}
}

// maxBatchBytes is what one Commit carries at most: the store's limit,
// which plugins.MaxCommitMessage makes room for on the wire.
const maxBatchBytes = statestore.MaxCommitBytes

// batchLen is how many queued writes fit one Commit within the store's
// limits (mutations, appended items, bytes); at least one.
func batchLen(q []queued) int {
	items, bytes := 0, 0
	for i, w := range q {
		n, b := 0, 0
		switch op := w.m.Op.(type) {
		case *proto.StoreMutation_SetField:
			b = len(op.SetField.Value)
		case *proto.StoreMutation_AppendItems:
			n = len(op.AppendItems.Payloads)
			for _, p := range op.AppendItems.Payloads {
				b += len(p)
			}
		}
		if i > 0 && (i+1 > statestore.MaxMutations || items+n > statestore.MaxCommitItems || bytes+b > maxBatchBytes) {
			return i
		}
		items, bytes = items+n, bytes+b
	}
	return len(q)
}

// ErrInvalidWrite: a write the store would refuse (a name empty, too long,
// not UTF-8 or holding a NUL byte; a value, or an Append, over its limit).
// It is returned at once and nothing was queued.
var ErrInvalidWrite = errors.New("invalid state write")

// Limits of durable state: the state store's own (package statestore), the
// same on every store. A write that breaks one fails at once with
// ErrInvalidWrite.
const (
	// MaxTrayNameLen bounds a tray's namespace and its id, in bytes.
	MaxTrayNameLen = statestore.MaxTrayNameLen
	// MaxFieldNameLen bounds a field name, in bytes.
	MaxFieldNameLen = statestore.MaxFieldNameLen
	// MaxValueLen bounds a field's value and a work item's payload, in
	// bytes of their JSON encoding.
	MaxValueLen = statestore.MaxValueLen
	// MaxAppendItems bounds the payloads of one Append.
	MaxAppendItems = statestore.MaxCommitItems
	// MaxAppendBytes bounds the sum of one Append's payloads (JSON bytes):
	// one Append is one atomic write.
	MaxAppendBytes = statestore.MaxCommitBytes
)

func (t *Tray) check(name string, values ...[]byte) error {
	if err := statestore.ValidateTray(statestore.TrayKey{NS: t.key.NS, ID: t.key.ID}); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidWrite, err)
	}
	if name != "" {
		if err := statestore.ValidateName("field name", name, statestore.MaxFieldNameLen); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidWrite, err)
		}
	}
	if len(values) > MaxAppendItems {
		return fmt.Errorf("%w: %d items in one append (max %d)", ErrInvalidWrite, len(values), MaxAppendItems)
	}
	total := 0
	for _, v := range values {
		if len(v) > MaxValueLen {
			return fmt.Errorf("%w: %d bytes (max %d)", ErrInvalidWrite, len(v), MaxValueLen)
		}
		total += len(v)
	}
	// The store would refuse it whole, after it was queued.
	if total > MaxAppendBytes {
		return fmt.Errorf("%w: %d bytes in one append (max %d)", ErrInvalidWrite, total, MaxAppendBytes)
	}
	return nil
}

// durable waits until every write queued before the call is committed, or
// a commit fails (ErrFenced, ErrStateUnavailable: the caller learns of an
// outage within one store deadline instead of waiting it out).
func (st *state) durable(ctx context.Context) error {
	return st.durableUpTo(ctx, st.enq.Load())
}

// durableUpTo waits until the first target writes ever queued are
// committed (nil), or a commit failed first (its sticky error), or ctx
// ends. Once writes are dropped, done never reaches a target past them.
func (st *state) durableUpTo(ctx context.Context, target uint64) error {
	if st.done.Load() >= target {
		return nil
	}
	st.mu.Lock()
	for st.done.Load() < target && st.err == nil {
		ch := st.changed
		st.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("waiting for durable state: %w", ctx.Err())
		}
		st.mu.Lock()
	}
	var err error
	if st.done.Load() < target {
		err = st.err
	}
	st.mu.Unlock()
	return err
}

// Tray is a durable slot of an instance: persistent fields and a queue of
// work items. Its methods are safe for concurrent use.
type Tray struct {
	st     *state
	key    TrayKey
	fields map[string][]byte
	items  []Item

	running bool // a handler run is in progress
}

// Tray returns the instance's tray (ns, id); it exists durably once
// something is written to it.
func (i *Instance) Tray(ns, id string) *Tray {
	i.state.mu.Lock()
	defer i.state.mu.Unlock()
	return i.state.tray(TrayKey{ns, id})
}

// Trays lists the instance's trays in namespace ns ("" for all), sorted:
// what the previous activation left, e.g. marked work about to be
// redelivered.
func (i *Instance) Trays(ns string) []TrayKey {
	i.state.mu.Lock()
	defer i.state.mu.Unlock()
	var out []TrayKey
	for k, t := range i.state.trays {
		if (ns == "" || k.NS == ns) && (len(t.fields) > 0 || len(t.items) > 0) {
			out = append(out, k)
		}
	}
	slices.SortFunc(out, func(a, b TrayKey) int {
		if a.NS != b.NS {
			return compare(a.NS, b.NS)
		}
		return compare(a.ID, b.ID)
	})
	return out
}

// Durable waits until every write this instance made so far is committed
// to pinnedd's store (the durability frontier). Acknowledge a client only
// after it returns nil.
func (i *Instance) Durable(ctx context.Context) error { return i.state.durable(ctx) }

// Key is the tray's name.
func (t *Tray) Key() TrayKey { return t.key }

// Get decodes field name into v; false if the field is not set.
func (t *Tray) Get(name string, v any) (bool, error) {
	t.st.mu.Lock()
	b, ok := t.fields[name]
	t.st.mu.Unlock()
	if !ok {
		return false, nil
	}
	return true, json.Unmarshal(b, v)
}

// Set writes field name (JSON-encoded) through to the store. The cache
// changes at once; the write is durable once Instance.Durable returns.
func (t *Tray) Set(name string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("tray %s:%s field %s: %w", t.key.NS, t.key.ID, name, err)
	}
	if err := t.check(name, b); err != nil {
		return err
	}
	t.st.mu.Lock()
	defer t.st.mu.Unlock()
	if t.st.err != nil {
		return t.st.err
	}
	t.fields[name] = b
	t.st.enqueueLocked(queued{m: &proto.StoreMutation{TrayNs: t.key.NS, TrayId: t.key.ID,
		Op: &proto.StoreMutation_SetField{SetField: &proto.SetFieldOp{Name: name, Value: b}}}})
	return nil
}

// Delete removes field name.
func (t *Tray) Delete(name string) {
	t.st.mu.Lock()
	defer t.st.mu.Unlock()
	if _, ok := t.fields[name]; !ok || t.st.err != nil {
		return
	}
	delete(t.fields, name)
	t.st.enqueueLocked(queued{m: &proto.StoreMutation{TrayNs: t.key.NS, TrayId: t.key.ID,
		Op: &proto.StoreMutation_SetField{SetField: &proto.SetFieldOp{Name: name}}}})
}

// Fields lists the names of the tray's fields, sorted. The whole tray is in
// memory from activation on (what the previous activation left, and every
// Set and Delete since), so this reads no store.
func (t *Tray) Fields() []string {
	t.st.mu.Lock()
	defer t.st.mu.Unlock()
	names := make([]string, 0, len(t.fields))
	for name := range t.fields {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// Items returns the tray's pending work items.
func (t *Tray) Items() []Item {
	t.st.mu.Lock()
	defer t.st.mu.Unlock()
	return slices.Clone(t.items)
}

// Marked reports whether the tray holds unfinished work.
func (t *Tray) Marked() bool {
	t.st.mu.Lock()
	defer t.st.mu.Unlock()
	return len(t.items) > 0
}

// Append adds work items (each JSON-encoded) and waits until they are
// durable: an item Append returned for survives any crash and is delivered
// to the tray's handler, again after a crash, until a run settles it.
func (t *Tray) Append(ctx context.Context, payloads ...any) ([]int64, error) {
	raw := make([][]byte, len(payloads))
	for i, p := range payloads {
		b, err := json.Marshal(p)
		if err != nil {
			return nil, fmt.Errorf("tray %s:%s item: %w", t.key.NS, t.key.ID, err)
		}
		raw[i] = b
	}
	if err := t.check("", raw...); err != nil {
		return nil, err
	}
	var seqs []int64
	t.st.mu.Lock()
	if t.st.err != nil {
		t.st.mu.Unlock()
		return nil, t.st.err
	}
	if t.st.store == nil {
		// Memory only: number the items ourselves.
		next := int64(1)
		if n := len(t.items); n > 0 {
			next = t.items[n-1].Seq + 1
		}
		for i := range raw {
			seqs = append(seqs, next+int64(i))
		}
	}
	t.st.enqueueLocked(queued{m: &proto.StoreMutation{TrayNs: t.key.NS, TrayId: t.key.ID,
		Op: &proto.StoreMutation_AppendItems{AppendItems: &proto.AppendItemsOp{Payloads: raw}}}, seqs: &seqs, tray: t})
	t.st.mu.Unlock()
	if err := t.st.durable(ctx); err != nil {
		return nil, err
	}
	t.st.kick(t) // memory only; the flusher kicks what it stored
	t.st.mu.Lock()
	out := slices.Clone(seqs)
	t.st.mu.Unlock()
	return out, nil
}

// markApplied and settle are the run's bookkeeping.
func (t *Tray) markApplied(upTo int64) {
	t.st.mu.Lock()
	defer t.st.mu.Unlock()
	for i := range t.items {
		if t.items[i].Seq <= upTo {
			t.items[i].Applied = true
		}
	}
	t.st.enqueueLocked(queued{m: &proto.StoreMutation{TrayNs: t.key.NS, TrayId: t.key.ID,
		Op: &proto.StoreMutation_MarkAppliedUpTo{MarkAppliedUpTo: upTo}}})
}

// settle drops the items a run finished; a tray left with no items and no
// fields deletes itself.
func (t *Tray) settle(upTo int64) {
	t.st.mu.Lock()
	defer t.st.mu.Unlock()
	t.items = slices.DeleteFunc(t.items, func(it Item) bool { return it.Seq <= upTo })
	t.st.enqueueLocked(queued{m: &proto.StoreMutation{TrayNs: t.key.NS, TrayId: t.key.ID,
		Op: &proto.StoreMutation_RemoveItemsUpTo{RemoveItemsUpTo: upTo}}})
	if len(t.items) == 0 && len(t.fields) == 0 {
		t.st.enqueueLocked(queued{m: &proto.StoreMutation{TrayNs: t.key.NS, TrayId: t.key.ID,
			Op: &proto.StoreMutation_DeleteTray{DeleteTray: true}}})
	}
}

// Run is one delivery of a tray's pending items to its handler.
type Run struct {
	// Instance is the activation the run belongs to (its context, its
	// other trays, its logger).
	Instance *Instance
	Tray     *Tray
	Items    []Item
	Resume   bool // the batch was declared applied before a crash: redelivered
}

// Applied declares the batch applied, durably: if the process dies after
// this returns, the batch is redelivered with Resume set.
func (r *Run) Applied(ctx context.Context) error {
	if len(r.Items) == 0 {
		return nil
	}
	r.Tray.markApplied(r.Items[len(r.Items)-1].Seq)
	return r.Tray.st.durable(ctx)
}

// TrayHandler executes a tray's work. Returning nil settles the batch (and
// deletes the tray when it holds nothing else); an error leaves it marked,
// to be redelivered on the next activation.
type TrayHandler func(ctx context.Context, run *Run) error

// kick starts a run of t if its namespace has a handler and none is going.
func (st *state) kick(t *Tray) {
	h := st.host.Trays[t.key.NS]
	if h == nil {
		return
	}
	st.mu.Lock()
	if t.running || len(t.items) == 0 {
		st.mu.Unlock()
		return
	}
	t.running = true
	st.mu.Unlock()
	st.inst.Go("tray "+t.key.NS+":"+t.key.ID, func(ctx context.Context) {
		defer func() {
			st.mu.Lock()
			t.running = false
			st.mu.Unlock()
		}()
		for ctx.Err() == nil {
			items := t.Items()
			if len(items) == 0 {
				return
			}
			run := &Run{Instance: st.inst, Tray: t, Items: items, Resume: items[0].Applied}
			if err := h(ctx, run); err != nil {
				if ctx.Err() == nil {
					st.inst.logger.Error("tray run failed; left for redelivery", "tray", t.key.NS+":"+t.key.ID, "err", err)
				}
				return
			}
			t.settle(items[len(items)-1].Seq)
			if err := st.durable(ctx); err != nil {
				return
			}
		}
	})
}

// redeliver starts runs for every marked tray with a handler (after a
// restart or a move, the work the previous activation left).
func (st *state) redeliver() {
	st.mu.Lock()
	var marked []*Tray
	for _, t := range st.trays {
		if len(t.items) > 0 {
			marked = append(marked, t)
		}
	}
	st.mu.Unlock()
	slices.SortFunc(marked, func(a, b *Tray) int {
		if a.key.NS != b.key.NS {
			return compare(a.key.NS, b.key.NS)
		}
		return compare(a.key.ID, b.key.ID)
	})
	for _, t := range marked {
		st.kick(t)
	}
}

func compare(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
