package directory

import (
	"reflect"
	"testing"
)

// GiveBack survives the log's encoding and removes a placement only for
// the worker's current session under the placement's generation.
func TestGiveBack(t *testing.T) {
	cmd := GiveBack{Key: Key{Env: "e", Namespace: "/jobs", ID: "j1"}, ClientID: "w1", SessionID: "s1", Generation: 1 << 40}
	got, err := DecodeCommand(Encode(cmd))
	if err != nil || !reflect.DeepEqual(got, Command(cmd)) {
		t.Fatalf("round trip: %#v %v", got, err)
	}
	if _, err := DecodeCommand(Encode(cmd)[:len(Encode(cmd))-1]); err == nil {
		t.Fatal("a truncated GiveBack decoded")
	}

	n := newNode(t)
	m, apply := n.m, n.apply
	apply(Register{ClientID: "w1", SessionID: "s1", AdvertiseURL: "http://a", Namespaces: []string{"/jobs"}, TTLMs: 60_000, Now: 1000})
	apply(Register{ClientID: "w2", SessionID: "t1", AdvertiseURL: "http://b", Namespaces: []string{"/jobs"}, TTLMs: 60_000, Now: 1000})
	key := Key{Namespace: "/jobs", ID: "j1"}
	granted := apply(Claim{Key: key, ClientID: "w1", Now: 2000})
	if granted.Code != CodeGranted {
		t.Fatalf("claim: %v", granted.Code)
	}
	gen := granted.Placement.Generation
	for _, c := range []struct {
		name string
		cmd  GiveBack
		want Code
	}{
		{"unknown client", GiveBack{Key: key, ClientID: "w9", SessionID: "s1", Generation: gen}, CodeUnknownWorker},
		{"stale session", GiveBack{Key: key, ClientID: "w1", SessionID: "s0", Generation: gen}, CodeReregister},
		{"other generation", GiveBack{Key: key, ClientID: "w1", SessionID: "s1", Generation: gen + 1}, CodeHeld},
		{"other worker", GiveBack{Key: key, ClientID: "w2", SessionID: "t1", Generation: gen}, CodeHeld},
		{"unplaced key", GiveBack{Key: Key{Namespace: "/jobs", ID: "j2"}, ClientID: "w1", SessionID: "s1", Generation: gen}, CodeNotFound},
	} {
		if r := apply(c.cmd); r.Code != c.want {
			t.Errorf("%s: %v, want %v", c.name, r.Code, c.want)
		} else if c.want == CodeHeld && r.Placement.Generation != gen {
			t.Errorf("%s: placement in force %+v", c.name, r.Placement)
		}
		if p, ok := m.Placement(key); !ok || p.Generation != gen {
			t.Fatalf("%s changed the placement", c.name)
		}
	}
	if r := apply(GiveBack{Key: key, ClientID: "w1", SessionID: "s1", Generation: gen}); r.Code != CodeOK {
		t.Fatalf("give back: %v", r.Code)
	}
	if _, ok := m.Placement(key); ok || len(m.PlacementsOf("w1")) != 0 {
		t.Fatal("given back, still placed")
	}
	if r := apply(GiveBack{Key: key, ClientID: "w1", SessionID: "s1", Generation: gen}); r.Code != CodeNotFound {
		t.Fatalf("give back again: %v", r.Code)
	}
	// A deregistered session gives back nothing.
	apply(Claim{Key: key, ClientID: "w1", Now: 3000})
	apply(Deregister{ClientID: "w1", SessionID: "s1"})
	if r := apply(GiveBack{Key: key, ClientID: "w1", SessionID: "s1", Generation: gen}); r.Code != CodeReregister {
		t.Fatalf("after deregister: %v", r.Code)
	}
}
