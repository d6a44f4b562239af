package pinboard

import (
	"errors"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pinnedd/pinnedd/internal/httpx"
	"github.com/pinnedd/pinnedd/plugins"
)

// Label values of pinned_attestation_failures_total{reason}, each exported
// at 0 from the start (the README's metric table names them too).
const (
	attestMissing   = "missing"
	attestMalformed = "malformed"
	attestForged    = "forged"
	attestExpired   = "expired"
	attestReplayed  = "replayed"
	attestNoKey     = "no-key" // no cluster secret replicated here yet
)

// AttestReasons are pinned_attestation_failures_total's reasons.
var AttestReasons = []string{attestMissing, attestMalformed, attestForged, attestExpired, attestReplayed, attestNoKey}

// OwnerGate checks the attestations addressed to this node's worker and
// spends each once: every owner-side route (the front door's instance and
// wake routes, the API's stats and wind-down) admits a peer's request
// through it, so one replay cache and one failure count cover them all.
type OwnerGate struct {
	self *Self
	// verifier checks attestations and remembers the nonces spent.
	verifier Verifier
	failures *prometheus.CounterVec
}

// NewOwnerGate is the gate for self's worker, accepting attestations up to
// window old (0: DefaultAttestationWindow).
func NewOwnerGate(self *Self, window time.Duration) *OwnerGate {
	g := &OwnerGate{self: self, verifier: Verifier{Window: window},
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pinned_attestation_failures_total",
			Help: "Owner-side requests refused for their attestation, by reason."}, []string{"reason"})}
	for _, reason := range AttestReasons {
		g.failures.WithLabelValues(reason)
	}
	return g
}

// Collectors are the gate's metrics, for the registry.
func (g *OwnerGate) Collectors() []prometheus.Collector { return []prometheus.Collector{g.failures} }

// Admit checks r's attestation for this worker over signedPath (the
// escaped path, with the query when the signer included it) and spends
// it. A bad one is counted and answered 403; only then does it return
// false.
func (g *OwnerGate) Admit(w http.ResponseWriter, r *http.Request, signedPath string) (Attestation, bool) {
	now := time.Now()
	att, err := g.Check(r.Header.Get(AttestationHeader), r.Method, signedPath, now)
	if err == nil {
		err = g.Spend(att, now)
	}
	if err != nil {
		g.Refuse(w, err)
		return Attestation{}, false
	}
	return att, true
}

// Refuse answers 403 for an attestation Check or Spend refused with err,
// and counts why.
func (g *OwnerGate) Refuse(w http.ResponseWriter, err error) {
	g.failures.WithLabelValues(attestOutcome(err)).Inc()
	// In-band: a forwarder whose replica named a session the owner does
	// not hold asks the leader again (plugins.ClassifyAnswer).
	w.Header().Set(plugins.HeaderRefusal, plugins.RefusalAttestation)
	httpx.WriteError(w, http.StatusForbidden, "invalid attestation", 0)
}

// Spend spends a checked attestation's nonce: an error if it was spent.
func (g *OwnerGate) Spend(a Attestation, now time.Time) error { return g.verifier.Spend(a, now) }

// Check is Verifier.Check for a request to this node's worker, under the
// keys it accepts (Worker.attestKeys): its session's key, the previous
// session's for one attestation window after a re-registration (front
// doors whose replica has not applied the new session yet sign with it),
// and the cluster secret itself, which only nodes hold (nodes of an older
// version sign with it). The nonce is not spent.
func (g *OwnerGate) Check(header, method, path string, now time.Time) (Attestation, error) {
	var keys [3][]byte
	if w := g.self.Worker(); w != nil {
		keys[0], keys[1] = w.attestKeys(now, g.verifier.window())
	}
	keys[2] = g.self.dir.Machine().Secret()
	err := ErrAttestationNoKey
	for _, k := range keys {
		if len(k) == 0 {
			continue
		}
		var a Attestation
		if a, err = g.verifier.Check(k, header, g.self.ID(), method, path, now); !errors.Is(err, ErrAttestationForged) {
			return a, err // valid, or bad whatever the key (missing, malformed, expired)
		}
	}
	if header == "" {
		return Attestation{}, ErrAttestationMissing
	}
	return Attestation{}, err
}

// attestOutcome is the pinned_attestation_failures_total reason for err.
func attestOutcome(err error) string {
	switch {
	case errors.Is(err, ErrAttestationMissing):
		return attestMissing
	case errors.Is(err, ErrAttestationExpired):
		return attestExpired
	case errors.Is(err, ErrAttestationReplayed):
		return attestReplayed
	case errors.Is(err, ErrAttestationMalformed):
		return attestMalformed
	case errors.Is(err, ErrAttestationNoKey):
		return attestNoKey
	default:
		return attestForged
	}
}
