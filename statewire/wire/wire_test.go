package wire

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

// Every frame kind decodes from the line the server writes, with the
// fields a client acts on.
func TestDecodeFrames(t *testing.T) {
	yes, no := true, false
	for _, tc := range []struct {
		line string
		want Frame
	}{
		{`{"type":"snapshot","epoch":"e1","version":3,"state":{"a":[1,"x"]}}`,
			Frame{Type: TypeSnapshot, Epoch: "e1", Version: 3, State: json.RawMessage(`{"a":[1,"x"]}`)}},
		{`{"type":"ops","version":4,"ops":[{"op":"set","path":["a",0],"value":2},{"op":"append","path":["t"],"text":"hi"},{"op":"delete","path":["gone"]}]}`,
			Frame{Type: TypeOps, Version: 4, Ops: []Op{
				{Op: OpSet, Path: Path{"a", 0}, Value: json.RawMessage(`2`)},
				{Op: OpAppend, Path: Path{"t"}, Text: "hi"},
				{Op: OpDelete, Path: Path{"gone"}},
			}}},
		{`{"type":"keepalive"}`, Frame{Type: TypeKeepalive}},
		{`{"type":"fin","code":"evicted","reconnect":true}`, Frame{Type: TypeFin, Code: FinEvicted, Reconnect: &yes}},
		{`{"type":"fin","code":"closed","reconnect":false}`, Frame{Type: TypeFin, Code: FinClosed, Reconnect: &no}},
		{`{"type":"fin","code":"something-new"}`, Frame{Type: TypeFin, Code: "something-new"}},
	} {
		var f Frame
		if err := json.Unmarshal([]byte(tc.line), &f); err != nil {
			t.Errorf("%s: %v", tc.line, err)
			continue
		}
		if !reflect.DeepEqual(f, tc.want) {
			t.Errorf("%s:\n got %+v\nwant %+v", tc.line, f, tc.want)
		}
		// What the server encodes, a client decodes to the same frame.
		b, err := json.Marshal(f)
		if err != nil {
			t.Fatal(err)
		}
		var again Frame
		if err := json.Unmarshal(b, &again); err != nil || !reflect.DeepEqual(again, f) {
			t.Errorf("%s: round trip %s gave %+v (%v)", tc.line, b, again, err)
		}
	}
}

func TestPathAcceptsKeysAndIndexesOnly(t *testing.T) {
	var p Path
	if err := json.Unmarshal([]byte(`["msgs", 0, "text", 12]`), &p); err != nil || !reflect.DeepEqual(p, Path{"msgs", 0, "text", 12}) {
		t.Fatalf("good path: %v %v", p, err)
	}
	if err := json.Unmarshal([]byte(`[]`), &p); err != nil || len(p) != 0 {
		t.Fatalf("empty path: %v %v", p, err)
	}
	for _, bad := range []string{`[-1]`, `[1.5]`, `[1e2]`, `[true]`, `[null]`, `[{"a":1}]`, `["a",[0]]`, `"a"`, `{}`} {
		var p Path
		if err := json.Unmarshal([]byte(bad), &p); err == nil {
			t.Errorf("%s: accepted as %v", bad, p)
		}
	}
}

func doc(t *testing.T, s string) any {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatal(err)
	}
	return v
}

func jsonOf(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Apply gives the document the server holds: each case is an op on a
// document and the document after it (or ErrBadPath, the document as it
// was).
func TestApply(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		op       Op
		want     string // "" means ErrBadPath
	}{
		{"set a new member", `{}`, Op{Op: OpSet, Path: Path{"a"}, Value: json.RawMessage(`1`)}, `{"a":1}`},
		{"set creates objects on the way", `{}`, Op{Op: OpSet, Path: Path{"a", "b", "c"}, Value: json.RawMessage(`"x"`)}, `{"a":{"b":{"c":"x"}}}`},
		{"set replaces an element", `{"l":[1,2]}`, Op{Op: OpSet, Path: Path{"l", 1}, Value: json.RawMessage(`9`)}, `{"l":[1,9]}`},
		{"set at the length appends", `{"l":[1,2]}`, Op{Op: OpSet, Path: Path{"l", 2}, Value: json.RawMessage(`3`)}, `{"l":[1,2,3]}`},
		{"set under an element past the length", `{"l":[1,2]}`, Op{Op: OpSet, Path: Path{"l", 2, "x"}, Value: json.RawMessage(`3`)}, ""},
		{"set past the length", `{"l":[1,2]}`, Op{Op: OpSet, Path: Path{"l", 3}, Value: json.RawMessage(`3`)}, ""},
		{"set with no value is null", `{"a":1}`, Op{Op: OpSet, Path: Path{"a"}}, `{"a":null}`},
		{"set the whole document", `{"a":1}`, Op{Op: OpSet, Path: Path{}, Value: json.RawMessage(`{"b":2}`)}, `{"b":2}`},
		{"set under a scalar", `{"a":1}`, Op{Op: OpSet, Path: Path{"a", "b"}, Value: json.RawMessage(`1`)}, ""},
		{"set an index under a missing member", `{}`, Op{Op: OpSet, Path: Path{"x", "y", 0}, Value: json.RawMessage(`1`)}, ""},
		{"set a key under a missing member", `{"l":[{}]}`, Op{Op: OpSet, Path: Path{"l", 0, "x", 2, "y"}, Value: json.RawMessage(`1`)}, ""},
		{"append under a missing member by index", `{}`, Op{Op: OpAppend, Path: Path{"m", 0}, Text: "x"}, ""},
		{"set an index on an object", `{"a":{}}`, Op{Op: OpSet, Path: Path{"a", 0}, Value: json.RawMessage(`1`)}, ""},
		{"set a key on an array", `{"l":[]}`, Op{Op: OpSet, Path: Path{"l", "k"}, Value: json.RawMessage(`1`)}, ""},
		{"delete a member", `{"a":1,"b":2}`, Op{Op: OpDelete, Path: Path{"a"}}, `{"b":2}`},
		{"delete an element", `{"l":[1,2,3]}`, Op{Op: OpDelete, Path: Path{"l", 1}}, `{"l":[1,3]}`},
		{"delete the last element", `{"l":[1,2,3]}`, Op{Op: OpDelete, Path: Path{"l", 2}}, `{"l":[1,2]}`},
		{"delete past the end", `{"l":[1]}`, Op{Op: OpDelete, Path: Path{"l", 1}}, ""},
		{"delete under a missing member", `{}`, Op{Op: OpDelete, Path: Path{"a", "b"}}, ""},
		{"delete the whole document", `{"a":1}`, Op{Op: OpDelete, Path: Path{}}, ""},
		{"append to text", `{"t":"ab"}`, Op{Op: OpAppend, Path: Path{"t"}, Text: "cd"}, `{"t":"abcd"}`},
		{"append starts missing text", `{"m":{}}`, Op{Op: OpAppend, Path: Path{"m", "t"}, Text: "x"}, `{"m":{"t":"x"}}`},
		{"append to null starts text", `{"t":null}`, Op{Op: OpAppend, Path: Path{"t"}, Text: "x"}, `{"t":"x"}`},
		{"append inside an array", `{"p":[{"t":"a"}]}`, Op{Op: OpAppend, Path: Path{"p", 0, "t"}, Text: "b"}, `{"p":[{"t":"ab"}]}`},
		{"append to a number", `{"t":1}`, Op{Op: OpAppend, Path: Path{"t"}, Text: "x"}, ""},
		{"append past an array's end", `{"p":[]}`, Op{Op: OpAppend, Path: Path{"p", 0}, Text: "x"}, ""},
	} {
		in := doc(t, tc.in)
		got, err := Apply(in, tc.op)
		if tc.want == "" {
			if !errors.Is(err, ErrBadPath) {
				t.Errorf("%s: %v, want ErrBadPath", tc.name, err)
			}
			if jsonOf(t, got) != jsonOf(t, doc(t, tc.in)) {
				t.Errorf("%s: a refused op changed the document to %s", tc.name, jsonOf(t, got))
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if s := jsonOf(t, got); s != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, s, tc.want)
		}
	}
}

func TestApplyRefusesUnknownOpsAndBadValues(t *testing.T) {
	d := doc(t, `{"a":1}`)
	if _, err := Apply(d, Op{Op: "merge", Path: Path{"a"}}); err == nil || !strings.Contains(err.Error(), `unknown op "merge"`) {
		t.Errorf("unknown op: %v", err)
	}
	if _, err := Apply(d, Op{Op: OpSet, Path: Path{"a"}, Value: json.RawMessage(`{bad`)}); err == nil {
		t.Error("a value that is not JSON was applied")
	}
	if jsonOf(t, d) != `{"a":1}` {
		t.Errorf("refused ops changed the document: %s", jsonOf(t, d))
	}
}

func TestLookup(t *testing.T) {
	d := doc(t, `{"p":[{"t":"a"}],"n":null}`)
	if v, ok := Lookup(d, Path{"p", 0, "t"}); !ok || v != "a" {
		t.Errorf("p.0.t: %v %v", v, ok)
	}
	if v, ok := Lookup(d, Path{}); !ok || jsonOf(t, v) != jsonOf(t, d) {
		t.Errorf("root: %v %v", v, ok)
	}
	for _, p := range []Path{{"q"}, {"p", 1}, {"p", "k"}, {"p", 0, "t", "u"}, {"n"}} {
		if v, ok := Lookup(d, p); ok {
			t.Errorf("%v: found %v", p, v)
		}
	}
}
