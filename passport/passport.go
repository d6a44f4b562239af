// Package passport owns who may do what at a front door: the deployment's keys (each with a
// name, the scopes it carries and the claims that narrow them), read from a passport
// (PINBOARD_PASSPORT, --passport) or made from a single token, and the namespaces' client
// policies. It parses and checks a passport whole (never half-loaded), and finds the key a
// bearer token names with one map look-up. It decides nothing about requests: the front door
// asks it.
package passport

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/pinnedd/pinnedd/plugins"
)

// Scope is a right a key carries.
type Scope string

// The scopes: a worker registers, heartbeats and joins; an operator reads and acts on the
// fleet.
const (
	Worker   Scope = "pinboard:worker"
	Operator Scope = "pinboard:operator"
)

// Policy says which clients a namespace admits.
type Policy string

// The policies: anyone, or a client whose key's claims admit the namespace.
const (
	Anonymous     Policy = "anonymous"
	Authenticated Policy = "authenticated"
)

// ErrInvalid wraps every reason a passport is refused.
var ErrInvalid = errors.New("PINBOARD_PASSPORT is invalid")

// Key is one key of the passport: what a request carrying one of its tokens may do.
type Key struct {
	Name     string // what logs and metrics show, never the token
	Provider string
	Scopes   []Scope
	Claims   Claims
	tokens   []string // its values, in the passport's order (Tokens)
}

// Tokens are the key's token values, as the passport lists them: a node's
// own key's, during its rotation, seal its keys at rest and prove its
// joins. Never to be logged or sent anywhere.
func (k *Key) Tokens() []string { return slices.Clone(k.tokens) }

// Has reports whether k carries scope s.
func (k *Key) Has(s Scope) bool { return slices.Contains(k.Scopes, s) }

// Claims narrow what a key's scopes reach. A nil list admits nothing; "*" admits all.
type Claims struct {
	Namespaces []string // "*", or namespaces ("/threads")
	Hostnames  []string // "*", a host name, or ".suffix" (a name ending with it, not the bare suffix)
	Envs       []string // "*", or envs
	// BackendHosts bounds the addresses a worker may advertise: "*", or IP prefixes.
	BackendHosts []netip.Prefix
	anyBackend   bool
}

// Namespace reports whether the claims admit namespace ns.
func (c Claims) Namespace(ns string) bool {
	return slices.Contains(c.Namespaces, "*") || slices.Contains(c.Namespaces, ns)
}

// AllNamespaces reports whether the claims admit every namespace.
func (c Claims) AllNamespaces() bool { return slices.Contains(c.Namespaces, "*") }

// Hostname reports whether the claims admit host name h (compared in lower case).
func (c Claims) Hostname(h string) bool {
	h = strings.ToLower(h)
	for _, p := range c.Hostnames {
		switch {
		case p == "*", p == h:
			return true
		case strings.HasPrefix(p, ".") && strings.HasSuffix(h, p) && len(h) > len(p):
			return true
		}
	}
	return false
}

// Env reports whether the claims admit env e.
func (c Claims) Env(e string) bool { return slices.Contains(c.Envs, "*") || slices.Contains(c.Envs, e) }

// BackendHost reports whether a worker with these claims may advertise ip.
func (c Claims) BackendHost(ip netip.Addr) bool {
	if c.anyBackend {
		return true
	}
	ip = ip.Unmap()
	for _, p := range c.BackendHosts {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// AnyBackendHost reports whether the claims let a worker advertise any address ("*").
func (c Claims) AnyBackendHost() bool { return c.anyBackend }

// Unrestricted reports whether the claims admit everything (what /metrics and the fleet-wide
// operator routes need).
func (c Claims) Unrestricted() bool {
	return c.AllNamespaces() && slices.Contains(c.Hostnames, "*") && slices.Contains(c.Envs, "*") && c.anyBackend
}

// unrestricted are the claims of the single-key passport.
var unrestricted = Claims{Namespaces: []string{"*"}, Hostnames: []string{"*"}, Envs: []string{"*"}, anyBackend: true}

// Passport is the deployment's keys and namespace policies.
type Passport struct {
	keys     map[[sha256.Size]byte]*Key // by the SHA-256 of each of their tokens
	policies map[string]Policy          // by namespace; "*" for the rest
	// open: every namespace is anonymous (Policy's answer without a look-up).
	open bool
}

// Single is the passport of one deployment key (or several values of it, during a rotation):
// both scopes, unrestricted claims, every namespace anonymous. It is what PINBOARD_TOKEN
// alone means.
func Single(tokens ...string) *Passport {
	p := &Passport{keys: map[[sha256.Size]byte]*Key{}, policies: map[string]Policy{"*": Anonymous}, open: true}
	k := &Key{Name: "deployment", Provider: "pinboard", Scopes: []Scope{Worker, Operator}, Claims: unrestricted}
	for _, t := range tokens {
		if t != "" {
			p.keys[sha256.Sum256([]byte(t))] = k
			k.tokens = append(k.tokens, t)
		}
	}
	return p
}

// Add adds k with the given tokens (replacing the key any of them named before), for a
// passport built in code; it returns p.
func (p *Passport) Add(k *Key, tokens ...string) *Passport {
	for _, t := range tokens {
		if t != "" {
			p.keys[sha256.Sum256([]byte(t))] = k
			k.tokens = append(k.tokens, t)
		}
	}
	return p
}

// Keys are the passport's keys, each once, by name.
func (p *Passport) Keys() []*Key {
	var out []*Key
	for _, k := range p.keys {
		if !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	slices.SortFunc(out, func(a, b *Key) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Unrestricted are the claims that admit everything (the single-key passport's).
func Unrestricted() Claims { return unrestricted }

// Lookup is the key token belongs to: one hash and one map look-up whatever the number of
// keys. Tokens are held and compared only as their SHA-256, so the time the look-up takes
// tells an attacker about the hash of a guess, never about how much of a token it matched.
func (p *Passport) Lookup(token string) (*Key, bool) {
	k, ok := p.keys[sha256.Sum256([]byte(token))]
	return k, ok
}

// Policy is the policy of namespace ns: its own, or "*"'s, or Authenticated when neither is
// given.
func (p *Passport) Policy(ns string) Policy {
	if p.open {
		return Anonymous
	}
	if pol, ok := p.policies[ns]; ok {
		return pol
	}
	if pol, ok := p.policies["*"]; ok {
		return pol
	}
	return Authenticated
}

// Parse reads a passport (JSON). getenv looks up the environment variables tokens name;
// weak, if set, refuses a token too weak to guard a fleet. Any error wraps ErrInvalid and
// says what and where.
func Parse(data []byte, getenv func(string) (string, bool), weak func(string) error) (*Passport, error) {
	var doc passportDoc
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: more than one JSON value", ErrInvalid)
	}
	bad := func(where, format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrInvalid, where, fmt.Sprintf(format, args...))
	}
	p := &Passport{keys: map[[sha256.Size]byte]*Key{}, policies: map[string]Policy{}}
	if len(doc.Providers) == 0 {
		return nil, bad("providers", "no provider: a passport needs at least one key")
	}
	names := map[string]bool{}
	for i, prov := range doc.Providers {
		where := fmt.Sprintf("providers[%d]", i)
		if prov.Type != "staticToken" {
			return nil, bad(where+".type", "unknown provider type %q (want staticToken)", prov.Type)
		}
		if len(prov.Keys) == 0 {
			return nil, bad(where+".keys", "no key")
		}
		for j, kd := range prov.Keys {
			kw := fmt.Sprintf("%s.keys[%d]", where, j)
			if kd.Name == "" {
				return nil, bad(kw+".name", "missing")
			}
			if names[kd.Name] {
				return nil, bad(kw+".name", "%q names two keys", kd.Name)
			}
			names[kd.Name] = true
			k := &Key{Name: kd.Name, Provider: prov.ID}
			if len(kd.Scopes) == 0 {
				return nil, bad(kw+".scopes", "no scope (want %s and/or %s)", Worker, Operator)
			}
			for s, sc := range kd.Scopes {
				if sc != Worker && sc != Operator {
					return nil, bad(fmt.Sprintf("%s.scopes[%d]", kw, s), "unknown scope %q (want %s or %s)", sc, Worker, Operator)
				}
				if !k.Has(sc) {
					k.Scopes = append(k.Scopes, sc)
				}
			}
			claims, err := kd.Claims.claims()
			if err != nil {
				return nil, bad(kw+".claims.pinboard", "%v", err)
			}
			k.Claims = claims
			refs, err := tokenRefs(kd.Token)
			if err != nil {
				return nil, bad(kw+".token", "%v", err)
			}
			for t, ref := range refs {
				tw := fmt.Sprintf("%s.token[%d]", kw, t)
				val, ok := getenv(ref.Env)
				if !ok || val == "" {
					return nil, bad(tw, "environment variable %s is not set", ref.Env)
				}
				if weak != nil {
					if err := weak(val); err != nil {
						return nil, bad(tw, "%s: %v", ref.Env, err)
					}
				}
				h := sha256.Sum256([]byte(val))
				if other, dup := p.keys[h]; dup {
					return nil, bad(tw, "%s holds the same token as key %q: every token names one key", ref.Env, other.Name)
				}
				p.keys[h] = k
				k.tokens = append(k.tokens, val)
			}
		}
	}
	for ns, pol := range doc.Namespaces {
		where := fmt.Sprintf("namespaces[%q]", ns)
		if ns != "*" {
			if err := plugins.ValidateNamespace(ns); err != nil {
				return nil, bad(where, "not a namespace nor \"*\": %v", err)
			}
		}
		if pol.Allow != Anonymous && pol.Allow != Authenticated {
			return nil, bad(where+".allow", "unknown policy %q (want anonymous or authenticated)", pol.Allow)
		}
		p.policies[ns] = pol.Allow
	}
	p.open = p.policies["*"] == Anonymous
	for _, pol := range p.policies {
		p.open = p.open && pol == Anonymous
	}
	return p, nil
}

type passportDoc struct {
	Providers  []providerDoc        `json:"providers"`
	Namespaces map[string]policyDoc `json:"namespaces"`
}

type providerDoc struct {
	Type string   `json:"type"`
	ID   string   `json:"id"`
	Keys []keyDoc `json:"keys"`
}

type keyDoc struct {
	Name   string          `json:"name"`
	Token  json.RawMessage `json:"token"`
	Scopes []Scope         `json:"scopes"`
	Claims claimsDoc       `json:"claims"`
}

type policyDoc struct {
	Allow Policy `json:"allow"`
}

type envRef struct {
	Env string `json:"env"`
}

// tokenRefs reads a key's token: {"env": NAME} or an array of them (the values of a key
// being rotated).
func tokenRefs(raw json.RawMessage) ([]envRef, error) {
	if len(raw) == 0 {
		return nil, errors.New(`missing (want {"env": NAME} or an array of them)`)
	}
	var refs []envRef
	if bytes.HasPrefix(bytes.TrimSpace(raw), []byte("[")) {
		if err := strictJSON(raw, &refs); err != nil {
			return nil, err
		}
	} else {
		var one envRef
		if err := strictJSON(raw, &one); err != nil {
			return nil, err
		}
		refs = []envRef{one}
	}
	if len(refs) == 0 {
		return nil, errors.New("an empty array: a key needs a token")
	}
	for i, r := range refs {
		if r.Env == "" {
			return nil, fmt.Errorf(`[%d]: want {"env": NAME}`, i)
		}
	}
	return refs, nil
}

type claimsDoc struct {
	Pinboard *pinboardClaimsDoc `json:"pinboard"`
}

type pinboardClaimsDoc struct {
	Namespaces          []string `json:"namespaces"`
	AllowedBackendHosts []string `json:"allowedBackendHosts"`
	Hostnames           []string `json:"hostnames"`
	Envs                []string `json:"envs"`
}

// claims checks a key's claims. Without claims.pinboard a key reaches nothing a claim
// narrows; each list left out admits nothing.
func (d claimsDoc) claims() (Claims, error) {
	var c Claims
	if d.Pinboard == nil {
		return c, nil
	}
	pc := d.Pinboard
	for _, ns := range pc.Namespaces {
		if ns == "*" {
			continue
		}
		if err := plugins.ValidateNamespace(ns); err != nil {
			return c, fmt.Errorf("namespaces: %q is not \"*\" nor a namespace: %w", ns, err)
		}
	}
	c.Namespaces = pc.Namespaces
	for _, h := range pc.Hostnames {
		if h == "" || strings.ContainsAny(h, "/: ") || (h != "*" && strings.Contains(h, "*")) {
			return c, fmt.Errorf("hostnames: %q is not \"*\", a host name nor \".suffix\"", h)
		}
		c.Hostnames = append(c.Hostnames, strings.ToLower(h))
	}
	for _, e := range pc.Envs {
		if e == "" {
			return c, errors.New("envs: an empty env")
		}
	}
	c.Envs = pc.Envs
	for _, h := range pc.AllowedBackendHosts {
		if h == "*" {
			c.anyBackend = true
			continue
		}
		if pfx, err := netip.ParsePrefix(h); err == nil {
			c.BackendHosts = append(c.BackendHosts, pfx.Masked())
			continue
		}
		ip, err := netip.ParseAddr(h)
		if err != nil {
			return c, fmt.Errorf("allowedBackendHosts: %q is not \"*\", an IP nor a prefix (10.0.0.0/8)", h)
		}
		c.BackendHosts = append(c.BackendHosts, netip.PrefixFrom(ip.Unmap(), ip.Unmap().BitLen()))
	}
	return c, nil
}

func strictJSON(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}
