// Package directory is pinnedd's directory state machine: the replicated
// record of workers (their sessions and leases), placements (which worker
// serves each (env, namespace, id), fenced by a generation), operator drains,
// the cold-start stamp and the cluster secret.
//
// It is pure and deterministic. The same sequence of (index, command) pairs
// gives byte-identical state on every node, so the package must never import
// raft or net/http, read the clock, draw random numbers, or iterate a map
// where the order could leak into state or output. Every time ("Now") and
// every choice (the candidate worker of a claim, the cluster secret, lease
// TTLs, the quarantine length) is fixed by the proposer and carried inside
// the command before it reaches the log, as Nomad's endpoints fix drain
// deadlines before raft.Apply.
//
// # Driving the machine
//
// *Machine implements raftstore's StateMachine (Apply, Snapshot, Restore).
// Apply refuses an index that is not above the applied index: replaying an
// entry would apply its commands twice.
//
// # Reads and applies
//
// Apply and Restore serialize on the Machine's mutex; the front door's
// per-request reads (Owner, Placement, Worker, Workers, NamespaceServed,
// Secret) never take it, so an entry of hundreds of commands being applied
// stalls no request. Placements live in one table, a hash index whose
// chains are never modified once readers can reach them (a write copies
// the nodes in front of its key and swaps the chain's head atomically);
// an entry's writes wait beside it until the entry is done. Workers and
// the secret are published as an immutable view (an atomic pointer) after
// each entry that changed them: appliers change a worker only through a
// private copy. At the end of an entry the view is published first and the
// placements committed second, so Owner, which loads the placement and
// then the view, sees the worker a placement names as of that entry or a
// later one. Restore swaps in a new table and view at once. The other
// reads (Candidates, PlacementsOf, Drains, ...) take the mutex's read side.
//
// # Commands, retries and versions
//
// A command is an envelope: format version, a type byte whose high bit
// (IgnorableFlag) marks the command as safe to skip, then a compact varint
// payload. raft may report an Apply as failed when its outcome is unknown,
// so every command is idempotent or compare-and-set: Claim returns the
// existing placement when the candidate already holds it, Release only
// removes the placement with the given owner and generation (GiveBack, a
// worker's own release, also with the given session), Register and
// Heartbeat never move a lease backwards.
//
// Unknown command policy (after Nomad's fsm): a node that meets a command
// type or format version it does not know skips it with CodeUnknownCommand
// when the ignorable bit is set, and otherwise answers CodeError without
// changing state. Either way the index is consumed. Skipping a command a
// newer node applies makes the two diverge, so a proposer may only emit a
// new non-ignorable type once every node runs a version that knows it; the
// ignorable bit is for commands whose loss is harmless (hints, stats).
//
// # Placements and fencing
//
// Claim grants a key when it is free or its owner is gone (forgotten,
// deregistered, re-registered without it, or its lease lapsed at the
// command's Now), to a candidate that is live, serves the namespace, is not
// draining and not degraded, and only once the cold-start quarantine has
// passed. The generation of a placement (the fencing token its owner writes
// under) strictly increases across every grant the directory makes and is
// at least the grant's time in ms × 1000, so a directory rebuilt from
// nothing (a wiped data dir, a --dev restart) keeps issuing tokens above
// those a durable state store has already seen; a log index would restart
// at 1 and fence every write. Within one entry (a Batch) a key is granted at
// most once, the second attempt answering CodeConflict.
//
// # Leases
//
// A lease never moves backwards: Register and Heartbeat set the expiry to
// max(current, min(Now+TTL, drain deadline)). Shrinking a lease the worker
// was already told about would let the directory re-place an id while the
// worker still believes it owns it. A drain deadline only stops further
// extension: acks stop extending the lease past it.
//
// A leaderless gap must not lapse a healthy worker's lease: while no
// leader commits, no heartbeat can, and with a short TTL an election alone
// would let claims take every id and refuse every heartbeat. So a new
// leader's first command of its term is RenewLeases (raftstore commits it
// before any other command of the term: Store.SetLeaderPreamble), with the
// leader's Now and TTL. Which leases it renews is decided from the log
// alone: the machine keeps a clock, the latest Now of any command applied,
// which is when the former leader last committed something (every worker
// heartbeats every few seconds). A registered, unrevoked worker whose
// lease had not lapsed at that clock was live when a leader could last
// renew it, and gets max(current, min(Now+TTL, drain deadline)), as an ack
// would give; one that lapsed before it lapsed under a working leader and
// stays lapsed. The former leader's node (RenewLeases.FormerLeader) is the
// exception: the election most likely happened because it stopped
// answering, so its workers keep their lease as it was (their ids fail
// over when it lapses) and are Unconfirmed: they take no new placements
// until their own heartbeat or registration is applied. A renewal tells
// the worker nothing: its own expiry stays what its last ack said, never
// later than the directory's, so safety holds as before. The worker's
// states follow its acks (the seed's lease table), so a gap longer than
// TTL minus the unhealthy buffer still makes it unhealthy by itself; the
// agent refuses a TTL within reach of an election for that reason.
//
// Register does not re-grant listed live ids that the worker no longer owns:
// it reports them as Duplicates and the worker quits them. Re-granting there
// would bypass the quarantine, drain and eligibility checks of Claim; the
// next request for such an id re-places it through Claim, possibly onto the
// same worker. Placements the worker still owns from an earlier session are
// adopted by the new session (same generation) when listed, dropped when not.
//
// # Drains
//
// An operator drains a client id (DrainWorker: that one process) or a
// node id (DrainNode: every worker registered with it, so the drain
// survives the node's restart, which registers a new client id). A worker
// is held to the drain of its client id or of its node id, the stricter
// when both are (a timed drain over a cordon, the earlier deadline): it
// takes no new placements, and a timed drain caps its lease at the
// deadline. UndrainNode clears the node's record and those of the client
// ids of its known workers, so an undrained node takes placements again.
//
// # Hostname-aware mode
//
// A worker registered with routes (RegisterRoutes) serves (hostname,
// namespace) pairs whose ids live in an env; claims through a hostname
// (ClaimRoute) place keys of the env the (hostname, namespace) binding
// names. Bindings and env takeover policies carry epochs: a higher epoch
// displaces, supersedes the routes that disagree, and holds new
// placements for one lease; a wind_down takeover fences a holder under
// another hostname once and re-places the id when the holder gave it
// back. The rules are in hostnames.go. The two commands are not
// ignorable: a fleet turns the mode on once every node runs a version
// that knows them (snapshot version 7).
//
// # Garbage collection
//
// Workers stay known after their lease lapses so an operator drain can
// target a registered worker that is down. GC, proposed by the leader with
// its Now, forgets workers whose lease lapsed more than WorkerRetention ago
// (default DefaultWorkerRetention, one hour: far above any restart or
// partition that should keep its drain record meaningful, small enough that
// a fleet with churning client ids stays bounded) together with their
// placements, and removes timed drains 7 days past their deadline. Cordons
// stay until undrained, even when their worker is forgotten.
package directory
