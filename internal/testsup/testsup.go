// Package testsup runs the testhost plugin under a real supervisor, for
// the tests of the packages that route to instances (pinboard, frontdoor).
package testsup

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/pinnedd/pinnedd/internal/testutil"
	"github.com/pinnedd/pinnedd/supervisor"
)

// Start runs the testhost plugin under a real supervisor for /misc; its
// cleanup stops it and checks the plugin process is gone.
func Start(t testing.TB) *supervisor.Supervisor {
	t.Helper()
	s, err := supervisor.New(supervisor.Config{
		Specs:  []supervisor.Spec{{Name: "testhost", Path: testutil.Bin(t, "testhost"), Namespaces: []string{"/misc"}}},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		var pids []int
		for _, p := range s.Plugins() {
			pids = append(pids, p.PID)
		}
		s.Stop(context.Background())
		testutil.CheckGone(t, pids)
	})
	return s
}
