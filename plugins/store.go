package plugins

import (
	"math"

	"google.golang.org/grpc"

	"github.com/pinnedd/pinnedd/statestore"
)

// Message bounds of the Store service. gRPC's default (4 MiB a received
// message) is below what the state store takes in one Commit
// (statestore.MaxCommitBytes) and below what an instance may hold, so
// without them a large write would fail on every retry, holding up every
// write queued behind it, and a large instance could never load again.
const (
	// MaxCommitMessage bounds a Commit request pinnedd accepts: the store's
	// byte limit plus room for the names and framing of MaxMutations
	// mutations.
	MaxCommitMessage = statestore.MaxCommitBytes + 4<<20
	// MaxLoadMessage bounds a Load answer a plugin accepts: an instance's
	// whole state comes back in one message, and the store bounds only
	// each write, not the sum, so any state it stored must load.
	MaxLoadMessage = math.MaxInt32
)

// StoreServerOptions are the options pinnedd serves the Store service with.
func StoreServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.MaxRecvMsgSize(MaxCommitMessage)}
}

// StoreDialOptions are the options a plugin dials the Store service with.
func StoreDialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithDefaultCallOptions(
		grpc.MaxCallRecvMsgSize(MaxLoadMessage), grpc.MaxCallSendMsgSize(MaxCommitMessage))}
}
