package supervisor

import (
	"net/http"
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

// serveCall serves r to instance (ns, id) under gen as a front door does:
// Open, activating it if need be, then carry r over net/http.
func serveCall(s *Supervisor, w http.ResponseWriter, r *http.Request, ns, id string, gen uint64, rest string) {
	c, err := s.Open(r.Context(), "", Key{Namespace: ns, ID: id}, gen, Activate)
	if err != nil {
		s.WriteOpenError(w, r, ns, err)
		return
	}
	c.ServeHTTP(w, r, rest)
}
