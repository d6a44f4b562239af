package pinboard

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/pinnedd/pinnedd/internal/httpx"
)

// AttestationHeader carries a front door's proof that it resolved the
// placement it forwards a request under. Node-to-node requests go to the
// owner's /_pinned/i/<ns>/<id>/<rest> route, which serves nothing without
// a valid one.
const AttestationHeader = "X-Pinned-Attestation"

// DefaultAttestationWindow bounds how old (or how far in the future) an
// attestation may be; the replay cache remembers nonces this long.
const DefaultAttestationWindow = 30 * time.Second

// Attestation failures (all answered 403; nothing activates).
var (
	ErrAttestationMissing   = errors.New("attestation missing")
	ErrAttestationMalformed = errors.New("attestation malformed")
	ErrAttestationForged    = errors.New("attestation signature invalid")
	ErrAttestationExpired   = errors.New("attestation outside its time window")
	ErrAttestationReplayed  = errors.New("attestation replayed")
	ErrAttestationNoKey     = errors.New("no cluster secret yet")
)

// Attestation is what a forwarded request proves: which worker it is for,
// under which placement generation, when, for which method and path.
type Attestation struct {
	Target     string // the owner's client id
	Caller     string // the forwarding node's worker client id ("" for a host-less front door)
	Generation uint64
	At         time.Time
	Nonce      string
}

// attestMAC is HMAC-SHA256 over every field and the request line, so an
// attestation is good for one method, path and target only.
func attestMAC(key []byte, a Attestation, method, path string) []byte {
	m := hmac.New(sha256.New, key)
	fmt.Fprintf(m, "pinned-attestation-v1\n%s\n%s\n%d\n%d\n%s\n%s\n%s\n",
		a.Target, a.Caller, a.Generation, a.At.UnixMilli(), a.Nonce, method, path)
	return m.Sum(nil)
}

// Sign returns the header value attesting a for method and path (the
// escaped instance path, query included).
func Sign(key []byte, a Attestation, method, path string) string {
	if a.Nonce == "" {
		var b [12]byte
		_, _ = rand.Read(b[:])
		a.Nonce = base64.RawURLEncoding.EncodeToString(b[:])
	}
	mac := attestMAC(key, a, method, path)
	return strings.Join([]string{
		"v1", a.Target, a.Caller, strconv.FormatUint(a.Generation, 10),
		strconv.FormatInt(a.At.UnixMilli(), 10), a.Nonce, base64.RawURLEncoding.EncodeToString(mac),
	}, ".")
}

// attested checks r's attestation for this worker over signedPath (the
// escaped path, with the query when the signer included it). A bad one is
// counted and answered 403; only then does it return false.
func (f *FrontDoor) attested(w http.ResponseWriter, r *http.Request, signedPath string) (Attestation, bool) {
	att, err := f.verifier.Verify(f.cfg.Dir.Machine().Secret(), r.Header.Get(AttestationHeader), f.selfID(), r.Method, signedPath, time.Now())
	if err != nil {
		f.attestFailures.WithLabelValues(attestOutcome(err)).Inc()
		httpx.WriteError(w, http.StatusForbidden, "invalid attestation", 0)
		return Attestation{}, false
	}
	return att, true
}

// Verifier checks attestations and remembers nonces for the window, so a
// captured request cannot be replayed.
type Verifier struct {
	Window time.Duration

	mu     sync.Mutex
	seen   map[string]time.Time // nonce -> expiry
	pruned time.Time
}

// Verify checks header for method and path against key at now, for the
// worker self. On success the nonce is spent.
func (v *Verifier) Verify(key []byte, header, self, method, path string, now time.Time) (Attestation, error) {
	if header == "" {
		return Attestation{}, ErrAttestationMissing
	}
	if len(key) == 0 {
		return Attestation{}, ErrAttestationNoKey
	}
	parts := strings.Split(header, ".")
	if len(parts) != 7 || parts[0] != "v1" || parts[5] == "" || len(parts[5]) > 64 {
		return Attestation{}, ErrAttestationMalformed
	}
	gen, err1 := strconv.ParseUint(parts[3], 10, 64)
	ms, err2 := strconv.ParseInt(parts[4], 10, 64)
	mac, err3 := base64.RawURLEncoding.DecodeString(parts[6])
	if err1 != nil || err2 != nil || err3 != nil || gen == 0 {
		return Attestation{}, ErrAttestationMalformed
	}
	a := Attestation{Target: parts[1], Caller: parts[2], Generation: gen, At: time.UnixMilli(ms), Nonce: parts[5]}
	if !hmac.Equal(mac, attestMAC(key, a, method, path)) {
		return Attestation{}, ErrAttestationForged
	}
	if a.Target != self {
		return Attestation{}, fmt.Errorf("%w: for worker %s, this is %s", ErrAttestationForged, a.Target, self)
	}
	window := v.Window
	if window <= 0 {
		window = DefaultAttestationWindow
	}
	if d := now.Sub(a.At); d > window || d < -window {
		return Attestation{}, ErrAttestationExpired
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.seen == nil {
		v.seen = map[string]time.Time{}
	}
	if now.Sub(v.pruned) > window {
		for n, exp := range v.seen {
			if now.After(exp) {
				delete(v.seen, n)
			}
		}
		v.pruned = now
	}
	if _, dup := v.seen[a.Nonce]; dup {
		return Attestation{}, ErrAttestationReplayed
	}
	// The nonce must outlive the attestation's own acceptance window.
	v.seen[a.Nonce] = a.At.Add(window)
	return a, nil
}
