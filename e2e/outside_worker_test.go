package e2e

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testutil"
)

// An outside worker, written from pinboard/REGISTRY.md alone: it speaks
// only HTTP to a real fleet of two pinnedd nodes, registers with the
// challenge, heartbeats, verifies every request it is sent with the key
// its register answer gave it, refuses a copied header sent straight to it
// (and one made for another worker), and gives an id back.
func TestOutsideWorker(t *testing.T) {
	n1 := newNode(t, "n1", "--bootstrap").start(t, true)
	n2 := newNode(t, "n2", "--join", n1.url()).start(t, true)
	for _, n := range []*node{n1, n2} {
		testutil.WaitFor(t, 10*time.Second, n.id+" sees 2 workers", func() bool { return len(liveWorkers(t, n)) == 2 })
	}

	a := startOutsideWorker(t, "outside-a", "/jobs", n2.url())
	b := startOutsideWorker(t, "outside-b", "/tasks", n1.url())

	// A namespace only a serves: its ids are placed on a, once the fresh
	// directory's quarantine (one lease TTL) is over.
	var first outsideAnswer
	testutil.WaitFor(t, 15*time.Second, "/jobs/j1 served by the outside worker", func() bool {
		r := n1.a.MustDo("GET", "/jobs/j1/hello?x=1", "")
		return r.Code == 200 && r.JSONErr(&first) == nil
	})
	if first.Worker != "outside-a" || first.Generation == 0 || first.Path != "/_pinned/i/jobs/j1/hello?x=1" {
		t.Fatalf("first answer: %+v", first)
	}
	// Through the other node too: same placement, verified again.
	var again outsideAnswer
	r := n2.a.MustDo("GET", "/jobs/j1/hello", "")
	if r.Code != 200 || r.JSONErr(&again) != nil || again.Generation != first.Generation {
		t.Fatalf("through n2: %d %s", r.Code, r.Body)
	}

	// The header that reached a, copied and sent straight to it: refused.
	hdr, path := a.last()
	if got := a.direct(t, path, hdr); got.Code != http.StatusForbidden || !strings.Contains(got.Body, "replayed") {
		t.Fatalf("copied header replayed to the worker: %d %s", got.Code, got.Body)
	}
	if got := a.direct(t, path, ""); got.Code != http.StatusForbidden {
		t.Fatalf("no header: %d %s", got.Code, got.Body)
	}
	// A header made for b, fresh (b's own check never saw it): a refuses it.
	testutil.WaitFor(t, 10*time.Second, "/tasks/t1 served by b", func() bool {
		return n2.a.MustDo("GET", "/tasks/t1/hello", "").Code == 200
	})
	bh, bpath := b.last()
	b.forget() // so the header would still be good at b: a must refuse it for what it is
	if got := a.direct(t, bpath, bh); got.Code != http.StatusForbidden || !strings.Contains(got.Body, "not for this worker") {
		t.Fatalf("b's header sent to a: %d %s", got.Code, got.Body)
	}
	if got := b.direct(t, bpath, bh); got.Code != http.StatusOK {
		t.Fatalf("b's header sent to b once: %d %s", got.Code, got.Body)
	}

	// The operator's wind-down reaches a, which answers how many instances
	// it now winds down.
	r = n1.a.MustDo("POST", "/registry/wind_down", `{"namespace":"/jobs","id":"j1","deadline":0}`)
	var wd struct {
		OK        bool `json:"ok"`
		Instances int  `json:"instances"`
	}
	if r.Code != 200 || r.JSONErr(&wd) != nil || !wd.OK || wd.Instances != 1 {
		t.Fatalf("wind_down: %d %s", r.Code, r.Body)
	}
	// /registry/stats shows a's own answer to its (verified) stats call.
	r = n2.a.MustDo("GET", "/registry/stats", "")
	if r.Code != 200 || !strings.Contains(r.Body, `"outsideInstances":1`) {
		t.Fatalf("registry stats: %d %s", r.Code, r.Body)
	}

	// a evicts j1 and gives the id back, without deregistering.
	if got := a.release(t, "/jobs", "j1", first.Generation); got.Code != 200 || !strings.Contains(got.Body, `"released":true`) {
		t.Fatalf("release: %d %s", got.Code, got.Body)
	}
	if got := a.release(t, "/jobs", "j1", first.Generation); got.Code != 200 || !strings.Contains(got.Body, `"released":false`) {
		t.Fatalf("release again: %d %s", got.Code, got.Body)
	}
	// The next request places it anew: a new generation, on a.
	var next outsideAnswer
	testutil.WaitFor(t, 10*time.Second, "/jobs/j1 placed anew", func() bool {
		r := n2.a.MustDo("GET", "/jobs/j1/hello", "")
		return r.Code == 200 && r.JSONErr(&next) == nil && next.Generation != first.Generation
	})
	if next.Generation < first.Generation || next.Worker != "outside-a" {
		t.Fatalf("re-placed: %+v after %+v", next, first)
	}
	// The old generation's give-back leaves the new placement alone.
	if got := a.release(t, "/jobs", "j1", first.Generation); got.Code != http.StatusConflict {
		t.Fatalf("stale release: %d %s", got.Code, got.Body)
	}
	if a.failures() != 0 || b.failures() != 0 {
		t.Fatalf("forwarded requests the workers could not verify: a %d, b %d", a.failures(), b.failures())
	}
}

// outsideAnswer is what the outside worker answers an instance request.
type outsideAnswer struct {
	Worker     string `json:"worker"`
	Generation uint64 `json:"generation"`
	Path       string `json:"path"`
}

// outsideWorker is a registry client and owner route in this process,
// using nothing of pinnedd's but its HTTP API.
type outsideWorker struct {
	clientID, namespace, registry string
	srv                           *httptest.Server

	mu         sync.Mutex
	challenges map[string]string
	sessionID  string
	key        []byte
	nonces     map[string]time.Time // spent nonce -> when it may be forgotten
	live       map[string]bool      // ids this worker runs
	lastHeader string
	lastPath   string
	bad        int // forwarded requests (through a front door) it could not verify
}

func startOutsideWorker(t *testing.T, clientID, namespace, registry string) *outsideWorker {
	t.Helper()
	w := &outsideWorker{clientID: clientID, namespace: namespace, registry: registry,
		challenges: map[string]string{}, nonces: map[string]time.Time{}, live: map[string]bool{}}
	w.srv = httptest.NewServer(http.HandlerFunc(w.serve))
	t.Cleanup(w.srv.Close)
	if err := w.register(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go w.heartbeats(ctx, done)
	t.Cleanup(func() {
		cancel()
		<-done
		w.mu.Lock()
		sid := w.sessionID
		w.mu.Unlock()
		body, _ := json.Marshal(map[string]string{"clientId": w.clientID, "sessionId": sid})
		_, _ = testutil.Do(context.Background(), "POST", w.registry+"/registry/deregister", string(body), workerAuth)
	})
	return w
}

var workerAuth = map[string]string{"Authorization": "Bearer " + testutil.Token}

func outsideNonce() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// challenge mints a pair for one register or heartbeat call.
func (w *outsideWorker) challenge() (string, string) {
	c, v := outsideNonce(), outsideNonce()
	w.mu.Lock()
	w.challenges[c] = v
	w.mu.Unlock()
	return c, v
}

func (w *outsideWorker) register() error {
	c, v := w.challenge()
	body, _ := json.Marshal(map[string]any{
		"clientId": w.clientID, "advertiseUrl": w.srv.URL, "namespaces": []string{w.namespace},
		"headroom": 100, "challenge": c, "challengeValue": v,
	})
	r, err := testutil.Do(context.Background(), "POST", w.registry+"/registry/register", string(body), workerAuth)
	if err != nil {
		return err
	}
	var ack struct {
		SessionID      string `json:"sessionId"`
		AttestationKey string `json:"attestationKey"`
		ExpiresInMs    int64  `json:"expiresInMs"`
	}
	if r.Code != 200 || r.JSONErr(&ack) != nil {
		return fmt.Errorf("register: %d %s", r.Code, r.Body)
	}
	key, err := base64.RawURLEncoding.DecodeString(ack.AttestationKey)
	if err != nil || len(key) != 32 || ack.SessionID == "" || ack.ExpiresInMs <= 0 {
		return fmt.Errorf("register answer without a session key: %s", r.Body)
	}
	w.mu.Lock()
	w.sessionID, w.key = ack.SessionID, key
	w.mu.Unlock()
	return nil
}

// heartbeats renews the lease every 500 ms (the fleet's TTL is 3 s); a
// 409 reregister registers again.
func (w *outsideWorker) heartbeats(ctx context.Context, done chan struct{}) {
	defer close(done)
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c, v := w.challenge()
		w.mu.Lock()
		sid := w.sessionID
		w.mu.Unlock()
		body, _ := json.Marshal(map[string]any{"clientId": w.clientID, "sessionId": sid, "headroom": 100, "challenge": c, "challengeValue": v})
		r, err := testutil.Do(ctx, "POST", w.registry+"/registry/heartbeat", string(body), workerAuth)
		if err == nil && r.Code == http.StatusConflict && strings.Contains(r.Body, `"reregister":true`) {
			_ = w.register()
		}
	}
}

// verify is REGISTRY.md's check, step by step.
func (w *outsideWorker) verify(r *http.Request, signedPath string, now time.Time) (uint64, error) {
	h := r.Header.Get("X-Pinned-Attestation")
	f := strings.Split(h, ".")
	if len(f) != 7 || f[0] != "v1" {
		return 0, errors.New("malformed attestation")
	}
	target, caller, genS, msS, nonce, macS := f[1], f[2], f[3], f[4], f[5], f[6]
	gen, err1 := strconv.ParseUint(genS, 10, 64)
	ms, err2 := strconv.ParseInt(msS, 10, 64)
	mac, err3 := base64.RawURLEncoding.DecodeString(macS)
	if err1 != nil || err2 != nil || err3 != nil || gen == 0 || len(mac) != 32 || nonce == "" || len(nonce) > 64 {
		return 0, errors.New("malformed attestation")
	}
	if target != w.clientID {
		return 0, errors.New("attestation not for this worker")
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	m := hmac.New(sha256.New, w.key)
	m.Write([]byte("pinned-attestation-v1\n" + target + "\n" + caller + "\n" + genS + "\n" + msS + "\n" + nonce + "\n" + r.Method + "\n" + signedPath + "\n"))
	if !hmac.Equal(mac, m.Sum(nil)) {
		return 0, errors.New("attestation signature invalid")
	}
	at := time.UnixMilli(ms)
	if d := now.Sub(at); d > 30*time.Second || d < -30*time.Second {
		return 0, errors.New("attestation outside its time window")
	}
	for n, forget := range w.nonces {
		if now.After(forget) {
			delete(w.nonces, n)
		}
	}
	if _, spent := w.nonces[nonce]; spent {
		return 0, errors.New("attestation replayed")
	}
	w.nonces[nonce] = at.Add(30 * time.Second)
	return gen, nil
}

func (w *outsideWorker) serve(rw http.ResponseWriter, r *http.Request) {
	reply := func(code int, v any) {
		rw.Header().Set("Content-Type", "application/json")
		rw.WriteHeader(code)
		_ = json.NewEncoder(rw).Encode(v)
	}
	if r.URL.Path == "/_pinned/challenge" {
		w.mu.Lock()
		v, ok := w.challenges[r.URL.Query().Get("challenge")]
		w.mu.Unlock()
		if !ok {
			reply(404, map[string]string{"error": "unknown challenge"})
			return
		}
		_, _ = rw.Write([]byte(v))
		return
	}
	signed := r.URL.EscapedPath()
	if r.URL.RawQuery != "" {
		signed += "?" + r.URL.RawQuery
	}
	gen, err := w.verify(r, signed, time.Now())
	if err != nil {
		if r.Header.Get("X-Forwarded-Host") != "" && r.Header.Get("X-Test-Direct") == "" {
			w.mu.Lock()
			w.bad++
			w.mu.Unlock()
		}
		reply(http.StatusForbidden, map[string]string{"error": err.Error()})
		return
	}
	switch {
	case r.Method == "POST" && r.URL.Path == "/_pinned/wind_down":
		var req struct {
			Namespace string `json:"namespace"`
			ID        string `json:"id"`
		}
		_ = json.NewDecoder(r.Body).Decode(&req)
		w.mu.Lock()
		n := 0
		if req.Namespace == w.namespace && (req.ID == "" || w.live[req.ID]) {
			n = len(w.live)
			if req.ID != "" {
				n = 1
			}
		}
		w.mu.Unlock()
		reply(200, map[string]int{"instances": n})
	case r.Method == "GET" && r.URL.Path == "/_pinned/stats":
		w.mu.Lock()
		n := len(w.live)
		w.mu.Unlock()
		reply(200, map[string]int{"outsideInstances": n})
	case strings.HasPrefix(r.URL.Path, "/_pinned/i"+w.namespace+"/"):
		id, _, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/_pinned/i"+w.namespace+"/"), "/")
		w.mu.Lock()
		w.live[id] = true
		if r.Header.Get("X-Test-Direct") == "" {
			w.lastHeader, w.lastPath = r.Header.Get("X-Pinned-Attestation"), signed
		}
		w.mu.Unlock()
		reply(200, outsideAnswer{Worker: w.clientID, Generation: gen, Path: signed})
	default:
		reply(404, map[string]string{"error": "unknown route"})
	}
}

// last is the attestation header and signed path of the last instance
// request a front door forwarded here.
func (w *outsideWorker) last() (string, string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lastHeader, w.lastPath
}

// forget clears the spent nonces, as if this worker had never seen them.
func (w *outsideWorker) forget() {
	w.mu.Lock()
	clear(w.nonces)
	w.mu.Unlock()
}

func (w *outsideWorker) failures() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.bad
}

// direct sends GET path straight to the worker with header as its
// attestation, as someone who copied it would.
func (w *outsideWorker) direct(t *testing.T, path, header string) testutil.Response {
	t.Helper()
	h := map[string]string{"X-Test-Direct": "1"}
	if header != "" {
		h["X-Pinned-Attestation"] = header
	}
	r, err := testutil.Do(context.Background(), "GET", w.srv.URL+path, "", h)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// release gives back one id (POST /registry/release).
func (w *outsideWorker) release(t *testing.T, ns, id string, gen uint64) testutil.Response {
	t.Helper()
	w.mu.Lock()
	sid := w.sessionID
	w.mu.Unlock()
	body, _ := json.Marshal(map[string]any{"clientId": w.clientID, "sessionId": sid, "namespace": ns, "id": id, "generation": gen})
	r, err := testutil.Do(context.Background(), "POST", w.registry+"/registry/release", string(body), workerAuth)
	if err != nil {
		t.Fatal(err)
	}
	return r
}
