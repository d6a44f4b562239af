package frontdoor

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testdir"

	"github.com/pinnedd/pinnedd/pinboard"
	"github.com/pinnedd/pinnedd/plugins"

	"github.com/pinnedd/pinnedd/pinboard/directory"
	"github.com/pinnedd/pinnedd/supervisor"
)

// ownerRouteRig is newOwnerRig's front door behind a real HTTP server, with
// its directory holding: "owner" (this node's worker) and "other" (another
// node's), mine placed on owner and theirs on other. The instances run in
// a real supervisor's testhost plugin.
type ownerRouteRig struct {
	f          *FrontDoor
	local      *supervisor.Supervisor
	w          *pinboard.Worker
	srv        *httptest.Server
	secret     []byte
	m          *directory.Machine
	mine       directory.Placement
	theirs     directory.Placement
	now        int64
	nextClaimT int64 // Now of the next claim: generations follow it (ms × 1000)
}

func newOwnerRouteRig(t *testing.T) *ownerRouteRig {
	t.Helper()
	f, w, local, secret := newOwnerRig(t)
	w.SetRegisteredForTesting("", "s-owner", time.Time{}) // the session registered below
	rig := &ownerRouteRig{f: f, w: w, local: local, secret: secret, m: f.dir.Machine(), now: time.Now().UnixMilli()}
	rig.nextClaimT = rig.now + 1000
	for _, c := range []string{"owner", "other"} {
		rig.apply(t, directory.Register{ClientID: c, SessionID: "s-" + c, NodeID: "n-" + c, AdvertiseURL: "http://" + c + ".internal",
			Namespaces: []string{"/misc"}, Headroom: 10, TTLMs: time.Hour.Milliseconds(), Now: rig.now})
	}
	rig.mine = rig.place(t, "mine", "owner")
	rig.theirs = rig.place(t, "theirs", "other")
	rig.srv = httptest.NewServer(f)
	t.Cleanup(rig.srv.Close)
	return rig
}

func (rig *ownerRouteRig) apply(t *testing.T, c directory.Command) directory.Result {
	t.Helper()
	r := testdir.Apply(rig.m, rig.m.AppliedIndex()+1, c)
	if r.Code != directory.CodeOK && r.Code != directory.CodeGranted {
		t.Fatalf("%T: %v %s", c, r.Code, r.Reason)
	}
	return r
}

// place grants id to client; the generation is the claim's Now × 1000.
func (rig *ownerRouteRig) place(t *testing.T, id, client string) directory.Placement {
	t.Helper()
	rig.nextClaimT++
	return rig.apply(t, directory.Claim{Key: directory.Key{Namespace: "/misc", ID: id}, ClientID: client, Now: rig.nextClaimT - 1}).Placement
}

// call sends POST path (an owner-side route) attested for target under gen,
// signed with the cluster secret as a peer node signs it.
func (rig *ownerRouteRig) call(t *testing.T, method, path, target string, gen uint64) (int, string) {
	t.Helper()
	code, body, _ := rig.callRefusal(t, method, path, target, gen)
	return code, body
}

// callRefusal is call, with the answer's in-band refusal.
func (rig *ownerRouteRig) callRefusal(t *testing.T, method, path, target string, gen uint64) (int, string, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, rig.srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(pinboard.AttestationHeader, pinboard.Sign(rig.secret, pinboard.Attestation{Target: target, Caller: "peer", Generation: gen, At: time.Now()}, method, path))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header.Get(plugins.HeaderRefusal)
}

// live reports the generation (ns /misc, id) runs under in the plugin.
func (rig *ownerRouteRig) live(id string) (uint64, bool) {
	gen, _, live := rig.local.LiveGeneration(supervisor.Key{Namespace: "/misc", ID: id})
	return gen, live
}

// refused checks a 421 not-owner answer that activated nothing.
func (rig *ownerRouteRig) refused(t *testing.T, what string, code int, body, id string) {
	t.Helper()
	if code != http.StatusMisdirectedRequest {
		t.Errorf("%s: %d %s, want 421", what, code, body)
	}
	if gen, ok := rig.live(id); ok {
		t.Errorf("%s: activated %s under generation %d", what, id, gen)
	}
}

// The owner route serves a correctly signed attestation only for a
// placement this node's own replica shows as its own under exactly the
// attested generation. A valid signature proves a peer sent the request,
// not that the peer's view of the directory is right: an older generation
// (the peer resolved before a takeover), a newer one (our replica lags),
// or a placement of another worker must answer 421 and activate nothing,
// else two nodes run one id.
func TestOwnerRouteServesOnlyItsOwnPlacementUnderItsGeneration(t *testing.T) {
	rig := newOwnerRouteRig(t)
	g := rig.mine.Generation

	// Positive control: our placement under its generation is served, and
	// the instance activates under that generation.
	if code, body := rig.call(t, "GET", "/_pinned/i/misc/mine/pid", "owner", g); code != http.StatusOK {
		t.Fatalf("own placement, right generation: %d %s", code, body)
	}
	if gen, ok := rig.live("mine"); !ok || gen != g {
		t.Fatalf("mine live under %d (%v), want %d", gen, ok, g)
	}

	// Placed on another worker, attested for us under that placement's
	// generation (a peer whose replica named us wrongly).
	code, body := rig.call(t, "GET", "/_pinned/i/misc/theirs/pid", "owner", rig.theirs.Generation)
	rig.refused(t, "another worker's placement", code, body, "theirs")
	code, _ = rig.call(t, "POST", "/_pinned/wake/misc/theirs", "owner", rig.theirs.Generation)
	rig.refused(t, "wake of another worker's placement", code, "", "theirs")

	// An older generation of an id now ours: the peer resolved before it
	// moved to us under a newer grant.
	old := rig.place(t, "moved", "other")
	rig.apply(t, directory.Release{Key: old.Key, ClientID: "other", Generation: old.Generation})
	rig.place(t, "moved", "owner")
	code, body = rig.call(t, "GET", "/_pinned/i/misc/moved/pid", "owner", old.Generation)
	rig.refused(t, "older generation", code, body, "moved")
	code, _ = rig.call(t, "POST", "/_pinned/wake/misc/moved", "owner", old.Generation)
	rig.refused(t, "wake under an older generation", code, "", "moved")

	// A newer generation than our replica shows (a grant it has not
	// applied yet, and never will within the wait): refused after the
	// wait, not served by the instance live under the older one.
	if code, body := rig.call(t, "GET", "/_pinned/i/misc/mine/pid", "owner", g+1); code != http.StatusMisdirectedRequest {
		t.Errorf("newer generation than the replica's and the live instance's: %d %s, want 421", code, body)
	}
	if gen, ok := rig.live("mine"); !ok || gen != g {
		t.Errorf("mine live under %d (%v) after a request for a newer generation, want %d", gen, ok, g)
	}
	code, body = rig.call(t, "GET", "/_pinned/i/misc/theirs/pid", "owner", rig.theirs.Generation+1)
	rig.refused(t, "newer generation of another worker's placement", code, body, "theirs")
	if _, ok := rig.live("moved"); ok {
		t.Errorf("moved activated by requests for other generations")
	}

	// Attested for another worker altogether: the signature binds the
	// target, so it is not ours to check further.
	// In-band, so that a forwarder whose replica named a session we do
	// not hold (we re-registered a moment ago) asks the leader again.
	if code, body, refusal := rig.callRefusal(t, "GET", "/_pinned/i/misc/theirs/pid", "other", rig.theirs.Generation); code != http.StatusForbidden || refusal != plugins.RefusalAttestation {
		t.Errorf("attested for another target: %d %s (refusal %q), want 403 refusal %q", code, body, refusal, plugins.RefusalAttestation)
	}

	// A live instance under a newer generation than the attested one (the
	// peer resolved before our own re-grant): 421, and the live instance
	// keeps its generation.
	if code, body := rig.call(t, "GET", "/_pinned/i/misc/mine/pid", "owner", g-1); code != http.StatusMisdirectedRequest {
		t.Errorf("live instance, older attested generation: %d %s, want 421", code, body)
	}
	if gen, ok := rig.live("mine"); !ok || gen != g {
		t.Errorf("mine live under %d (%v) after a stale request, want %d", gen, ok, g)
	}
}

// A replica that lags: the peer resolved a grant our replica applies only
// while the request waits. Until then nothing activates; once it shows the
// placement as ours under the attested generation, the request is served.
func TestOwnerRouteWaitsForALaggingReplica(t *testing.T) {
	rig := newOwnerRouteRig(t)
	gen := uint64(rig.nextClaimT) * 1000 // what the next claim grants

	type answer struct {
		code int
		body string
	}
	done := make(chan answer, 1)
	go func() {
		code, body := rig.call(t, "GET", "/_pinned/i/misc/late/pid", "owner", gen)
		done <- answer{code, body}
	}()
	// The request is in: nothing may run before the grant is applied.
	select {
	case a := <-done:
		t.Fatalf("answered before the replica showed the placement: %d %s", a.code, a.body)
	case <-time.After(200 * time.Millisecond):
	}
	if g, ok := rig.live("late"); ok {
		t.Fatalf("activated under %d before the replica showed the placement", g)
	}
	if p := rig.place(t, "late", "owner"); p.Generation != gen {
		t.Fatalf("granted %d, want %d", p.Generation, gen)
	}
	select {
	case a := <-done:
		if a.code != http.StatusOK {
			t.Fatalf("after the replica caught up: %d %s, want 200", a.code, a.body)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no answer 10 s after the replica caught up")
	}
	if g, ok := rig.live("late"); !ok || g != gen {
		t.Fatalf("late live under %d (%v), want %d", g, ok, gen)
	}

	// The same wait for a grant that goes to another worker ends in 421.
	gen = uint64(rig.nextClaimT) * 1000
	go func() {
		code, body := rig.call(t, "GET", "/_pinned/i/misc/elsewhere/pid", "owner", gen)
		done <- answer{code, body}
	}()
	select {
	case a := <-done:
		t.Fatalf("answered before the replica showed the placement: %d %s", a.code, a.body)
	case <-time.After(200 * time.Millisecond):
	}
	rig.place(t, "elsewhere", "other")
	a := <-done
	rig.refused(t, "lagging replica, placed elsewhere", a.code, a.body, "elsewhere")
}

// After a re-registration (a partition healed: the old session lapsed, an
// id moved meanwhile), a replica that has not applied the new session may
// still show the moved id as ours under its old generation. Nothing
// activates until the replica shows our session; then the replica also
// shows the move, and the request is refused.
func TestOwnerRouteWaitsForItsOwnSession(t *testing.T) {
	rig := newOwnerRouteRig(t)
	old := rig.place(t, "moved", "owner")
	rig.w.SetRegisteredForTesting("", "s-owner-2", time.Time{}) // re-registered; the replica has not applied it
	type answer struct {
		code int
		body string
	}
	done := make(chan answer, 1)
	go func() {
		code, body := rig.call(t, "GET", "/_pinned/i/misc/moved/pid", "owner", old.Generation)
		done <- answer{code, body}
	}()
	select {
	case a := <-done:
		t.Fatalf("answered before the replica showed this worker's session: %d %s", a.code, a.body)
	case <-time.After(200 * time.Millisecond):
	}
	if g, ok := rig.live("moved"); ok {
		t.Fatalf("activated under %d on a replica older than this worker's session", g)
	}
	// What the log holds in this order: the move, then the re-registration.
	rig.nextClaimT = rig.now + 2*time.Hour.Milliseconds() // past the old session's lease
	rig.apply(t, directory.Register{ClientID: "other", SessionID: "s-other-2", NodeID: "n-other", AdvertiseURL: "http://other.internal",
		Namespaces: []string{"/misc"}, Headroom: 10, TTLMs: time.Hour.Milliseconds(), Now: rig.nextClaimT})
	rig.apply(t, directory.Claim{Key: old.Key, ClientID: "other", Now: rig.nextClaimT})
	rig.apply(t, directory.Register{ClientID: "owner", SessionID: "s-owner-2", NodeID: "n-owner", AdvertiseURL: "http://owner.internal",
		Namespaces: []string{"/misc"}, Headroom: 10, TTLMs: time.Hour.Milliseconds(), Now: rig.nextClaimT})
	a := <-done
	rig.refused(t, "a moved id on a replica catching up with a re-registration", a.code, a.body, "moved")
}

// A draining node activates nothing: the owner route refuses an id not
// live here in-band at once (503, draining) instead of waiting for its
// replica to show the placement, which held the forwarder until its head
// wait ended in a 504 while the node shut down.
func TestOwnerRouteRefusesAtOnceWhileDraining(t *testing.T) {
	rig := newOwnerRouteRig(t)
	rig.local.SetDrain(supervisor.DrainLocal, time.Now().Add(time.Minute), false)
	gen := uint64(rig.nextClaimT) * 1000 // a grant the replica has not applied
	start := time.Now()
	code, body := rig.call(t, "GET", "/_pinned/i/misc/late/pid", "owner", gen)
	if took := time.Since(start); took > time.Second {
		t.Errorf("answered after %s: it waited for the placement", took)
	}
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "draining") {
		t.Fatalf("draining owner: %d %s, want 503 draining", code, body)
	}
	if g, ok := rig.live("late"); ok {
		t.Fatalf("activated under %d while draining", g)
	}
}
