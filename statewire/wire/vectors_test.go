package wire

import (
	"encoding/json"
	"testing"

	"github.com/pinnedd/pinnedd/statewire/internal/vectors"
)

// applyFrame applies ops as one ops frame the way a client does: each op
// decoded from the wire, all applied to a copy, the copy kept only if
// every op applied.
func applyFrame(doc json.RawMessage, ops []json.RawMessage) (json.RawMessage, error) {
	var cur any
	if err := json.Unmarshal(doc, &cur); err != nil {
		return nil, err
	}
	for _, raw := range ops {
		var op Op
		if err := json.Unmarshal(raw, &op); err != nil {
			return nil, err
		}
		var err error
		if cur, err = Apply(cur, op); err != nil {
			return nil, err
		}
	}
	return json.Marshal(cur)
}

// The conformance vectors of ops (testdata/vectors/ops.json), through the
// wire decoder and Apply, as the server's document and the Go client both
// apply them; and each op that applies survives an encode and decode.
func TestOpsVectors(t *testing.T) {
	cases, err := vectors.Ops()
	if err != nil || len(cases) == 0 {
		t.Fatalf("load vectors: %d cases, %v", len(cases), err)
	}
	for _, tc := range cases {
		got, err := applyFrame(tc.Doc, tc.Ops)
		switch {
		case tc.Error && err == nil:
			t.Errorf("%s: applied, giving %s; want an error", tc.Name, got)
		case !tc.Error && err != nil:
			t.Errorf("%s: %v", tc.Name, err)
		case !tc.Error && !vectors.EqualJSON(got, tc.Want):
			t.Errorf("%s: %s, want %s", tc.Name, got, tc.Want)
		}
		if tc.Error {
			continue
		}
		// Encoding is what the server sends: decoding it must give the
		// same result.
		var again []json.RawMessage
		for _, raw := range tc.Ops {
			var op Op
			_ = json.Unmarshal(raw, &op)
			b, err := json.Marshal(op)
			if err != nil {
				t.Fatalf("%s: encode: %v", tc.Name, err)
			}
			again = append(again, b)
		}
		if got2, err := applyFrame(tc.Doc, again); err != nil || !vectors.EqualJSON(got2, tc.Want) {
			t.Errorf("%s: re-encoded ops give %s, %v", tc.Name, got2, err)
		}
	}
}
