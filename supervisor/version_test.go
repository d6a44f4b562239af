package supervisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/pinnedd/pinnedd/internal/testutil"
	"github.com/pinnedd/pinnedd/plugins"
)

// A plugin speaking an older plugin protocol is refused at start, with an
// error naming the plugin and both versions, and no process of it stays.
func TestOlderProtocolRefused(t *testing.T) {
	old := plugins.ProtocolVersion - 1
	s, err := New(Config{
		Specs: []Spec{{Name: "p", Path: testutil.Bin(t, "testhost"), Namespaces: []string{"/misc"},
			Env: []string{fmt.Sprintf("TESTHOST_PROTOCOL=%d", old)}}},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	err = s.Start(context.Background())
	if !errors.Is(err, plugins.ErrProtocolVersion) {
		s.Stop(context.Background())
		t.Fatalf("Start = %v, want ErrProtocolVersion", err)
	}
	for _, want := range []string{
		"plugin p",
		fmt.Sprintf("speaks plugin protocol %d,", old),
		fmt.Sprintf("this pinnedd speaks %d", plugins.ProtocolVersion),
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Start error %q does not say %q", err, want)
		}
	}
	checkNoPlugins(t)
}
