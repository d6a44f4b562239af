package statewire

import (
	"encoding/json"
	"testing"

	"github.com/pinnedd/pinnedd/statewire/wire"
)

// A stream that stops reading is cut loose once its buffer is full; the
// document keeps changing without waiting for it, and a reader that keeps
// up replays the ops into the same document.
func TestSlowStreamIsCutLooseAndOpsReplay(t *testing.T) {
	d, err := newDoc(map[string]any{"msg": map[string]any{"parts": []any{map[string]any{"text": ""}}}}, 2)
	if err != nil {
		t.Fatal(err)
	}
	snap, slow, err := d.subscribe()
	if err != nil {
		t.Fatal(err)
	}
	var f wire.Frame
	if err := json.Unmarshal(snap, &f); err != nil {
		t.Fatal(err)
	}
	var mirror any
	if err := json.Unmarshal(f.State, &mirror); err != nil {
		t.Fatal(err)
	}
	text := Path{"msg", "parts", 0, "text"}
	for _, w := range []string{"echo:", " a", " b"} {
		if err := d.AppendText(text, w); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-slow.lagged:
	default:
		t.Fatal("a stream over its buffer was not cut loose")
	}
	if d.Subscribers() != 0 {
		t.Fatalf("subscribers = %d", d.Subscribers())
	}
	// The two buffered frames replay onto the snapshot in order.
	for range 2 {
		var op wire.Frame
		if err := json.Unmarshal(<-slow.frames, &op); err != nil {
			t.Fatal(err)
		}
		for _, o := range op.Ops {
			if mirror, err = wire.Apply(mirror, o); err != nil {
				t.Fatal(err)
			}
		}
	}
	if got, _ := wire.Lookup(mirror, text); got != "echo: a" {
		t.Fatalf("replayed text %q", got)
	}
	if err := d.Update(func(tx *Tx) error {
		if err := tx.Set(Path{"msg", "parts", 1}, map[string]any{"text": "x"}); err != nil {
			return err
		}
		return tx.Delete(Path{"msg", "parts", 0})
	}); err != nil {
		t.Fatal(err)
	}
	state, version, _ := d.Snapshot()
	if string(state) != `{"msg":{"parts":[{"text":"x"}]}}` || version != 4 {
		t.Fatalf("snapshot %s v%d", state, version)
	}
	if err := d.Set(Path{"msg", "parts", 5}, 1); err == nil {
		t.Fatal("set past the end of an array succeeded")
	}
}
