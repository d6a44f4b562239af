// Package vectors loads the Statewire conformance vectors
// (statewire/testdata/vectors, described in PROTOCOL.md) and checks answers
// against them, for the Go tests of the server, the client and the wire
// package. It holds no protocol logic of its own: what is checked is what
// the JSON files say.
package vectors

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
)

// Dir is the vectors' directory.
func Dir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "testdata", "vectors")
}

// OpsCase is one case of ops.json.
type OpsCase struct {
	Name  string            `json:"name"`
	Doc   json.RawMessage   `json:"doc"`
	Ops   []json.RawMessage `json:"ops"`
	Want  json.RawMessage   `json:"want"`
	Error bool              `json:"error"`
}

// FramesCase is one case of frames.json.
type FramesCase struct {
	Name  string `json:"name"`
	Steps []Step `json:"steps"`
}

// Step is one POST /frames of a case and what it must answer.
type Step struct {
	Frames   []json.RawMessage          `json:"frames"`
	Extra    map[string]json.RawMessage `json:"extra"`
	Status   int                        `json:"status"`
	Answer   *Answer                    `json:"answer"`
	Expected int64                      `json:"expected"`
}

// Answer is a 200's body.
type Answer struct {
	Acked      int64 `json:"acked"`
	Admitted   int   `json:"admitted"`
	Duplicates int   `json:"duplicates"`
}

func load(name string, v any) error {
	b, err := os.ReadFile(filepath.Join(Dir(), name))
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

// Ops loads ops.json.
func Ops() ([]OpsCase, error) {
	var f struct {
		Description string    `json:"description"`
		Cases       []OpsCase `json:"cases"`
	}
	err := load("ops.json", &f)
	return f.Cases, err
}

// Frames loads frames.json.
func Frames() ([]FramesCase, error) {
	var f struct {
		Description string            `json:"description"`
		Commands    map[string]string `json:"commands"`
		Cases       []FramesCase      `json:"cases"`
	}
	err := load("frames.json", &f)
	return f.Cases, err
}

// Body is the step's request body for clientID.
func (s Step) Body(clientID string) []byte {
	body := map[string]any{"clientId": clientID, "frames": s.Frames}
	if s.Frames == nil {
		body["frames"] = []any{}
	}
	for k, v := range s.Extra {
		body[k] = v
	}
	b, _ := json.Marshal(body)
	return b
}

// Check compares an answer (status and body) with the step's.
func (s Step) Check(status int, body []byte) error {
	if status != s.Status {
		return fmt.Errorf("status %d %s, want %d", status, body, s.Status)
	}
	switch {
	case s.Answer != nil:
		var got Answer
		if err := json.Unmarshal(body, &got); err != nil || got != *s.Answer {
			return fmt.Errorf("answer %s, want %+v", body, *s.Answer)
		}
	case s.Expected > 0:
		var got struct {
			Error    string `json:"error"`
			Expected int64  `json:"expected"`
		}
		if err := json.Unmarshal(body, &got); err != nil || got.Expected != s.Expected || got.Error == "" {
			return fmt.Errorf("answer %s, want an error expecting seq %d", body, s.Expected)
		}
	default:
		var got struct {
			Error string `json:"error"`
		}
		if status != 200 && (json.Unmarshal(body, &got) != nil || got.Error == "") {
			return fmt.Errorf("answer %s, want {\"error\": \"...\"}", body)
		}
	}
	return nil
}

// EqualJSON reports whether a and b are the same JSON value.
func EqualJSON(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	xa, _ := json.Marshal(x)
	ya, _ := json.Marshal(y)
	return bytes.Equal(xa, ya)
}
