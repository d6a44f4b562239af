package statewire_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"testing"

	"github.com/pinnedd/pinnedd/internal/storegrpc"
	"github.com/pinnedd/pinnedd/statestore/memstore"
	"github.com/pinnedd/pinnedd/statewire"
	"github.com/pinnedd/pinnedd/statewire/internal/vectors"
)

// The frames vectors (testdata/vectors/frames.json) against the server,
// its trays in a real store over gRPC: each case a client of its own.
func TestFramesVectors(t *testing.T) {
	cases, err := vectors.Frames()
	if err != nil || len(cases) == 0 {
		t.Fatalf("load vectors: %d cases, %v", len(cases), err)
	}
	a := activate(t, storegrpc.Client(t, memstore.New()), 5, func(c *statewire.Config) {
		c.Commands = map[string]statewire.CommandSpec{"say": {Run: true, Validate: func(f json.RawMessage) error {
			var v struct{ Text *string }
			if err := json.Unmarshal(f, &v); err != nil || v.Text == nil {
				return errors.New("say needs a string text")
			}
			return nil
		}}}
	})
	for i, tc := range cases {
		t.Run(tc.Name, func(t *testing.T) {
			client := "vector-" + string(rune('a'+i))
			for n, step := range tc.Steps {
				resp, err := http.Post(a.srv.URL+"/frames", "application/json", bytes.NewReader(step.Body(client)))
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err := step.Check(resp.StatusCode, body); err != nil {
					t.Fatalf("step %d: %v", n, err)
				}
			}
		})
	}
}
