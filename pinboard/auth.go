package pinboard

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"

	"github.com/pinnedd/pinnedd/internal/httpx"
)

// Scope is a permission a bearer token carries.
type Scope string

// Scopes: a worker registers and heartbeats, an operator reads and acts
// on the fleet.
const (
	ScopeWorker   Scope = "pinboard:worker"
	ScopeOperator Scope = "pinboard:operator"
)

// Why a request is not authorized; Check wraps one of them, Require maps
// them to 401 (the first two) and 403.
var (
	ErrMissingToken = errors.New("missing bearer token: set PINBOARD_TOKEN / --token")
	ErrUnknownToken = errors.New("unknown token: check PINBOARD_TOKEN / --token against the agent's")
	ErrMissingScope = errors.New("token lacks the scope")
)

// Tokens authorizes bearer tokens. Every route that needs a scope goes
// through Check (Require, FrontDoor.RequireScope), so the answers are the
// same everywhere; full passport auth is a later piece that lands here.
type Tokens struct {
	keys map[string][]Scope
	// loopbackAnonymous: a request with no Authorization header from a
	// loopback peer gets every scope (--dev).
	loopbackAnonymous bool
}

// NewTokens grants every scope to each of the given deployment tokens
// (a deployment key carries worker and operator).
func NewTokens(tokens ...string) *Tokens {
	t := &Tokens{keys: map[string][]Scope{}}
	for _, tok := range tokens {
		if tok != "" {
			t.keys[tok] = []Scope{ScopeWorker, ScopeOperator}
		}
	}
	return t
}

// Grant adds token with only the given scopes (replacing what it had), and
// returns t.
func (t *Tokens) Grant(token string, scopes ...Scope) *Tokens {
	if token != "" {
		t.keys[token] = append([]Scope(nil), scopes...)
	}
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

// Check reports whether r may act with any of scopes: nil, or an error
// wrapping ErrMissingToken, ErrUnknownToken or ErrMissingScope whose text
// says what to fix.
func (t *Tokens) Check(r *http.Request, scopes ...Scope) error {
	h := r.Header.Get("Authorization")
	if h == "" {
		if t.loopbackAnonymous && loopbackPeer(r.RemoteAddr) {
			return nil
		}
		return ErrMissingToken
	}
	tok, ok := strings.CutPrefix(h, "Bearer ")
	if !ok || strings.TrimSpace(tok) == "" {
		return fmt.Errorf(`%w (the Authorization header must be "Bearer <token>")`, ErrMissingToken)
	}
	var granted []Scope
	found := false
	for k, ss := range t.keys {
		// Every key is compared, in constant time, so the time taken does
		// not tell how much of a guess matched.
		if subtle.ConstantTimeCompare([]byte(k), []byte(tok)) == 1 {
			granted, found = ss, true
		}
	}
	if !found {
		return ErrUnknownToken
	}
	for _, want := range scopes {
		for _, s := range granted {
			if s == want {
				return nil
			}
		}
	}
	return fmt.Errorf("%w %s", ErrMissingScope, joinScopes(scopes))
}

// Allowed reports whether r may act with scope (Check without the reason).
func (t *Tokens) Allowed(r *http.Request, scope Scope) bool { return t.Check(r, scope) == nil }

// Require wraps h: a request that may not act with any of scopes gets 401
// {"error"} with WWW-Authenticate: Bearer (no token, or an unknown one)
// or 403 (a known token without the scope) and never reaches h.
func (t *Tokens) Require(h http.HandlerFunc, scopes ...Scope) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := t.Check(r, scopes...); err != nil {
			WriteAuthError(w, err)
			return
		}
		h(w, r)
	}
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
