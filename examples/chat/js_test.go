package chat_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"os/exec"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/plugins/sdk"
	"github.com/pinnedd/pinnedd/statewire"
)

// The JavaScript client's tests (statewire.test.mjs: the Statewire
// conformance vectors) under node's own test runner, so go test runs them:
// a real Statewire server declaring the vectors' "say" command serves the
// frames cases.
func TestJSClientConformance(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node is required for the JavaScript client's tests (Node.js 20): %v", err)
	}
	inst := sdk.NewMemoryInstance("/vectors", "v1")
	t.Cleanup(inst.Stop)
	srv, err := statewire.New(inst, statewire.Config{
		Initial: map[string]any{},
		Commands: map[string]statewire.CommandSpec{"say": {Validate: func(f json.RawMessage) error {
			var v struct{ Text *string }
			if err := json.Unmarshal(f, &v); err != nil || v.Text == nil {
				return errors.New("say needs a string text")
			}
			return nil
		}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)

	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "--test", "statewire.test.mjs")
	cmd.Env = append(cmd.Environ(), "STATEWIRE_URL="+hs.URL)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node --test statewire.test.mjs: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}
