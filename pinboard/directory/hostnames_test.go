package directory

import (
	"slices"
	"strings"
	"testing"
)

const threads = "/threads"

func route(host, env string, epoch uint64) Route {
	return Route{Hostname: host, Namespace: threads, Env: env, Epoch: epoch}
}

func regRoutes(client, session string, now int64, rs ...Route) RegisterRoutes {
	return RegisterRoutes{Register: Register{ClientID: client, SessionID: session, NodeID: "n-" + client,
		AdvertiseURL: "http://" + client, Headroom: 1024, TTLMs: ttl, Now: now}, Routes: rs}
}

func claimVia(host, env, id, client string, now int64) ClaimRoute {
	return ClaimRoute{Claim: Claim{Key: Key{Env: env, Namespace: threads, ID: id}, ClientID: client, Now: now},
		Hostname: host, TTLMs: ttl}
}

func must(t *testing.T, r Result, code Code) Result {
	t.Helper()
	if r.Code != code {
		t.Fatalf("got %v (%s), want %v: %+v", r.Code, r.Reason, code, r)
	}
	return r
}

const (
	pr41 = "pr-41.preview.example.com"
	pr42 = "pr-42.preview.example.com"
)

// The seeds' preview scenario: two hostnames, first in separate envs,
// then sharing one; a disagreeing registration at the same epoch is 409
// with the seeds' words, a higher epoch displaces.
func TestHostnameBindingsAndEpochs(t *testing.T) {
	n := newNode(t)
	must(t, n.apply(regRoutes("a", "sa", t0, route(pr41, "pr-41", 0))), CodeOK)
	must(t, n.apply(regRoutes("b", "sb", t0, route(pr42, "pr-42", 0))), CodeOK)

	// Separate envs: the same id is two instances.
	g41 := must(t, n.apply(claimVia(pr41, "pr-41", "x", "a", t0+1)), CodeGranted)
	g42 := must(t, n.apply(claimVia(pr42, "pr-42", "x", "b", t0+1)), CodeGranted)
	if g41.Placement.Hostname != pr41 || g42.Placement.Key.Env != "pr-42" {
		t.Fatalf("placements %+v %+v", g41.Placement, g42.Placement)
	}
	// A claim with the wrong env (a stale read) is a conflict, not a grant.
	must(t, n.apply(claimVia(pr41, "pr-42", "y", "a", t0+2)), CodeConflict)
	// No binding at all: no live workers for the hostname.
	r := must(t, n.apply(claimVia("pr-43.preview.example.com", "pr-43", "x", "a", t0+2)), CodeIneligible)
	if r.Reason != ReasonNoHostname {
		t.Fatalf("unbound hostname: %q", r.Reason)
	}

	// c registers pr-42 under another env at the same epoch: refused whole.
	r = must(t, n.apply(regRoutes("c", "sc", t0+3, route(pr42, "shared", 0))), CodeBindingConflict)
	want := "hostname " + pr42 + "/threads is bound to env pr-42 at epoch 0, not shared — register with a higher epoch to displace"
	if r.Reason != want {
		t.Fatalf("conflict message %q, want %q", r.Reason, want)
	}
	if _, ok := n.m.Worker("c"); ok {
		t.Fatal("a refused registration left a worker behind")
	}
	// And a disagreeing takeover for an env in force.
	deny := route(pr41, "pr-41", 0)
	deny.Takeover = TakeoverDeny
	r = must(t, n.apply(regRoutes("c", "sc", t0+3, deny)), CodeBindingConflict)
	if !strings.HasPrefix(r.Reason, "env pr-41 agreed takeover wind_down at epoch 0, not deny") {
		t.Fatalf("takeover conflict message %q", r.Reason)
	}

	// At epoch 1 it displaces: b's route is superseded, new placements
	// through pr-42 wait a lease, and b learns it on its next heartbeat.
	must(t, n.apply(regRoutes("c", "sc", t0+4, route(pr42, "shared", 1))), CodeOK)
	if b, _ := n.m.Binding(pr42, threads); b.Env != "shared" || b.Epoch != 1 || b.DisplacedUntil != t0+4+ttl {
		t.Fatalf("binding after displacement %+v", b)
	}
	r = must(t, n.apply(claimVia(pr42, "shared", "z", "c", t0+5)), CodeIneligible)
	if r.Reason != ReasonDisplaced || r.RemainingMs != ttl-1 {
		t.Fatalf("claim through a displaced binding: %+v", r)
	}
	hb := must(t, n.apply(Heartbeat{ClientID: "b", SessionID: "sb", Now: t0 + 6, TTLMs: ttl, ProbeOK: true}), CodeOK)
	if len(hb.Superseded) != 1 || hb.Superseded[0].Hostname != pr42 || !hb.Superseded[0].Superseded {
		t.Fatalf("b's heartbeat after displacement: %+v", hb)
	}
	// b's ids under the old env are b's until it lets them go.
	if p, ok := n.m.Placement(g42.Placement.Key); !ok || p.Owner != "b" {
		t.Fatalf("old env's placement %+v %v", p, ok)
	}
	// Past the lease, the new env places.
	must(t, n.apply(Heartbeat{ClientID: "c", SessionID: "sc", Now: t0 + 10_000, TTLMs: ttl, ProbeOK: true}), CodeOK)
	must(t, n.apply(claimVia(pr42, "shared", "z", "c", t0+4+ttl)), CodeGranted)

	// pr-41 joins the shared env at a higher epoch: the two hostnames now
	// share ids.
	must(t, n.apply(regRoutes("a", "sa2", t0+ttl+5, route(pr41, "shared", 1))), CodeOK)
	_, cands := n.m.RouteCandidates(pr41, threads, t0+ttl+6)
	if len(cands) != 1 || cands[0].ClientID != "a" {
		t.Fatalf("candidates through pr-41: %+v", cands)
	}
	// Epochs only grow: registering the shared env at epoch 0 keeps 1.
	must(t, n.apply(regRoutes("d", "sd", t0+ttl+7, route(pr41, "shared", 0))), CodeOK)
	if b, _ := n.m.Binding(pr41, threads); b.Epoch != 1 {
		t.Fatalf("epoch went back: %+v", b)
	}
}

// A request for an id placed under another hostname of the same env meets
// the env's takeover: wind_down fences once, one lease out, and places the
// id once its holder gave it back; deny refuses while the holder lives.
func TestTakeoverWindDownAndDeny(t *testing.T) {
	for _, policy := range []TakeoverPolicy{TakeoverWindDown, TakeoverDeny} {
		t.Run(policy.String(), func(t *testing.T) {
			n := newNode(t)
			r41, r42 := route(pr41, "shared", 0), route(pr42, "shared", 0)
			r41.Takeover, r42.Takeover = policy, policy
			must(t, n.apply(regRoutes("a", "sa", t0, r41)), CodeOK)
			must(t, n.apply(regRoutes("b", "sb", t0, r42)), CodeOK)
			p := must(t, n.apply(claimVia(pr41, "shared", "x", "a", t0+1)), CodeGranted).Placement

			r := n.apply(claimVia(pr42, "shared", "x", "b", t0+2))
			if policy == TakeoverDeny {
				if r.Code != CodeHeld || r.Reason != ReasonOtherHostname || r.Placement.Owner != "a" {
					t.Fatalf("deny: %+v", r)
				}
				// Once a is gone, b takes it.
				must(t, n.apply(Heartbeat{ClientID: "b", SessionID: "sb", Now: t0 + 10_000, TTLMs: ttl, ProbeOK: true}), CodeOK)
				must(t, n.apply(claimVia(pr42, "shared", "x", "b", t0+ttl+1)), CodeGranted)
				return
			}
			if r.Code != CodeTakeover || r.Reason != ReasonFenced || r.RemainingMs != ttl || r.Placement.FenceUntil != t0+2+ttl {
				t.Fatalf("first takeover request: %+v", r)
			}
			// Fenced once: later requests wait for the same fence.
			r = must(t, n.apply(claimVia(pr42, "shared", "x", "b", t0+1002)), CodeTakeover)
			if r.Reason != "" || r.RemainingMs != ttl-1000 {
				t.Fatalf("second takeover request: %+v", r)
			}
			for _, c := range []string{"a", "b"} {
				must(t, n.apply(Heartbeat{ClientID: c, SessionID: "s" + c, Now: t0 + 10_000, TTLMs: ttl, ProbeOK: true}), CodeOK)
			}
			// The owner still holds it past the fence: asked again, not taken.
			r = must(t, n.apply(claimVia(pr42, "shared", "x", "b", t0+2+ttl)), CodeTakeover)
			if r.Reason != ReasonFencePassed || r.Placement.Owner != "a" {
				t.Fatalf("past the fence: %+v", r)
			}
			// The same hostname still reaches its holder meanwhile.
			must(t, n.apply(claimVia(pr41, "shared", "x", "a", t0+3+ttl)), CodeExisting)
			// The owner wound down and gave it back: pr-42 places it.
			must(t, n.apply(GiveBack{Key: p.Key, ClientID: "a", SessionID: "sa", Generation: p.Generation}), CodeOK)
			g := must(t, n.apply(claimVia(pr42, "shared", "x", "b", t0+4+ttl)), CodeGranted).Placement
			if g.Hostname != pr42 || g.FenceUntil != 0 || g.Generation <= p.Generation {
				t.Fatalf("re-placed %+v", g)
			}
		})
	}
}

// Bindings go with their last live worker: a new env may bind the
// hostname at epoch 0 once the old one's holders lapsed, and GC removes
// the records.
func TestBindingsCollectedWithTheirLastWorker(t *testing.T) {
	n := newNode(t)
	must(t, n.apply(regRoutes("a", "sa", t0, route(pr41, "pr-41", 3))), CodeOK)
	must(t, n.apply(regRoutes("b", "sb", t0+ttl+1, route(pr41, "other", 0))), CodeOK)
	if b, _ := n.m.Binding(pr41, threads); b.Env != "other" || b.Epoch != 0 || b.DisplacedUntil != 0 {
		t.Fatalf("rebinding after the last holder lapsed: %+v", b)
	}
	must(t, n.apply(GC{Now: t0 + 3*ttl}), CodeOK)
	if bs, es := n.m.Bindings(); len(bs) != 0 || len(es) != 0 {
		t.Fatalf("after GC: %+v %+v", bs, es)
	}
	if _, ok := n.m.Binding(pr41, threads); ok {
		t.Fatal("the lock-free read still sees the binding")
	}
}

// Bad routes change nothing.
func TestRegisterRoutesRejectsBadRoutes(t *testing.T) {
	dup := []Route{route(pr41, "e", 0), route(pr41, "f", 0)}
	twoPolicies := []Route{route(pr41, "e", 0), {Hostname: pr42, Namespace: threads, Env: "e", Takeover: TakeoverDeny}}
	for name, rs := range map[string][]Route{
		"none": nil, "no env": {{Hostname: pr41, Namespace: threads}}, "twice": dup,
		"two policies": twoPolicies, "superseded": {{Hostname: pr41, Namespace: threads, Env: "e", Superseded: true}},
	} {
		n := newNode(t)
		if r := n.apply(regRoutes("a", "sa", t0, rs...)); r.Code != CodeInvalid {
			t.Fatalf("%s: %+v", name, r)
		}
		if ws := n.m.Workers(); len(ws) != 0 {
			t.Fatalf("%s: registered %+v", name, ws)
		}
	}
	n := newNode(t)
	c := regRoutes("a", "sa", t0, route(pr41, "e", 0))
	c.Namespaces = []string{threads}
	must(t, n.apply(c), CodeInvalid)
	// A plain registration drops the routes a worker had.
	must(t, n.apply(regRoutes("a", "sa", t0, route(pr41, "e", 0))), CodeOK)
	must(t, n.apply(reg("a", "sa", "http://a", t0+1)), CodeOK)
	if w, _ := n.m.Worker("a"); len(w.Routes) != 0 || !slices.Contains(w.Namespaces, ns) {
		t.Fatalf("after a plain registration %+v", w)
	}
}
