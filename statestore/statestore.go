package statestore

import (
	"context"
	"errors"
	"fmt"
)

// Sentinel errors. Implementations wrap them with %w; callers match them with errors.Is.
var (
	// ErrFenced: the store has seen a newer placement generation for the instance. Nothing was
	// changed; the caller is no longer the owner and must stop.
	ErrFenced = errors.New("statestore: fenced by a newer generation")
	// ErrClosed: the Store was closed.
	ErrClosed = errors.New("statestore: closed")
	// ErrInvalid: the input breaks a rule or a limit (see Validate). Nothing was changed.
	ErrInvalid = errors.New("statestore: invalid input")
)

// InstanceKey addresses an instance.
type InstanceKey struct{ Namespace, ID string }

func (k InstanceKey) String() string { return k.Namespace + "/" + k.ID }

// Less orders keys by namespace, then id, comparing bytes; ListMarked uses this order.
func (k InstanceKey) Less(o InstanceKey) bool {
	if k.Namespace != o.Namespace {
		return k.Namespace < o.Namespace
	}
	return k.ID < o.ID
}

// TrayKey names a tray within an instance, e.g. {"log", "~"} or {"client_commands", clientID}.
type TrayKey struct{ NS, ID string }

func (k TrayKey) String() string { return k.NS + ":" + k.ID }

// Less orders tray keys by NS, then ID, comparing bytes; Load returns trays in this order.
func (k TrayKey) Less(o TrayKey) bool {
	if k.NS != o.NS {
		return k.NS < o.NS
	}
	return k.ID < o.ID
}

// Item is one work item of a tray.
type Item struct {
	// Seq is assigned by the store: strictly increasing within an instance (hence within each
	// tray), never reused, not even after the tray is deleted and created again.
	Seq     int64
	Payload []byte
	// Applied records that the handler declared the batch holding this item applied, so a
	// redelivery after a crash comes back with resume=true.
	Applied bool
}

// Tray is the durable content of one tray. A tray exists while it holds at least one field or
// one item; a Commit that leaves it empty removes it, as DeleteTray does.
type Tray struct {
	Key    TrayKey
	Fields map[string][]byte // never nil
	Items  []Item            // ascending Seq
	// Marked is derived on every write: the tray holds at least one work item.
	Marked bool
}

// Mutation is one step of a Commit. The set is sealed: SetField, AppendItems, MarkApplied,
// RemoveItems and DeleteTray.
type Mutation interface {
	tray() TrayKey
	sealed()
}

// SetField sets a persistent field; a nil Value deletes it (an empty non-nil Value is a value).
type SetField struct {
	Tray  TrayKey
	Name  string
	Value []byte
}

// AppendItems appends work items; Commit reports the assigned seqs.
type AppendItems struct {
	Tray     TrayKey
	Payloads [][]byte
}

// MarkApplied sets Applied on the tray's items with Seq <= UpTo.
type MarkApplied struct {
	Tray TrayKey
	UpTo int64
}

// RemoveItems drops the tray's items with Seq <= UpTo (the work is settled).
type RemoveItems struct {
	Tray TrayKey
	UpTo int64
}

// DeleteTray removes the tray's fields and items.
type DeleteTray struct{ Tray TrayKey }

func (m SetField) tray() TrayKey    { return m.Tray }
func (m AppendItems) tray() TrayKey { return m.Tray }
func (m MarkApplied) tray() TrayKey { return m.Tray }
func (m RemoveItems) tray() TrayKey { return m.Tray }
func (m DeleteTray) tray() TrayKey  { return m.Tray }

// TrayOf returns the tray a mutation acts on.
func TrayOf(m Mutation) TrayKey { return m.tray() }

func (SetField) sealed()    {}
func (AppendItems) sealed() {}
func (MarkApplied) sealed() {}
func (RemoveItems) sealed() {}
func (DeleteTray) sealed()  {}

// CommitResult reports what the store assigned.
type CommitResult struct {
	// Seqs holds, per AppendItems mutation in the order given, the seqs of its payloads.
	Seqs [][]int64
}

// Store is durable instance state with fenced writes. Implementations are safe for concurrent
// use. Every method fails with ErrClosed after Close, and with ErrInvalid (changing nothing) on
// input that breaks the rules checked by Validate.
type Store interface {
	// Setup creates or migrates the store's schema. It is idempotent and safe when several
	// processes call it at once.
	Setup(ctx context.Context) error
	// Fence raises the instance's generation to gen, or fails with ErrFenced if a newer one was
	// seen. An equal generation is accepted.
	Fence(ctx context.Context, inst InstanceKey, gen uint64) error
	// Load fences like Fence (a stale reader must not act on what it reads) and returns the
	// instance's trays sorted by key.
	Load(ctx context.Context, inst InstanceKey, gen uint64) ([]Tray, error)
	// Commit fences like Fence and applies muts atomically and in order. On any error nothing
	// is applied.
	Commit(ctx context.Context, inst InstanceKey, gen uint64, muts []Mutation) (CommitResult, error)
	// ListMarked returns up to limit instances holding at least one marked tray, in key order,
	// strictly after `after` (the zero key starts from the beginning).
	ListMarked(ctx context.Context, after InstanceKey, limit int) ([]InstanceKey, error)
	// Generation returns the newest generation seen for the instance, 0 if none (also once
	// CollectFences dropped its fence).
	Generation(ctx context.Context, inst InstanceKey) (uint64, error)
	// CollectFences drops the fences that fence nothing: see the package doc, "Collecting
	// fences". below is a generation no placement the caller does not list in live can still
	// hold at or above it unless it was granted later (the directory's newest generation + 1);
	// live lists every placement the directory holds. It returns how many fences it dropped; an
	// implementation may drop only some of the collectable ones per call (pgstore: a page), so
	// a caller repeats the call while it drops any.
	CollectFences(ctx context.Context, below uint64, live []Live) (int, error)
	// Close releases resources; later calls fail with ErrClosed. Closing twice is harmless.
	Close() error
}

// Live is a placement the directory holds: its owner may still activate the instance (Load) and
// write under Generation, so CollectFences must neither drop its fence nor raise the floor past a
// generation it has not fenced yet.
type Live struct {
	Inst       InstanceKey
	Generation uint64
}

// CollectFloor is the floor CollectFences raises to: below, lowered to the generation of every
// live placement whose instance has no fence yet (its owner has not loaded it: its Load must
// still pass). hasFence reports whether the store holds a fence for an instance. memstore and
// boltstore compute the floor here; pgstore states the same rule in SQL (collectFloorSQL,
// lockCollectableSQL), inside the collecting transaction: change them together (the
// conformance suite's collection cases hold every store to the rule).
func CollectFloor(below uint64, live []Live, hasFence func(InstanceKey) bool) uint64 {
	floor := below
	for _, l := range live {
		if l.Generation < floor && !hasFence(l.Inst) {
			floor = l.Generation
		}
	}
	return floor
}

// Collectable reports whether CollectFences may drop an instance's fence: below the floor, not
// live, holding no tray, and never having handed out a seq (so no seq can be reused either).
func Collectable(gen uint64, lastSeq int64, trays bool, isLive bool, floor uint64) bool {
	return gen < floor && lastSeq == 0 && !trays && !isLive
}

// FencedError builds the error a store returns when gen is older than current.
func FencedError(inst InstanceKey, gen, current uint64) error {
	return fmt.Errorf("%w: instance %s generation %d, store has %d", ErrFenced, inst, gen, current)
}
