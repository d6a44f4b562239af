package client_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testutil"

	"github.com/pinnedd/pinnedd/statewire/client"
	"github.com/pinnedd/pinnedd/statewire/internal/vectors"
)

// The ops vectors through a Session: a stream gives the case's document as
// a snapshot and its ops as one frame. A case that applies leaves the
// session at version 1 with the wanted document; one that does not leaves
// the snapshot's document, applies nothing, and reconnects.
func TestSessionOpsVectors(t *testing.T) {
	cases, err := vectors.Ops()
	if err != nil || len(cases) == 0 {
		t.Fatalf("load vectors: %d cases, %v", len(cases), err)
	}
	for _, tc := range cases {
		t.Run(tc.Name, func(t *testing.T) {
			t.Parallel()
			ops, _ := json.Marshal(tc.Ops)
			fr := newFront(t, stream([]string{
				fmt.Sprintf(`{"type":"snapshot","epoch":"e","version":0,"state":%s}`, tc.Doc),
				fmt.Sprintf(`{"type":"ops","version":1,"ops":%s}`, ops),
			}))
			sess := client.New(fr.srv.URL).Attach(t.Context())
			defer sess.Close()
			// The first stream ends either way (refused or done): the
			// session's next connection is its proof it is through it.
			testutil.WaitFor(t, 10*time.Second, "the session's next connection", func() bool { return fr.count("/stream") >= 2 })
			st, v := sess.State()
			got, _ := json.Marshal(st)
			want := tc.Want
			if tc.Error {
				want = tc.Doc
				if v != 0 || len(sess.Stats().Ops) != 0 {
					t.Fatalf("applied to version %d, giving %s; want the frame refused", v, got)
				}
			} else if v != 1 {
				t.Fatalf("version %d, want 1", v)
			}
			if !vectors.EqualJSON(got, want) {
				t.Fatalf("document %s, want %s", got, want)
			}
		})
	}
}

// The frames vectors through PostFrames, against a real server.
func TestFramesVectors(t *testing.T) {
	cases, err := vectors.Frames()
	if err != nil || len(cases) == 0 {
		t.Fatalf("load vectors: %d cases, %v", len(cases), err)
	}
	for _, tc := range cases {
		t.Run(tc.Name, func(t *testing.T) {
			s, _ := newServer(t)
			c := client.New(newFront(t, s).srv.URL)
			for i, step := range tc.Steps {
				resp, err := c.PostFrames(waitCtx(t), step.Body(c.ID()))
				var he *client.HTTPError
				switch {
				case err == nil:
					b, _ := json.Marshal(resp)
					if err := step.Check(200, b); err != nil {
						t.Fatalf("step %d: %v", i, err)
					}
				case errors.As(err, &he):
					b, _ := json.Marshal(map[string]any{"error": he.Message, "expected": he.Expected})
					if err := step.Check(he.Code, b); err != nil {
						t.Fatalf("step %d: %v", i, err)
					}
				default:
					t.Fatalf("step %d: %v", i, err)
				}
			}
		})
	}
}
