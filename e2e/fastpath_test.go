package e2e

import (
	"testing"

	"github.com/pinnedd/pinnedd/internal/testutil"
)

// noFastPath is the flag that keeps every request in net/http.
const noFastPath = "--fast-path=false"

// fastPath reports whether t's agents run the fast path (the default).
func fastPath(t *testing.T) bool { return !testutil.AddedAgentArg(t, noFastPath) }

// The data-path tests again with --fast-path=false: every request takes
// net/http's way (no kept-alive loop, no relayed streams), and clients see
// the same answers.
func TestDataPathWithoutFastPath(t *testing.T) {
	t.Parallel()
	testutil.AddAgentArgs(t, noFastPath)
	for _, tc := range []struct {
		name string
		run  func(*testing.T)
	}{
		{"AnyNodeServesAnyID", TestAnyNodeServesAnyID},
		{"OwnerKilledIDMoves", TestOwnerKilledIDMoves},
		{"OwnerRouteNeedsAttestation", TestOwnerRouteNeedsAttestation},
		{"ClusterCallPrefersOwnNode", TestClusterCallPrefersOwnNode},
		{"KeptAliveConnectionForwards", TestKeptAliveConnectionForwards},
		{"RelativeDataDirKeptAliveClient", TestRelativeDataDirKeptAliveClient},
		{"DevCounterFlow", TestDevCounterFlow},
		{"StreamsFlushThrough", TestStreamsFlushThrough},
		{"UpgradePassesThrough", TestUpgradePassesThrough},
		{"BadInputChangesNothing", TestBadInputChangesNothing},
	} {
		t.Run(tc.name, tc.run)
	}
}
