package pinboard

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"

	"github.com/pinnedd/pinnedd/internal/httpx"
	"github.com/pinnedd/pinnedd/passport"
	"github.com/prometheus/client_golang/prometheus"
)

// Scope is a permission a bearer token carries (passport.Scope).
type Scope = passport.Scope

// Scopes: a worker registers and heartbeats, an operator reads and acts
// on the fleet.
const (
	ScopeWorker   = passport.Worker
	ScopeOperator = passport.Operator
)

// Why a request is not authorized; Check wraps one of them, Require maps
// them to 401 (the first two) and 403.
var (
	ErrMissingToken = errors.New("missing bearer token: set PINBOARD_TOKEN / --token")
	ErrUnknownToken = errors.New("unknown token: check PINBOARD_TOKEN / --token against the agent's")
	ErrMissingScope = errors.New("token lacks the scope")
)

// Tokens authorizes bearer tokens against the deployment's passport.
// Every route that needs a scope goes through Check (Require,
// FrontDoor.RequireScope), so the answers are the same everywhere.
type Tokens struct {
	pass    *passport.Passport
	refused *prometheus.CounterVec // by key name and reason
	// loopbackAnonymous: a request with no Authorization header from a
	// loopback peer gets every scope (--dev).
	loopbackAnonymous bool
}

// NewTokens is the single-key passport of the given deployment tokens
// (passport.Single: a deployment key carries worker and operator).
func NewTokens(tokens ...string) *Tokens { return NewPassportTokens(passport.Single(tokens...)) }

// NewPassportTokens authorizes against p.
func NewPassportTokens(p *passport.Passport) *Tokens {
	t := &Tokens{pass: p, refused: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pinboard_auth_refused_total",
		Help: "Requests refused authorization, by the key's name (none: no known key) and reason: missing, unknown, scope, claims.",
	}, []string{"key", "reason"})}
	// Every series that can be counted starts at 0, so a rate or an
	// alert sees the first refusal.
	t.refused.WithLabelValues("none", "missing")
	t.refused.WithLabelValues("none", "unknown")
	for _, k := range p.Keys() {
		t.refused.WithLabelValues(k.Name, "scope")
		t.refused.WithLabelValues(k.Name, "claims")
	}
	return t
}

// Collector is the refusals' counter, for the registry.
func (t *Tokens) Collector() prometheus.Collector { return t.refused }

// keyError is a refusal of a known key: its name labels the count.
type keyError struct {
	key    string
	reason string // for the count: scope or claims
	error
}

func (e keyError) Unwrap() error { return e.error }

// Refuse answers a failed Check (WriteAuthError) and counts it.
func (t *Tokens) Refuse(w http.ResponseWriter, err error) {
	t.Count(err)
	WriteAuthError(w, err)
}

// Count counts a refusal err (from Key, Authorize or AuthorizeFleet) in
// pinboard_auth_refused_total, for a route that answers it itself (Raft's
// RPCs).
func (t *Tokens) Count(err error) {
	key, reason := "none", "unknown"
	var ke keyError
	if errors.As(err, &ke) {
		key = ke.key
	}
	switch {
	case ke.reason != "":
		reason = ke.reason
	case errors.Is(err, ErrMissingToken):
		reason = "missing"
	}
	t.refused.WithLabelValues(key, reason).Inc()
}

// refuseClaims answers 403 for a request whose key's claims do not admit
// what it names, and counts it.
func (t *Tokens) refuseClaims(w http.ResponseWriter, k *passport.Key, msg string) {
	t.refused.WithLabelValues(k.Name, "claims").Inc()
	httpx.WriteError(w, http.StatusForbidden, msg, 0)
}

// Passport is the passport t checks against.
func (t *Tokens) Passport() *passport.Passport { return t.pass }

// Grant adds token as a key of its own with only the given scopes and
// unrestricted claims, and returns t.
func (t *Tokens) Grant(token string, scopes ...Scope) *Tokens {
	t.pass.Add(&passport.Key{Name: "granted", Scopes: append([]Scope(nil), scopes...), Claims: passport.Unrestricted()}, token)
	return t
}

// AllowLoopbackAnonymous makes a request that carries no Authorization
// header at all, from a loopback peer, hold every scope: on a --dev node
// `pinnedd status` works with no token. A request that names a token is
// still checked, so a wrong one is still refused. It returns t.
func (t *Tokens) AllowLoopbackAnonymous() *Tokens {
	t.loopbackAnonymous = true
	return t
}

// loopbackKey is what an anonymous loopback request holds under
// AllowLoopbackAnonymous.
var loopbackKey = &passport.Key{Name: "loopback", Scopes: []Scope{ScopeWorker, ScopeOperator}, Claims: passport.Unrestricted()}

// Key is the passport key r's bearer token names: nil with an error
// wrapping ErrMissingToken or ErrUnknownToken whose text says what to fix.
func (t *Tokens) Key(r *http.Request) (*passport.Key, error) {
	hs := r.Header.Values("Authorization")
	if len(hs) == 0 {
		if t.loopbackAnonymous && loopbackPeer(r.RemoteAddr) {
			return loopbackKey, nil
		}
		return nil, ErrMissingToken
	}
	if len(hs) > 1 {
		return nil, fmt.Errorf("%w (%d Authorization headers: send one)", ErrMissingToken, len(hs))
	}
	scheme, tok, ok := strings.Cut(hs[0], " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || tok == "" || strings.TrimSpace(tok) != tok {
		return nil, fmt.Errorf(`%w (the Authorization header must be "Bearer <token>")`, ErrMissingToken)
	}
	if len(tok) > maxTokenLength {
		return nil, ErrUnknownToken
	}
	k, found := t.pass.Lookup(tok)
	if !found {
		return nil, ErrUnknownToken
	}
	return k, nil
}

// maxTokenLength bounds the token hashed per request: no passport key is
// longer.
const maxTokenLength = 4096

// Check reports whether r may act with any of scopes: nil, or an error
// wrapping ErrMissingToken, ErrUnknownToken or ErrMissingScope whose text
// says what to fix.
func (t *Tokens) Check(r *http.Request, scopes ...Scope) error {
	_, err := t.Authorize(r, scopes...)
	return err
}

// Authorize is Check that also answers the key r acts with.
func (t *Tokens) Authorize(r *http.Request, scopes ...Scope) (*passport.Key, error) {
	k, err := t.Key(r)
	if err != nil {
		return nil, err
	}
	for _, want := range scopes {
		if k.Has(want) {
			return k, nil
		}
	}
	return nil, keyError{k.Name, "scope", fmt.Errorf("%w %s (key %q)", ErrMissingScope, joinScopes(scopes), k.Name)}
}

// Allowed reports whether r may act with scope (Check without the reason).
func (t *Tokens) Allowed(r *http.Request, scope Scope) bool { return t.Check(r, scope) == nil }

// Require wraps h: a request that may not act with any of scopes gets 401
// {"error"} with WWW-Authenticate: Bearer (no token, or an unknown one)
// or 403 (a known token without the scope) and never reaches h.
//
// The key goes with the request (KeyOf) for the handler's claims checks.
func (t *Tokens) Require(h http.HandlerFunc, scopes ...Scope) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		k, err := t.Authorize(r, scopes...)
		if err != nil {
			t.Refuse(w, err)
			return
		}
		h(w, r.WithContext(context.WithValue(r.Context(), keyCtxKey{}, authed{k, t})))
	}
}

// RequireFleet is Require for a route that reads or acts on the whole
// fleet: the key's claims must admit every namespace too (a key narrowed
// to some namespaces reaches only the routes that name one, and checks it
// there: admitsNamespace, admitsDrainTarget, admitsRegistration).
func (t *Tokens) RequireFleet(h http.HandlerFunc, scopes ...Scope) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		k, err := t.AuthorizeFleet(r, scopes...)
		if err != nil {
			t.Refuse(w, err)
			return
		}
		h(w, r.WithContext(context.WithValue(r.Context(), keyCtxKey{}, authed{k, t})))
	}
}

// AuthorizeFleet is Authorize for what reads or acts on the whole fleet:
// a key narrowed to some namespaces lacks the scope for it.
func (t *Tokens) AuthorizeFleet(r *http.Request, scopes ...Scope) (*passport.Key, error) {
	k, err := t.Authorize(r, scopes...)
	if err == nil && !k.Claims.AllNamespaces() {
		return nil, keyError{k.Name, "claims", fmt.Errorf("%w %s over every namespace (key %q is narrowed to some)", ErrMissingScope, joinScopes(scopes), k.Name)}
	}
	return k, err
}

type keyCtxKey struct{}

// authed is what Require hands the handler: the key, and the Tokens that
// admitted it (which count a claims refusal).
type authed struct {
	key *passport.Key
	t   *Tokens
}

// KeyOf is the passport key Require admitted r with, nil if none.
func KeyOf(r *http.Request) *passport.Key {
	a, _ := r.Context().Value(keyCtxKey{}).(authed)
	return a.key
}

// refuseClaims is Tokens.refuseClaims for the key r came with.
func refuseClaims(w http.ResponseWriter, r *http.Request, msg string) {
	if a, ok := r.Context().Value(keyCtxKey{}).(authed); ok {
		a.t.refuseClaims(w, a.key, msg)
		return
	}
	httpx.WriteError(w, http.StatusForbidden, msg, 0)
}

// admitsNamespace answers 403 and reports false unless the key r came with
// admits ns.
func admitsNamespace(w http.ResponseWriter, r *http.Request, ns string) bool {
	if k := KeyOf(r); k != nil && !k.Claims.Namespace(ns) {
		refuseClaims(w, r, fmt.Sprintf("key %q does not admit namespace %s", k.Name, ns))
		return false
	}
	return true
}

// WriteAuthError answers a failed Check.
func WriteAuthError(w http.ResponseWriter, err error) {
	if errors.Is(err, ErrMissingScope) {
		httpx.WriteError(w, http.StatusForbidden, err.Error(), 0)
		return
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="pinnedd"`)
	httpx.WriteError(w, http.StatusUnauthorized, err.Error(), 0)
}

func joinScopes(scopes []Scope) string {
	s := make([]string, len(scopes))
	for i, sc := range scopes {
		s[i] = string(sc)
	}
	return strings.Join(s, " or ")
}

// loopbackPeer: the connection comes from this machine's loopback.
func loopbackPeer(remoteAddr string) bool {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		return false
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}

// AdmitClient applies ns's client policy (passport) to r, a client's
// request (not a cluster call): an anonymous namespace admits anyone, and
// its Authorization header is the host's business; an authenticated one
// needs a bearer key whose claims admit ns (401 + WWW-Authenticate
// without a known key, 403 with one that does not), and the key goes no
// further than here: the host never sees it. It answers w and reports
// false when r may not go on; keyed: ns needed the key.
func (t *Tokens) AdmitClient(w http.ResponseWriter, r *http.Request, ns string) (keyed, ok bool) {
	if t.Passport().Policy(ns) == passport.Anonymous {
		return false, true
	}
	k, err := t.Key(r)
	if err != nil {
		t.Refuse(w, err)
		return true, false
	}
	if !k.Claims.Namespace(ns) {
		t.refuseClaims(w, k, fmt.Sprintf("key %q does not admit namespace %s", k.Name, ns))
		return true, false
	}
	r.Header.Del("Authorization")
	return true, true
}
