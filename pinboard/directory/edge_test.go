package directory

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// A batch stores each sub-command's length as a varint in front of it;
// around 128 bytes that length takes one byte or two, and every size
// must come back as written.
func TestBatchSubCommandLengthsAroundOneByte(t *testing.T) {
	base := len(Encode(UndrainWorker{ClientID: ""})) - 1 // type byte + empty id
	for n := 120; n <= 129; n++ {                        // the id's own length stays one byte
		id := strings.Repeat("c", n-base) // sub-command of n bytes
		sub := UndrainWorker{ClientID: id}
		if got := len(Encode(sub)) - 1; got != n {
			t.Fatalf("sub-command of %d bytes, want %d", got, n)
		}
		b := Encode(Batch{Commands: []Command{sub, UndrainWorker{ClientID: "z"}}})
		c, err := DecodeCommand(b)
		if err != nil {
			t.Fatalf("%d-byte sub-command: %v", n, err)
		}
		bc := c.(Batch)
		if len(bc.Commands) != 2 || bc.Commands[0].(UndrainWorker).ClientID != id || bc.Commands[1].(UndrainWorker).ClientID != "z" {
			t.Fatalf("%d-byte sub-command decoded as %+v", n, bc)
		}
	}
}

// Every field of a known command is required: any prefix of one is
// malformed, never a command with zero values in the missing fields.
func TestTruncatedCommandsAreMalformed(t *testing.T) {
	for _, c := range []Command{
		Init{Secret: []byte{1, 2}},
		Reseal{Secret: []byte{3, 4}},
		reg("a", "s", "http://a", t0, key("x")),
		Heartbeat{ClientID: "a", SessionID: "s", Now: t0, TTLMs: ttl, Headroom: 3, ProbeOK: true},
		Deregister{ClientID: "a", SessionID: "s"},
		Claim{Key: key("x"), ClientID: "a", Now: t0, QuarantineMs: ttl},
		Release{Key: key("x"), ClientID: "a", Generation: 1 << 40},
		DrainWorker{ClientID: "a", Deadline: t0, Now: t0},
		UndrainWorker{ClientID: "a"},
		GC{Now: t0, WorkerRetentionMs: 300_000},
		Batch{Commands: []Command{claim("x", "a", t0), GC{Now: t0, WorkerRetentionMs: 300_000}}},
	} {
		b := Encode(c)
		for cut := 2; cut < len(b); cut++ {
			if got, err := DecodeCommand(b[:cut]); !errors.Is(err, ErrMalformed) {
				t.Errorf("%T cut to %d of %d bytes: %+v, %v; want ErrMalformed", c, cut, len(b), got, err)
			}
		}
	}
	// A type this version does not know needs no payload at all.
	if c, err := DecodeCommand([]byte{FormatVersion, IgnorableFlag | 60}); err != nil || !isOpaque(c, 60) {
		t.Errorf("bare unknown ignorable command: %+v, %v", c, err)
	}
	for _, b := range [][]byte{nil, {FormatVersion}, {0, 1}} {
		if _, err := DecodeCommand(b); !errors.Is(err, ErrMalformed) {
			t.Errorf("%v: %v, want ErrMalformed", b, err)
		}
	}
}

func isOpaque(c Command, code CommandType) bool {
	o, ok := c.(Opaque)
	return ok && o.Code == code && o.Ignorable && len(o.Payload) == 0
}

// An entry applied at an index already applied (a replay) is refused and
// changes nothing, however valid the command.
func TestSameIndexTwiceIsRefused(t *testing.T) {
	n := fleet(t)
	before := n.snapshot()
	r, err := DecodeResult(n.m.Apply(n.idx, Encode(claim("x", "a", t0+1))))
	if err != nil || r.Code != CodeError {
		t.Fatalf("replayed index %d: %+v %v", n.idx, r, err)
	}
	if !bytes.Equal(n.snapshot(), before) {
		t.Fatal("a refused replay changed the state")
	}
	if r := n.apply(claim("x", "a", t0+1)); r.Code != CodeGranted {
		t.Fatalf("next index: %+v", r)
	}
}

// A result has one encoding: a field tag given twice, or out of order, is
// malformed (two nodes must never read one answer two ways).
func TestResultTagsOnceInOrder(t *testing.T) {
	ok := EncodeResult(Result{Code: CodeGranted, Reason: "r", RemainingMs: 5})
	if _, err := DecodeResult(ok); err != nil {
		t.Fatal(err)
	}
	// Version, code, reason tag + string, remaining tag + varint, end.
	twice := []byte{resultVersion, byte(CodeGranted), tagReason, 1, 'r', tagReason, 1, 's', tagEnd}
	swapped := []byte{resultVersion, byte(CodeGranted), tagRemaining, 10, tagReason, 1, 'r', tagEnd}
	for name, b := range map[string][]byte{"tag twice": twice, "tags out of order": swapped} {
		if r, err := DecodeResult(b); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %+v, %v; want ErrMalformed", name, r, err)
		}
	}
}
