package raftstore

import (
	"errors"
	"fmt"

	"github.com/pinnedd/pinnedd/clusterport"
)

// Sentinel errors. Returned errors wrap them (and often the underlying raft or context error)
// with %w; match them with errors.Is.
var (
	// ErrNotLeader means this node (or the node a request was forwarded to) is not the leader and
	// the operation was NOT started. Retrying is safe.
	ErrNotLeader = errors.New("raftstore: not the leader")
	// ErrNoLeader means no leader (or no leader API address) was known before the deadline. The
	// operation was not started.
	ErrNoLeader = errors.New("raftstore: no known leader")
	// ErrOutcomeUnknown means a command may or may not have been committed (leadership was lost,
	// the store shut down, the context ended, or the connection to the leader broke after the
	// request was sent). Only idempotent or compare-and-set commands may be retried.
	ErrOutcomeUnknown = errors.New("raftstore: outcome unknown")
	// ErrLeaderChanged is the cause of a forward's end when this node saw a leader other than the
	// one it forwarded to (or none). A forward cut short by it has an unknown outcome.
	ErrLeaderChanged = errors.New("raftstore: leader changed")
	// ErrShutdownStuck means raft had not stopped when Close's context ended (and shortly after
	// its transport was closed); the stores were left open for the process exit.
	ErrShutdownStuck = errors.New("raftstore: raft did not shut down in time")
	// ErrClosed means the store is closed or closing.
	ErrClosed = errors.New("raftstore: closed")
	// ErrInvalidConfig means Open was given an unusable Config.
	ErrInvalidConfig = errors.New("raftstore: invalid config")
	// ErrBadRequest means an RPC carried malformed input.
	ErrBadRequest = errors.New("raftstore: bad request")
	// ErrUnauthorized means the authorize hook rejected an RPC.
	ErrUnauthorized = errors.New("raftstore: unauthorized")
	// ErrForbidden means an RPC came on a port that does not serve it (a node-to-node call on
	// the public port of a cluster running mutual TLS), or from a node no longer a member.
	ErrForbidden = errors.New("raftstore: forbidden")
	// ErrLastVoter means the operation would remove the only voter and so destroy the cluster.
	ErrLastVoter = errors.New("raftstore: refusing to remove the last voter")
	// ErrStorageFault means a write to this node's Raft log or stable store failed (a full disk,
	// an I/O error). The node is fail-stop from then on: it refuses further writes and work, and
	// its process must exit and be restarted (see Store.Fatal).
	ErrStorageFault = errors.New("raftstore: raft log storage failed")
	// ErrInsufficientSpace means the data dir's disk has too little free space for the Raft log;
	// the message says how much is needed where.
	ErrInsufficientSpace = errors.New("raftstore: not enough disk space for the raft log")
	// ErrUnknownMember means a node id is not in the Raft configuration.
	ErrUnknownMember = errors.New("raftstore: unknown member")
	// ErrUntrustedCA means a joining node refused the CA or certificate a member sent: it is not
	// the CA the deployment token pins, or the certificate does not chain to it.
	ErrUntrustedCA = clusterport.ErrUntrustedCA
	// ErrNoClusterCA means this member cannot issue a certificate: the cluster runs without
	// TLS, uses the operator's own PKI, or has not recorded its CA yet.
	ErrNoClusterCA = clusterport.ErrNoClusterCA
	// ErrStaleJoin means a join named a membership fence older than the latest removal's: it
	// was made before that removal (a captured join sent again, or a join that raced the
	// removal). Nothing changed. JoinVia and Store.Join make the join again with the fence the
	// refusal carries; a replayed join cannot, since its proof covers the fence it names.
	ErrStaleJoin = errors.New("raftstore: join made before the latest removal")
)

// staleJoinError is ErrStaleJoin with the cluster's fence, which the refusal carries back
// (errorBody.Fence) for the joining node's next attempt.
type staleJoinError struct{ current uint64 }

func (e *staleJoinError) Error() string {
	return fmt.Sprintf("%v: the cluster's membership fence is %d", ErrStaleJoin, e.current)
}

func (e *staleJoinError) Is(target error) bool { return target == ErrStaleJoin }
