// Package sdk is what a host author imports to ship instance code as a
// pinnedd plugin. A host builds one instance per id and returns an ordinary
// http.Handler for it; pinnedd decides when instances exist (activation on
// first request, eviction when idle, drained or swapped) and the SDK runs
// them inside the plugin process.
//
//	func main() {
//		sdk.Serve(map[string]sdk.Host{
//			"/counters": {New: func(inst *sdk.Instance) (http.Handler, error) { ... }},
//		})
//	}
//
// The SDK never writes to stdout (go-plugin's handshake line owns it); logs
// go to stderr as JSON, and pinnedd re-logs them tagged with the plugin.
// Serve makes the process non-dumpable first: the secrets pinnedd gives it
// (its data socket's, the cluster-call credential) are then out of reach of
// other processes of its user (/proc/<pid>/environ, mem, ptrace).
//
// # Writing a host: an instance's life
//
// Host.New builds the instance's handler on activation. The handler may
// implement optional hooks, each a small interface found by type assertion:
// Starter (Start runs before the first request; an error fails the
// activation), WindDowner (WindDown is told the deadline of a coming
// eviction: a drain, an operator's wind-down, a hot swap; stop taking new
// work), Idler (Idle is asked before an idle eviction; true keeps the
// instance) and Stopper (Stop runs last, after the instance's context is
// cancelled and its tracked tasks (Instance.Go) returned or their grace
// passed). Long tracked work calls Instance.EvictionCheckpoint between
// steps and returns once it fails.
//
// # Durable state: trays
//
// An instance keeps what must outlive its process in trays, written
// through to pinnedd's state store. A tray belongs to one instance (trays
// of /counters/alice and /counters/bob never mix) and is named within it by
// a TrayKey:
//
//   - its namespace (TrayKey.NS) says what kind of slot it is, and picks
//     who runs its work: Host.Trays maps a tray namespace to the
//     TrayHandler that executes the items appended to its trays. Trays of a
//     namespace without a handler hold fields only.
//   - its id (TrayKey.ID) tells slots of one kind apart: one per client
//     (statewire keeps each client's commands in ("client_commands",
//     clientID)), or "~" when there is a single one.
//
// A tray is a unit of work: the items of one tray run in order, one run at
// a time, while separate trays run independently. A tray holds persistent
// fields (Tray.Set, Get, Delete; Tray.Fields lists their names) and a
// queue of work items (Tray.Append, Tray.Items). It exists durably while it
// holds a field or an item; Instance.Trays lists those of a namespace.
//
// The whole state of an instance is loaded into the plugin's memory when
// it activates, so reads (Get, Fields, Items, Trays) never reach the store;
// keep an instance's state to what it may hold in memory. Set and Delete
// change that copy at once and queue the write; queued writes reach the
// store in order, batched. A handler need not wait for them before it
// answers: the output gate holds the answer (below). Instance.Durable
// waits until every write made before it is stored, for work that must
// know (a tray run before its next step); Append and Run.Applied wait by
// themselves.
//
// # Output gates
//
// Whatever an instance writes to a response (the status and headers, body
// bytes, each flushed chunk of a stream, and so each Statewire frame it
// pushes) leaves the plugin only once every state write queued before it
// was written is durable. A host written the obvious way (change memory,
// Set, answer; or read memory and answer) is then linearizable: no answer
// reveals a write that a crash, a failed commit or a fence then loses, as
// Cloudflare's Durable Objects promise with the same name. Two rules make
// it hold:
//
//   - Queue the write (Set) before, or under the same lock as, the change
//     of memory that other requests read (examples/counter increments and
//     Sets under one mutex). What is shown before its write is queued
//     escapes the gate.
//   - Outputs are held, not the handler: Write returns at once, and a
//     Flush (http.ResponseController.Flush too) waits until what it sends
//     is durable. An answer is complete once the handler returned and its
//     writes are durable.
//
// If a commit fails, the held outputs are discarded and replaced as the
// status contract below says: ErrFenced by 503 with Retry-After,
// ErrStateUnavailable by 504 {"outcome":"unknown"}; a response whose
// status had already left (a stream) is cut short, and its client
// reconnects. The instance is then reset: its writes still queued are
// dropped, the activation stops (its context is cancelled, Stop runs), and
// a fresh one is loaded from the store and built by Host.New, under the
// same placement; requests meanwhile wait for it. If the store cannot be
// read, the id is left inactive: the plugin answers 503 "not active"
// (nothing ran), and pinnedd activates the id again on its next request.
//
// What it costs: an output produced with nothing in flight passes at once:
// two atomic loads per write, plus about a microsecond and three small
// allocations per request for the gate itself (BenchmarkGateOverhead),
// against the hundreds of microseconds of a request's trip through
// pinnedd (BenchmarkGate in examples/counter compares reads and
// increments with the gate, through AllowUnconfirmed, and with a
// hand-placed Durable wait). An output produced behind a write waits for
// that write's commit (one round trip to the store, batched with the
// writes queued with it), and for every write of the instance queued
// before it, by any request or task, related or not: a read on a busy
// instance waits for the commit in progress, and an answer after an
// Append may wait for the writes a tray run queued since. A Postgres outage turns reads of an instance with a failed
// write into 503s until the store is back, where before they answered
// from memory. Bytes written behind a write are buffered in the plugin
// until it is durable; a Hijack (a WebSocket) waits once for the
// frontier, and what is written to the connection afterwards passes no
// gate.
//
// sdk.AllowUnconfirmed(r) lets the rest of a response leave without
// waiting: for an answer that reveals only what is durable anyway (an
// acknowledgement of writes already waited for, a refusal), or one whose
// reader accepts a value that may vanish. Its name says the risk.
//
// # Limits
//
// The state store's limits, the same on every store, are exported here
// (their values come from package statestore):
//
//   - MaxTrayNameLen (128 bytes): a tray's namespace and its id.
//   - MaxFieldNameLen (128 bytes): a field name.
//   - MaxValueLen (1 MiB): a field's value or an item's payload, as JSON.
//   - MaxAppendItems (4096) and MaxAppendBytes (16 MiB): the payloads of one
//     Append, which is one atomic write.
//
// Names must also be non-empty UTF-8 without NUL bytes. A write that breaks
// a limit fails at once with ErrInvalidWrite and changes nothing. The
// store's limits on one commit (statestore.MaxMutations (1024) and
// statestore.MaxCommitBytes (16 MiB)) never reach a host: the SDK splits
// the writes it queues into commits within them. (A test holds the numbers
// in this doc to the constants.)
//
// # When a write fails, and what to answer
//
// A host answers its client as pinnedd's front door does, where a 503 with
// Retry-After promises that nothing ran and a 504 that it may have:
//
//   - ErrInvalidWrite (Set, Append): the store can never take this write;
//     nothing was queued. Answer 413 for a value or an append over its
//     limit, 400 for a bad name: the client must change the request.
//   - ErrFenced (Set, Append, Durable, Run.Applied): a newer activation of
//     the id exists (it was placed elsewhere); nothing more of this one is
//     stored, and it stops. Answer 503 with Retry-After: the retry reaches
//     the new owner.
//   - ErrStateUnavailable (Durable, Append, Run.Applied): a commit failed
//     (the store is down or did not answer in time). It may have been
//     stored, or not; the instance is reset from the store (see Output
//     gates), and until then Set and Append refuse with it (nothing
//     queued). Answer 504 with {"outcome":"unknown"} and no Retry-After:
//     the client may retry only what is idempotent or deduplicated. (The
//     gate gives this answer by itself to what was held behind the
//     failed commit.)
//   - The context's error, wrapped (Durable, Append): the caller's context
//     ended first (the client left); the outcome is unknown as above.
//
// A value that does not encode as JSON fails Set or Append with
// encoding/json's error: a bug in the host (500).
package sdk
