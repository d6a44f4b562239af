package supervisor

import (
	"os"
	"testing"

	"github.com/pinnedd/pinnedd/internal/testutil"
)

// checkNoPlugins fails t for every plugin process this test process
// started that still runs: after Stop, none may, whichever incarnation
// (crashed, restarted, swapped) it was. Tests here do not run in parallel.
func checkNoPlugins(t testing.TB) {
	t.Helper()
	for _, pid := range testutil.ChildrenOf(os.Getpid()) {
		t.Errorf("plugin process %d alive after Stop", pid)
	}
}
