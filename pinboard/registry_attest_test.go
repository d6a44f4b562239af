package pinboard

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testdir"
	"github.com/pinnedd/pinnedd/internal/testutil"

	"github.com/pinnedd/pinnedd/pinboard/directory"
)

// The known-answer vector REGISTRY.md gives, computed independently (with
// Python's hmac): a worker in another language checks its implementation
// against these two lines.
func TestWorkerKeyVector(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	key := WorkerKey(secret, "worker-a", "session-1")
	if got := base64.RawURLEncoding.EncodeToString(key); got != "pBEADraUkn2AdfJxZevWj5zm7F4TULTZ_o6MWrvuC9w" {
		t.Fatalf("WorkerKey = %s", got)
	}
	a := Attestation{Target: "worker-a", Caller: "node-b", Generation: 42, At: time.UnixMilli(1_800_000_000_000), Nonce: "bm9uY2UtMQ"}
	h := SignFor(secret, "session-1", a, "POST", "/_pinned/i/jobs/j1/run?x=1")
	if want := "v1.worker-a.node-b.42.1800000000000.bm9uY2UtMQ.1PdCliTXCzlCjeus-JTsbti69qfLVPHcvbDU0ego8uA"; h != want {
		t.Fatalf("SignFor = %s\nwant      %s", h, want)
	}
}

// A header signed for one session verifies with that session's key only:
// not with another session's of the same worker, not with another
// worker's, and not with the cluster secret (which no worker has).
func TestSignForVerifiesWithTheSessionKeyOnly(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	now := time.Now()
	path := "/_pinned/i/jobs/j1/run"
	sign := func() string {
		return SignFor(secret, "s1", Attestation{Target: "w1", Caller: "n1", Generation: 7, At: now}, "POST", path)
	}
	for _, c := range []struct {
		name string
		key  []byte
		self string
		want error
	}{
		{"its session's key", WorkerKey(secret, "w1", "s1"), "w1", nil},
		{"the worker's next session", WorkerKey(secret, "w1", "s2"), "w1", ErrAttestationForged},
		{"another worker's key", WorkerKey(secret, "w2", "s1"), "w2", ErrAttestationForged},
		{"the cluster secret", secret, "w1", ErrAttestationForged},
	} {
		var v Verifier
		if _, err := v.Verify(c.key, sign(), c.self, "POST", path, now); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	// A worker holding w2's key cannot make a header w1 accepts.
	forged := Sign(WorkerKey(secret, "w2", "s9"), Attestation{Target: "w1", Caller: "n1", Generation: 7, At: now}, "POST", path)
	var v Verifier
	if _, err := v.Verify(WorkerKey(secret, "w1", "s1"), forged, "w1", "POST", path, now); !errors.Is(err, ErrAttestationForged) {
		t.Fatalf("header made with another worker's key: %v", err)
	}
}

// challengeServer answers the registry's probe for one challenge pair.
func challengeServer(t *testing.T, challenge, value string) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/_pinned/challenge" || r.URL.Query().Get("challenge") != challenge {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte(value))
	}))
	t.Cleanup(srv.Close)
	return srv
}

// The register answer carries the session's key, as WorkerKey derives it
// from the cluster secret; a re-registration gets a new session and a new
// key.
func TestRegisterAnswerCarriesTheSessionKey(t *testing.T) {
	rig := newDoorRig(t, func(_ *doorRig, c *APIConfig) { c.Registry = NewRegistry(c.Dir, time.Minute) })
	worker := challengeServer(t, "c1", "v1")
	register := func() RegisterAck {
		t.Helper()
		body := `{"clientId":"outside-1","advertiseUrl":"` + worker.URL + `","namespaces":["/jobs"],"headroom":5,"challenge":"c1","challengeValue":"v1"}`
		code, out, _ := rig.call(t, "POST", "/registry/register", "op-token", body)
		if code != http.StatusOK {
			t.Fatalf("register: %d %s", code, out)
		}
		var ack RegisterAck
		if err := json.Unmarshal([]byte(out), &ack); err != nil {
			t.Fatal(err)
		}
		return ack
	}
	first := register()
	secret := rig.m.Secret()
	if want := base64.RawURLEncoding.EncodeToString(WorkerKey(secret, "outside-1", first.SessionID)); first.AttestationKey != want {
		t.Fatalf("attestationKey %q, want WorkerKey(secret, clientId, sessionId) = %q", first.AttestationKey, want)
	}
	second := register()
	if second.SessionID == first.SessionID || second.AttestationKey == first.AttestationKey {
		t.Fatalf("re-registration kept session %s / key %s", second.SessionID, second.AttestationKey)
	}

	// A '.' would split the attestation's fields: refused, nothing registered.
	body := `{"clientId":"outside.2","advertiseUrl":"` + worker.URL + `","namespaces":["/jobs"],"headroom":5,"challenge":"c1","challengeValue":"v1"}`
	code, out, _ := rig.call(t, "POST", "/registry/register", "op-token", body)
	if code != http.StatusBadRequest || !strings.Contains(testutil.ErrorOf(t, out), "clientId must be") {
		t.Fatalf("clientId with a dot: %d %s", code, out)
	}
	if _, ok := rig.m.Worker("outside.2"); ok {
		t.Fatal("a refused registration registered")
	}
}

// A registry whose replica has no cluster secret registers nothing and
// answers 503 + Retry-After: the key could not be made.
func TestRegisterWithoutSecretIsRefused(t *testing.T) {
	m := directory.New()
	dir := NewDirectory(m, &testdir.Applier{M: m})
	t.Cleanup(dir.Close)
	self := NewSelf(dir, nil)
	f := http.NewServeMux()
	NewAPI(APIConfig{Dir: dir, Self: self, Gate: NewOwnerGate(self, 0), Peers: advertisePeers{},
		Tokens: NewTokens("op-token"), Registry: NewRegistry(dir, time.Minute)}).Mount(f)
	worker := challengeServer(t, "c1", "v1")
	req := httptest.NewRequest("POST", "/registry/register", strings.NewReader(
		`{"clientId":"outside-1","advertiseUrl":"`+worker.URL+`","namespaces":["/jobs"],"headroom":5,"challenge":"c1","challengeValue":"v1"}`))
	req.Header.Set("Authorization", "Bearer op-token")
	rec := httptest.NewRecorder()
	f.ServeHTTP(rec, req)
	if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") == "" || !strings.Contains(rec.Body.String(), "nothing was registered") {
		t.Fatalf("register without a secret: %d %v %s", rec.Code, rec.Header(), rec.Body)
	}
	if _, ok := m.Worker("outside-1"); ok {
		t.Fatal("registered without a key")
	}
}

// pinnedd's own owner side follows the same rule as an outside worker: it
// checks with the key its register answer gave it; after a
// re-registration, the previous session's key for one attestation window
// (a front door whose replica lags still signs with it), then no more.
func TestOwnerChecksItsSessionKeys(t *testing.T) {
	rig, w := sessionRig(t)
	secret := rig.m.Secret()
	self := w.ClientID()
	path := "/_pinned/i/misc/x/y"
	signed := func(session string, at time.Time) string {
		return SignFor(secret, session, Attestation{Target: self, Caller: "peer", Generation: 3, At: at}, "GET", path)
	}
	first := w.SessionID()
	now := time.Now()
	if _, err := rig.gate.Check(signed(first, now), "GET", path, now); err != nil {
		t.Fatalf("signed with the session's key: %v", err)
	}
	if _, err := rig.gate.Check(SignFor(secret, first, Attestation{Target: "someone-else", Caller: "peer", Generation: 3, At: now}, "GET", path), "GET", path, now); !errors.Is(err, ErrAttestationForged) {
		t.Fatalf("another worker's attestation: %v", err)
	}
	if err := w.register(t.Context()); err != nil {
		t.Fatal(err)
	}
	second := w.SessionID()
	if second == first {
		t.Fatal("re-registration kept the session")
	}
	now = time.Now()
	for _, s := range []string{second, first} {
		if _, err := rig.gate.Check(signed(s, now), "GET", path, now); err != nil {
			t.Fatalf("session %s right after the re-registration: %v", s, err)
		}
	}
	later := now.Add(DefaultAttestationWindow + time.Second)
	if _, err := rig.gate.Check(signed(first, later), "GET", path, later); !errors.Is(err, ErrAttestationForged) {
		t.Fatalf("the previous session's key a window later: %v", err)
	}
	if _, err := rig.gate.Check(signed(second, later), "GET", path, later); err != nil {
		t.Fatalf("the session's key a window later: %v", err)
	}
	if _, err := rig.gate.Check("", "GET", path, later); !errors.Is(err, ErrAttestationMissing) {
		t.Fatalf("no header: %v", err)
	}
}
