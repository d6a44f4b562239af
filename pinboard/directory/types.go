package directory

import (
	"cmp"
	"errors"
	"slices"
)

// Sentinel errors. Apply never returns them (it answers with a Result); they
// come from decoding commands, results and snapshots.
var (
	ErrMalformed      = errors.New("directory: malformed encoding")
	ErrVersion        = errors.New("directory: unsupported format version")
	ErrUnknownCommand = errors.New("directory: unknown command type")
	ErrNestedBatch    = errors.New("directory: batch inside a batch")
	ErrSnapshot       = errors.New("directory: corrupt snapshot")
)

const (
	// DefaultWorkerRetention is how long after its lease lapsed a worker
	// stays known (for drains and the advertise URL check) before GC
	// forgets it, when the GC command does not say otherwise.
	DefaultWorkerRetention int64 = 60 * 60 * 1000
	// DrainRetention is how long past its deadline a timed drain stays in
	// force: a timed drain expires on its own after 7 days.
	DrainRetention int64 = 7 * 24 * 60 * 60 * 1000
)

// Key addresses one instance: the (env, namespace, id) a placement is for.
type Key struct {
	Env       string
	Namespace string
	ID        string
}

// Compare orders keys by env, namespace, then id; snapshots and listings
// use it so their order never depends on map iteration.
func (k Key) Compare(o Key) int {
	if c := cmp.Compare(k.Env, o.Env); c != 0 {
		return c
	}
	if c := cmp.Compare(k.Namespace, o.Namespace); c != 0 {
		return c
	}
	return cmp.Compare(k.ID, o.ID)
}

func (k Key) String() string {
	if k.Env == "" {
		return k.Namespace + "/" + k.ID
	}
	return k.Env + ":" + k.Namespace + "/" + k.ID
}

// Worker is one registered pinnedd worker process. ClientID is minted per
// process start, SessionID per registration; SessionID is empty once the
// worker deregistered. Namespaces is shared by every copy the Machine
// hands out (a registration replaces the slice, nothing modifies it in
// place), so the forwarding path reads a worker without copying it:
// callers must not modify it either.
type Worker struct {
	ClientID     string
	SessionID    string
	NodeID       string
	AdvertiseURL string
	Namespaces   []string
	// Routes replaces Namespaces in hostname-aware mode (hostnames.go);
	// shared like Namespaces, replaced and never modified in place.
	Routes      []Route
	Headroom    int64 // selection weight; each grant subtracts one until the next heartbeat
	LeaseExpiry int64 // unix ms; the worker serves while now <= LeaseExpiry
	Degraded    bool  // the last challenge probe failed
	Draining    bool  // the worker reported draining by itself
	Revoked     bool  // the session lost an id to a lapse: it must re-register
	// Unconfirmed: a new leader found it on the node that led before the
	// election (RenewLeases): it takes no new placements until its own
	// heartbeat or registration is applied.
	Unconfirmed   bool
	RegisteredAt  int64 // unix ms of the current session's registration
	LastHeartbeat int64 // unix ms
}

// Registered reports whether the worker holds a session (it has not
// deregistered).
func (w Worker) Registered() bool { return w.SessionID != "" }

// Live reports whether the worker holds a session whose lease has not lapsed
// at now. It is the directory's view; the worker enforces its own copy of the
// expiry, which is never later than this one.
func (w Worker) Live(now int64) bool { return w.SessionID != "" && now <= w.LeaseExpiry }

// Serves reports whether the worker hosts namespace ns.
func (w Worker) Serves(ns string) bool { return slices.Contains(w.Namespaces, ns) }

// Placement records which worker session serves a key. Generation is the
// fencing token the owner passes with every durable write: strictly
// increasing across grants, and never below the grant time in ms × 1000
// (see the package doc).
type Placement struct {
	Key          Key
	Owner        string // client id
	OwnerSession string
	Generation   uint64
	PlacedAt     int64 // unix ms
	// Hostname-aware mode: the hostname it was placed through, and the end
	// of a wind_down takeover's fence once another hostname asked for it
	// (unix ms; 0: none).
	Hostname   string
	FenceUntil int64
}

// Drain is an operator drain of one client id (ClientID set: that worker
// process) or of one node id (NodeID set: every worker registered with
// it, whatever its client id). A cordon has no deadline and holds until
// undrained; a timed drain expires DrainRetention past Deadline.
type Drain struct {
	ClientID string
	NodeID   string
	Deadline int64 // unix ms; 0 with Cordon
	Cordon   bool
	SetAt    int64 // unix ms
}

// Active reports whether the drain is still in force at now.
func (d Drain) Active(now int64) bool {
	return d.Cordon || now <= d.Deadline+DrainRetention
}

// stricter reports whether d binds harder than o: a timed drain over a
// cordon (it evicts and caps the lease), the earlier of two deadlines.
func (d Drain) stricter(o Drain) bool {
	return !d.Cordon && (o.Cordon || d.Deadline < o.Deadline)
}

// capLease applies the drain to a lease extension: acks stop extending the
// lease past a timed drain's deadline.
func (d Drain) capLease(exp, now int64) int64 {
	if !d.Cordon && d.Active(now) && exp > d.Deadline {
		return d.Deadline
	}
	return exp
}
