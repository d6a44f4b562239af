// Package wire owns the Statewire frame and op types and the one function
// that applies an op to a JSON document. The server (package statewire) and
// the Go client (statewire/client) both use it, so a client replaying ops
// ends up with exactly the document the server holds. It must never depend
// on the plugin SDK: clients import it.
package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
)

// Frame types on a stream.
const (
	TypeSnapshot  = "snapshot"
	TypeOps       = "ops"
	TypeKeepalive = "keepalive"
	TypeFin       = "fin"
)

// Op kinds.
const (
	OpSet    = "set"
	OpDelete = "delete"
	OpAppend = "append"
)

// Fin codes. A client acts on Frame.Reconnect, not on the code: codes are
// for people and logs, and new ones may appear.
const (
	FinEvicted = "evicted" // the instance stopped (idle, drain, move, swap)
	FinLagging = "lagging" // the stream fell behind the instance
	FinClosed  = "closed"  // the host closed the stream and wants no reconnect
)

// Frame is one line of a stream.
type Frame struct {
	Type string `json:"type"`
	// Epoch names the activation that produced the versions; a snapshot
	// starts a new count.
	Epoch   string          `json:"epoch,omitempty"`
	Version uint64          `json:"version,omitempty"`
	State   json.RawMessage `json:"state,omitempty"`
	Ops     []Op            `json:"ops,omitempty"`
	Code    string          `json:"code,omitempty"`
	// Reconnect is set on fin frames only.
	Reconnect *bool `json:"reconnect,omitempty"`
}

// Op is one change to the document. On the wire each op carries exactly
// its fields: "op" and "path" always, "value" for set, "text" for append;
// a missing one is an error (not null, not ""), so every client applies
// the same op. Unknown fields are ignored, so ops may gain optional ones.
type Op struct {
	Op    string          `json:"op"`
	Path  Path            `json:"path"`
	Value json.RawMessage `json:"value,omitempty"` // set
	Text  string          `json:"text,omitempty"`  // append
}

// ErrBadOp: an op lacks a field its kind needs, or has an unknown kind.
var ErrBadOp = errors.New("bad op")

// MarshalJSON writes the fields of the op's kind, and only those.
func (o Op) MarshalJSON() ([]byte, error) {
	path := o.Path
	if path == nil {
		path = Path{}
	}
	switch o.Op {
	case OpSet:
		v := o.Value
		if len(v) == 0 {
			v = json.RawMessage("null")
		}
		return json.Marshal(struct {
			Op    string          `json:"op"`
			Path  []any           `json:"path"`
			Value json.RawMessage `json:"value"`
		}{o.Op, path, v})
	case OpAppend:
		return json.Marshal(struct {
			Op   string `json:"op"`
			Path []any  `json:"path"`
			Text string `json:"text"`
		}{o.Op, path, o.Text})
	}
	return json.Marshal(struct {
		Op   string `json:"op"`
		Path []any  `json:"path"`
	}{o.Op, path})
}

// UnmarshalJSON requires the fields of the op's kind.
func (o *Op) UnmarshalJSON(b []byte) error {
	var raw struct {
		Op    *string         `json:"op"`
		Path  *Path           `json:"path"`
		Value json.RawMessage `json:"value"`
		Text  *string         `json:"text"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return fmt.Errorf("op: %w", err)
	}
	if raw.Op == nil {
		return fmt.Errorf("%w: missing \"op\"", ErrBadOp)
	}
	if raw.Path == nil {
		return fmt.Errorf("%w: %s without \"path\"", ErrBadOp, *raw.Op)
	}
	*o = Op{Op: *raw.Op, Path: *raw.Path}
	switch *raw.Op {
	case OpSet:
		if len(raw.Value) == 0 {
			return fmt.Errorf("%w: set without \"value\"", ErrBadOp)
		}
		o.Value = raw.Value
	case OpAppend:
		if raw.Text == nil {
			return fmt.Errorf("%w: append without \"text\"", ErrBadOp)
		}
		o.Text = *raw.Text
	case OpDelete:
	default:
		return fmt.Errorf("%w: unknown op %q", ErrBadOp, *raw.Op)
	}
	return nil
}

// Path addresses a value: object keys are strings, array indexes ints.
// An empty path is the whole document.
type Path []any

// UnmarshalJSON accepts strings and non-negative integers only.
func (p *Path) UnmarshalJSON(b []byte) error {
	if bytes.Equal(bytes.TrimSpace(b), []byte("null")) {
		return fmt.Errorf("path: null, want an array")
	}
	var raw []json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return fmt.Errorf("path: %w", err)
	}
	out := make(Path, 0, len(raw))
	for _, r := range raw {
		r = bytes.TrimSpace(r)
		if len(r) > 0 && r[0] == '"' {
			var s string
			if err := json.Unmarshal(r, &s); err != nil {
				return fmt.Errorf("path: %w", err)
			}
			out = append(out, s)
			continue
		}
		n, err := strconv.Atoi(string(r))
		if err != nil || n < 0 {
			return fmt.Errorf("path element %s: want a string or a non-negative integer", r)
		}
		out = append(out, n)
	}
	*p = out
	return nil
}

// ErrBadPath: an op names a location the document does not have.
var ErrBadPath = errors.New("bad path")

// Apply applies op to doc (a tree of map[string]any, []any and JSON
// scalars, as encoding/json decodes into any) and returns the new root.
// Containers are changed in place. Set creates missing objects along the
// path; an array index may replace an element or, equal to the length,
// add one.
func Apply(doc any, op Op) (any, error) {
	switch op.Op {
	case OpSet:
		var v any
		if len(op.Value) > 0 {
			if err := json.Unmarshal(op.Value, &v); err != nil {
				return doc, fmt.Errorf("set %v: %w", op.Path, err)
			}
		}
		return SetValue(doc, op.Path, v)
	case OpDelete:
		return deleteValue(doc, op.Path)
	case OpAppend:
		return appendText(doc, op.Path, op.Text)
	}
	return doc, fmt.Errorf("unknown op %q", op.Op)
}

// SetValue sets path to v (already in decoded form) and returns the new root.
func SetValue(doc any, path Path, v any) (any, error) {
	if len(path) == 0 {
		return v, nil
	}
	// Check before creating anything, so a refused op changes nothing:
	// missing members become objects, so from the first missing one on
	// every element (the last included) must be a key.
	if at, err := find(doc, path[:len(path)-1]); errors.Is(err, errMissing) {
		for _, el := range path[at:] {
			if _, ok := el.(string); !ok {
				return doc, fmt.Errorf("%w: %v: object key must be a string", ErrBadPath, path)
			}
		}
	} else if err != nil {
		return doc, err
	}
	parent, err := walk(doc, path[:len(path)-1], true)
	if err != nil {
		return doc, err
	}
	switch c := parent.(type) {
	case map[string]any:
		k, ok := path[len(path)-1].(string)
		if !ok {
			return doc, fmt.Errorf("%w: %v: object key must be a string", ErrBadPath, path)
		}
		c[k] = v
		return doc, nil
	case []any:
		i, ok := path[len(path)-1].(int)
		if !ok || i > len(c) {
			return doc, fmt.Errorf("%w: %v: array index out of range", ErrBadPath, path)
		}
		if i == len(c) {
			// Growing an array changes its header: write it back.
			return SetValue(doc, path[:len(path)-1], append(c, v))
		}
		c[i] = v
		return doc, nil
	}
	return doc, fmt.Errorf("%w: %v: parent is not a container", ErrBadPath, path)
}

func deleteValue(doc any, path Path) (any, error) {
	if len(path) == 0 {
		return doc, fmt.Errorf("%w: delete of the whole document", ErrBadPath)
	}
	parent, err := walk(doc, path[:len(path)-1], false)
	if err != nil {
		return doc, err
	}
	switch c := parent.(type) {
	case map[string]any:
		k, ok := path[len(path)-1].(string)
		if !ok {
			return doc, fmt.Errorf("%w: %v: object key must be a string", ErrBadPath, path)
		}
		delete(c, k)
		return doc, nil
	case []any:
		i, ok := path[len(path)-1].(int)
		if !ok || i >= len(c) {
			return doc, fmt.Errorf("%w: %v: array index out of range", ErrBadPath, path)
		}
		out := append(append([]any{}, c[:i]...), c[i+1:]...)
		return SetValue(doc, path[:len(path)-1], out)
	}
	return doc, fmt.Errorf("%w: %v: parent is not a container", ErrBadPath, path)
}

func appendText(doc any, path Path, text string) (any, error) {
	cur, err := walk(doc, path, false)
	if err != nil && !errors.Is(err, errMissing) {
		return doc, err
	}
	s, ok := cur.(string)
	if cur != nil && !ok {
		return doc, fmt.Errorf("%w: %v: append to a non-string", ErrBadPath, path)
	}
	return SetValue(doc, path, s+text)
}

var errMissing = fmt.Errorf("%w: missing", ErrBadPath)

// Lookup returns the value at path.
func Lookup(doc any, path Path) (any, bool) {
	v, err := walk(doc, path, false)
	return v, err == nil
}

// find follows path without changing anything and reports where it
// failed: the index of the first missing member with errMissing.
func find(doc any, path Path) (int, error) {
	cur := doc
	for n, el := range path {
		switch c := cur.(type) {
		case map[string]any:
			k, ok := el.(string)
			if !ok {
				return n, fmt.Errorf("%w: %v: object key must be a string", ErrBadPath, path[:n+1])
			}
			if cur = c[k]; cur == nil {
				return n, errMissing
			}
		case []any:
			i, ok := el.(int)
			if !ok || i >= len(c) {
				return n, fmt.Errorf("%w: %v: array index out of range", ErrBadPath, path[:n+1])
			}
			cur = c[i]
		default:
			return n, fmt.Errorf("%w: %v: not a container", ErrBadPath, path[:n+1])
		}
	}
	return len(path), nil
}

// walk follows path; with create, missing object members become objects.
func walk(doc any, path Path, create bool) (any, error) {
	cur := doc
	for n, el := range path {
		switch c := cur.(type) {
		case map[string]any:
			k, ok := el.(string)
			if !ok {
				return nil, fmt.Errorf("%w: %v: object key must be a string", ErrBadPath, path[:n+1])
			}
			next, ok := c[k]
			if !ok || next == nil {
				if !create {
					return nil, errMissing
				}
				next = map[string]any{}
				c[k] = next
			}
			cur = next
		case []any:
			i, ok := el.(int)
			if !ok || i >= len(c) {
				return nil, fmt.Errorf("%w: %v: array index out of range", ErrBadPath, path[:n+1])
			}
			cur = c[i]
		default:
			return nil, fmt.Errorf("%w: %v: not a container", ErrBadPath, path[:n+1])
		}
	}
	return cur, nil
}
