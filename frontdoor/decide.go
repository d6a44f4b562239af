package frontdoor

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/pinnedd/pinnedd/internal/relay"
	"github.com/pinnedd/pinnedd/passport"
	"github.com/pinnedd/pinnedd/pinboard"
	"github.com/pinnedd/pinnedd/pinboard/directory"
	"github.com/pinnedd/pinnedd/plugins"
)

// routeKind is what a request is to the front door.
type routeKind uint8

const (
	toMux      routeKind = iota // the API's routes and Handle's
	toPeerOnly                  // a node-to-node route asked for off the cluster port: 403
	toOwner                     // /_pinned/i/<ns>/<id>/<rest>: a peer's attested request
	toWake                      // POST /_pinned/wake/<ns>/<id>: a peer's attested wake
	toInstance                  // /<ns>/<id>/<rest>: a client's request for an instance
)

// origin is where a request came from, as far as routing cares.
type origin uint8

const (
	fromClient   origin = iota // the front door's own port
	fromMember                 // the cluster port, a member node
	fromStranger               // the cluster port, a node that is no member any more
)

// decision is the one routing decision for a request, made by decide for
// net/http's entry (serve) and the kept-alive loop's (routeLoop) alike.
type decision struct {
	kind routeKind
	// ns, id and rest name the instance (toOwner, toWake, toInstance),
	// unless err says why the path names none; env is its env, which an
	// owner-side path names in hostname-aware mode (ownerPath).
	env, ns, id, rest string
	err               error
	// loop: the kept-alive loop may carry the request. Only a plain path
	// and query (passed through as they are), from a client or a member;
	// for an instance, of a namespace that admits anyone and with no
	// cluster call (net/http checks keys and credentials). Everything else
	// is net/http's; the loop gives it back unread.
	loop bool
}

// fields is a request's header fields, as either entry holds them:
// net/http's header, or the kept-alive loop's fields. A struct, not an
// interface, so the loop's decision allocates nothing.
type fields struct {
	std  http.Header
	loop []relay.Field
}

// stdFields are net/http's.
func stdFields(h http.Header) fields { return fields{std: h} }

// loopFields are the kept-alive loop's.
func loopFields(fs []relay.Field) fields { return fields{loop: fs} }

func (fs fields) has(name string) bool {
	if fs.std != nil {
		return fs.std.Get(name) != ""
	}
	for _, f := range fs.loop {
		if strings.EqualFold(f.Name, name) {
			return true
		}
	}
	return false
}

// decide is the router's one decision for a request: what it is (its
// method, its path, decoded for the kind and escaped for the instance it
// names, and where it came from) and whether the kept-alive loop may carry
// it (also its query and header fields).
func (f *FrontDoor) decide(method, path, escaped, query string, hdr fields, from origin) decision {
	var d decision
	switch {
	case f.transport.Secure() && from == fromClient && isPeerRoute(path):
		// With mutual TLS the peer routes are the cluster port's.
		return decision{kind: toPeerOnly}
	case strings.HasPrefix(path, ownerRoutePrefix+"/"):
		d.kind = toOwner
		d.env, d.ns, d.id, d.rest, d.err = parseOwnerPath(strings.TrimPrefix(escaped, ownerRoutePrefix))
	case strings.HasPrefix(path, wakePrefix+"/") && method == http.MethodPost:
		d.kind = toWake
		d.env, d.ns, d.id, _, d.err = parseOwnerPath(strings.TrimPrefix(escaped, wakePrefix))
		return d // net/http's: it activates
	case isInstancePath(path):
		d.kind = toInstance
		d.ns, d.id, d.rest, d.err = parseInstancePath(escaped)
	default:
		return d
	}
	d.loop = d.err == nil && from != fromStranger && escaped == path && plainTarget(path, query)
	if d.loop && d.kind == toInstance {
		d.loop = f.tokens.Passport().Policy(d.ns) == passport.Anonymous && !hdr.has(plugins.HeaderClusterCall)
	}
	return d
}

// key is the instance d names.
func (d decision) key() directory.Key { return directory.Key{Env: d.env, Namespace: d.ns, ID: d.id} }

// envMark starts an owner-side path's env segment in hostname-aware mode
// (/_pinned/i/~ENV/<ns>/<id>/...): no namespace starts with '~', and the
// attestation signs the path, env and all.
const envMark = "/~"

// ownerPath is prefix followed by k's instance path: the one rule for the
// owner-side routes' paths (the hop's and wake's).
func ownerPath(prefix string, k directory.Key) string {
	if k.Env != "" {
		prefix += envMark + k.Env
	}
	return prefix + k.Namespace + "/" + k.ID
}

// parseOwnerPath is parseInstancePath for what follows an owner-side
// route's prefix: an env segment first, if there is one.
func parseOwnerPath(escaped string) (env, ns, id, rest string, err error) {
	if strings.HasPrefix(escaped, envMark) {
		i := strings.IndexByte(escaped[1:], '/') + 1
		if i == 0 || !plugins.ValidEnv(escaped[len(envMark):i]) {
			return "", "", "", "", fmt.Errorf("%w: path must be /~<env>/<namespace>/<id>/...", plugins.ErrInvalidNamespace)
		}
		env, escaped = escaped[len(envMark):i], escaped[i:]
	}
	ns, id, rest, err = parseInstancePath(escaped)
	return env, ns, id, rest, err
}

// plainTarget: path and query pass through the loop as they are (no
// escapes in the path, a clean query); anything else goes to net/http,
// whose escaping rules the forward follows.
func plainTarget(path, query string) bool {
	for i := 0; i < len(path); i++ {
		if !fastPathChars[path[i]] {
			return false
		}
	}
	return cleanQuery(query)
}

// fastPathChars: the path bytes the loop passes through as they are.
var fastPathChars = func() (t [256]bool) {
	for _, c := range []byte("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~/:@=+!$&'()*,") {
		t[c] = true
	}
	return t
}()

// isPeerRoute: p is one of the routes only other nodes call (the owner
// side of the hop, wake, stats, wind-down).
func isPeerRoute(p string) bool {
	return strings.HasPrefix(p, ownerRoutePrefix+"/") || strings.HasPrefix(p, wakePrefix+"/") ||
		p == pinboard.StatsPath || p == pinboard.WindDownPath
}

// isInstancePath: anything whose first segment is not one of the front
// door's own (reserved names, or starting with "_").
func isInstancePath(p string) bool {
	seg, _, _ := strings.Cut(strings.TrimPrefix(p, "/"), "/")
	return seg != "" && seg[0] != '_' && !plugins.Reserved[seg]
}

// splitInstancePath parses /<ns>/<id>[/<rest>] from the escaped path.
func splitInstancePath(escaped string) (ns, id, rest string, ok bool) {
	// Slices of escaped, not new strings: this runs for every request.
	p, ok := strings.CutPrefix(escaped, "/")
	if !ok {
		return "", "", "", false
	}
	i := strings.IndexByte(p, '/')
	if i < 0 {
		return escaped, "", "/", true
	}
	ns, after := escaped[:1+i], p[i+1:]
	if j := strings.IndexByte(after, '/'); j >= 0 {
		return ns, after[:j], after[j:], true
	}
	return ns, after, "/", true
}

// parseInstancePath is the one rule for the instance an escaped path
// /<ns>/<id>[/<rest>] names, on every path that parses one (net/http's
// instance and owner-side routes, the wake route, the kept-alive loop):
// the id segment is unescaped once and the decoded id validated, so a
// client's encodeURIComponent("a:b") (a%3Ab) is the id "a:b"; an escaped
// '/' (%2F) is refused, an id being one path segment. rest stays escaped,
// as the instance receives it. The error wraps plugins.ErrInvalidNamespace
// or plugins.ErrInvalidID.
func parseInstancePath(escaped string) (ns, id, rest string, err error) {
	ns, id, rest, ok := splitInstancePath(escaped)
	if !ok {
		return "", "", "", fmt.Errorf("%w: path must be /<namespace>/<id>/...", plugins.ErrInvalidNamespace)
	}
	if err := plugins.ValidateNamespace(ns); err != nil {
		return "", "", "", err
	}
	if strings.IndexByte(id, '%') >= 0 {
		raw := id
		if id, err = url.PathUnescape(raw); err != nil {
			return ns, "", "", fmt.Errorf("%w %q: malformed %%-escape", plugins.ErrInvalidID, raw)
		}
		if strings.IndexByte(id, '/') >= 0 {
			return ns, "", "", fmt.Errorf("%w %q: an escaped '/' (%%2F) is not allowed, an id is one path segment", plugins.ErrInvalidID, raw)
		}
	}
	if err := plugins.ValidateID(id); err != nil {
		return ns, "", "", err
	}
	return ns, id, rest, nil
}

// cleanQuery reports whether q passes a hop unchanged: no ';' and every
// '%' starting a valid escape.
func cleanQuery(q string) bool {
	for i := 0; i < len(q); i++ {
		switch q[i] {
		case ';':
			return false
		case '%':
			if i+2 >= len(q) || !isHex(q[i+1]) || !isHex(q[i+2]) {
				return false
			}
			i += 2
		}
	}
	return true
}
