package pinboard

// Placement policy: which worker takes an id that has no owner yet.
//
// The policy is a pure function of its inputs (the request, the candidates
// and an injected random source). It never filters candidates: the caller
// hands it workers that are live, undrained, not degraded and serving the
// namespace, and it never decrements headroom: the directory subtracts one
// unit per grant until the worker's next heartbeat replaces the figure.

import (
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"strings"
)

// DefaultBalanceFactor is the balance factor used when
// PlacementPolicy.BalanceFactor is unset (PINBOARD_AFFINITY_BALANCE_FACTOR).
const DefaultBalanceFactor = 2.0

// Candidate is a worker that may take a new placement. The caller has already
// filtered the fleet down to workers that are live, undrained, not degraded
// and serving the namespace.
type Candidate struct {
	ClientID string
	// Headroom is the worker's free capacity in units consistent across the
	// fleet (slots, or memory in MB). It is a selection weight, not a limit:
	// a worker with zero headroom can still be chosen. Negative values are
	// read as zero.
	Headroom int64
}

// PlacementRequest describes the placement being made.
type PlacementRequest struct {
	// Key is the placement's stable "env\x00namespace\x00id". The current
	// rules prefer workers per client or per affinity key, never per id, so
	// Choose does not read it; it identifies the decision in logs and traces.
	Key string
	// ClientIP is the resolved client address (see ClientIP), "" if unknown.
	ClientIP string
	// CallerID is the client id of the caller's own worker on an attested
	// cluster call, "" otherwise.
	CallerID string
	// AffinityKey is the programmatic affinity. nil: not set, client-IP
	// affinity applies. Pointer to "": no preference, power of two choices.
	// Anything else: a rendezvous preference by that key.
	AffinityKey *string
}

// PlacementPolicy chooses the worker for a new placement.
//
// The rules, in order:
//
//  1. An attested cluster call (CallerID is one of the candidates) prefers the
//     caller's own worker.
//  2. An AffinityKey pointing to "" uses power of two choices: two distinct
//     candidates drawn at random, the one with more headroom wins, a tie is
//     settled at random.
//  3. A non-empty AffinityKey, or else a known ClientIP, names a preferred
//     worker by rendezvous (highest random weight) hashing of the key or IP
//     with each candidate's ClientID. Every pinboard node computes the same
//     preference, ids from one client land together, and removing a worker
//     moves only the clients that preferred it.
//  4. Otherwise, and whenever a preference fails the balance guard, the
//     headroom-biased choice: a random candidate drawn with probability
//     proportional to Headroom+1.
//
// The balance guard keeps a preference (rules 1 and 3) only while the
// preferred worker's headroom is at least the best candidate headroom divided
// by BalanceFactor; rule 1 falls through to rules 2–4 when it fails. So with
// the default factor 2 a client sticks to its worker until that worker has
// less than half the headroom of the roomiest candidate. A factor of 1
// keeps a preference only while the preferred worker ties for the most
// headroom; +Inf never lets go. Because the guard compares headroom figures
// and each grant subtracts one unit, large units (memory MB) let affinity
// survive a long burst between heartbeats.
//
// The headroom-biased choice draws in proportion to Headroom+1 rather than
// taking the maximum: the directory subtracts a single unit per grant until
// the next heartbeat, and several front doors choose concurrently from the
// same snapshot, so "maximum" sends a burst of placements to one worker
// while a weighted draw spreads it in proportion to capacity. The +1 keeps a
// zero-headroom worker eligible, as headroom is a weight and not an
// admission limit.
//
// Choose is deterministic given Rand and the candidates' order, safe for
// concurrent use if Rand is, and does not allocate.
type PlacementPolicy struct {
	// BalanceFactor bounds a preference, see above. 0 or NaN means
	// DefaultBalanceFactor; a value below 1 acts as 1.
	BalanceFactor float64
	// Rand returns uniformly random 64-bit values; nil means math/rand/v2's
	// global source.
	Rand func() uint64
}

// Choose returns the client id of the worker that should take the placement,
// and false if there are no candidates.
func (p PlacementPolicy) Choose(req PlacementRequest, cands []Candidate) (clientID string, ok bool) {
	if len(cands) == 0 {
		return "", false
	}
	rnd := p.Rand
	if rnd == nil {
		rnd = rand.Uint64
	}
	factor := p.factor()

	if req.CallerID != "" {
		for _, c := range cands {
			if c.ClientID == req.CallerID {
				if keepPreference(headroomOf(c), bestHeadroom(cands), factor) {
					return c.ClientID, true
				}
				break
			}
		}
	}

	var pref int
	switch {
	case req.AffinityKey != nil && *req.AffinityKey == "":
		return cands[powerOfTwo(cands, rnd)].ClientID, true
	case req.AffinityKey != nil:
		pref = rendezvous(*req.AffinityKey, cands)
	case req.ClientIP != "":
		pref = rendezvous(req.ClientIP, cands)
	default:
		return cands[byHeadroom(cands, rnd)].ClientID, true
	}
	if keepPreference(headroomOf(cands[pref]), bestHeadroom(cands), factor) {
		return cands[pref].ClientID, true
	}
	return cands[byHeadroom(cands, rnd)].ClientID, true
}

func (p PlacementPolicy) factor() float64 {
	f := p.BalanceFactor
	switch {
	case f == 0 || math.IsNaN(f):
		return DefaultBalanceFactor
	case f < 1:
		return 1
	}
	return f
}

func headroomOf(c Candidate) int64 { return max(c.Headroom, 0) }

func bestHeadroom(cands []Candidate) int64 {
	var best int64
	for _, c := range cands {
		best = max(best, headroomOf(c))
	}
	return best
}

// keepPreference is the balance guard: pref >= best/factor.
func keepPreference(pref, best int64, factor float64) bool {
	return pref >= best || math.IsInf(factor, 1) || float64(pref)*factor >= float64(best)
}

// Rendezvous weights come from a small fixed hash (multiply-rotate over
// 8-byte words, finished with murmur3's fmix64), not hash/maphash: every
// pinboard node and every release must compute the same preference.
const (
	hrwK1 = 0x9e3779b97f4a7c15
	hrwK2 = 0xc2b2ae3d27d4eb4f
)

func hrwAdd(h uint64, s string) uint64 {
	h ^= uint64(len(s)) * hrwK2
	for ; len(s) >= 8; s = s[8:] {
		w := uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
			uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
		h = bits.RotateLeft64(h^(w*hrwK1), 29) * hrwK2
	}
	for i := 0; i < len(s); i++ {
		h = bits.RotateLeft64(h^(uint64(s[i])*hrwK1), 29) * hrwK2
	}
	return h
}

func fmix64(h uint64) uint64 {
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}

// rendezvous returns the index of the candidate with the highest weight for
// affinity; an exact tie goes to the smaller client id, so the answer does
// not depend on the candidates' order.
func rendezvous(affinity string, cands []Candidate) int {
	seed := fmix64(hrwAdd(0, affinity))
	win, top := 0, uint64(0)
	for i, c := range cands {
		w := fmix64(hrwAdd(seed, c.ClientID))
		if i == 0 || w > top || (w == top && c.ClientID < cands[win].ClientID) {
			win, top = i, w
		}
	}
	return win
}

// below returns a uniform value in [0, n) from one random draw.
func below(rnd func() uint64, n uint64) uint64 {
	hi, _ := bits.Mul64(rnd(), n)
	return hi
}

// twoDistinct draws two different indexes in [0, n), n >= 2.
func twoDistinct(rnd func() uint64, n int) (int, int) {
	i := int(below(rnd, uint64(n)))
	j := int(below(rnd, uint64(n-1)))
	if j >= i {
		j++
	}
	return i, j
}

// powerOfTwo returns the index of the roomier of two random candidates.
func powerOfTwo(cands []Candidate, rnd func() uint64) int {
	if len(cands) == 1 {
		return 0
	}
	i, j := twoDistinct(rnd, len(cands))
	hi, hj := headroomOf(cands[i]), headroomOf(cands[j])
	switch {
	case hi > hj:
		return i
	case hj > hi:
		return j
	case rnd()&1 == 0:
		return i
	default:
		return j
	}
}

// byHeadroom draws an index with probability proportional to Headroom+1.
// If the weights would overflow a uint64 sum, all of them are scaled down by
// 2^32 first (then each is at most 2^31+1).
func byHeadroom(cands []Candidate, rnd func() uint64) int {
	if len(cands) == 1 {
		return 0
	}
	shift := uint(0)
	var total uint64
	for _, c := range cands {
		t := total + uint64(headroomOf(c)) + 1
		if t < total {
			shift = 32
			break
		}
		total = t
	}
	if shift != 0 {
		total = 0
		for _, c := range cands {
			total += uint64(headroomOf(c))>>shift + 1
		}
	}
	r := below(rnd, total)
	for i, c := range cands {
		w := uint64(headroomOf(c))>>shift + 1
		if r < w {
			return i
		}
		r -= w
	}
	return len(cands) - 1 // unreachable: r < total
}

// ParseTrustedProxies parses PINBOARD_TRUSTED_PROXIES: a comma-separated list
// of IP addresses and CIDR prefixes, spaces allowed, empty items skipped. An
// empty string trusts no proxy. A bare address becomes a full-length prefix;
// IPv4-mapped IPv6 addresses are read as IPv4; zones are rejected.
func ParseTrustedProxies(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		if strings.Contains(item, "/") {
			pfx, err := netip.ParsePrefix(item)
			if err != nil {
				return nil, fmt.Errorf("trusted proxies: %q: %w", item, err)
			}
			out = append(out, pfx.Masked())
			continue
		}
		a, err := netip.ParseAddr(item)
		if err != nil {
			return nil, fmt.Errorf("trusted proxies: %q: %w", item, err)
		}
		if a.Zone() != "" {
			return nil, fmt.Errorf("trusted proxies: %q: zones are not allowed", item)
		}
		a = a.Unmap()
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out, nil
}

// maxForwardedHops bounds how many Forwarded elements ClientIP remembers;
// only the nearest hops matter for a right-to-left walk.
const maxForwardedHops = 32

// ClientIP resolves the client address of a request for placement affinity.
//
// The immediate peer (remoteAddr) is the client unless it is a trusted proxy.
// Only then are forwarding headers read, the first present of
// X-Forwarded-For, Forwarded (its for= parameters) and X-Real-IP. The lists
// are walked from the nearest hop outwards (right to left, header lines in
// order), skipping trusted proxies; the first untrusted hop is the client.
// If every hop is trusted, the farthest one is. A hop that is not an address
// ("unknown", an obfuscated Forwarded node, garbage, a Forwarded element
// without for=) ends the walk with "" (unknown): what lies beyond it cannot be
// trusted. Ports, brackets and zones are stripped and IPv4-mapped IPv6 is
// returned as IPv4. An unparseable remoteAddr gives "".
//
// Headers are only as honest as the proxy that forwards them: a trusted
// proxy should overwrite, or strip, the headers it does not set itself.
// Affinity is a placement preference and never authorizes anything, so a
// spoofed client IP can at worst pick its preferred worker, within the
// balance guard.
func ClientIP(remoteAddr string, h http.Header, trusted []netip.Prefix) string {
	peer, ok := parseHop(remoteAddr)
	if !ok {
		return ""
	}
	if !isTrusted(peer, trusted) {
		return peer.String()
	}
	if lines := h.Values("X-Forwarded-For"); len(lines) > 0 {
		return walkForwardedFor(lines, peer, trusted)
	}
	if lines := h.Values("Forwarded"); len(lines) > 0 {
		return walkForwarded(lines, peer, trusted)
	}
	if v := h.Get("X-Real-Ip"); v != "" {
		if a, ok := parseHop(v); ok {
			return a.String()
		}
		return ""
	}
	return peer.String()
}

func isTrusted(a netip.Addr, trusted []netip.Prefix) bool {
	for _, p := range trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// parseHop reads "ip", "ip:port", "[ip]" or "[ip]:port".
func parseHop(s string) (netip.Addr, bool) {
	s = strings.TrimSpace(s)
	a, err := netip.ParseAddr(s)
	if err != nil {
		if len(s) > 2 && s[0] == '[' && s[len(s)-1] == ']' {
			a, err = netip.ParseAddr(s[1 : len(s)-1])
		} else {
			var ap netip.AddrPort
			ap, err = netip.ParseAddrPort(s)
			a = ap.Addr()
		}
		if err != nil {
			return netip.Addr{}, false
		}
	}
	return a.WithZone("").Unmap(), true
}

func walkForwardedFor(lines []string, last netip.Addr, trusted []netip.Prefix) string {
	for l := len(lines) - 1; l >= 0; l-- {
		rest := lines[l]
		for rest != "" {
			var hop string
			if i := strings.LastIndexByte(rest, ','); i >= 0 {
				hop, rest = rest[i+1:], rest[:i]
			} else {
				hop, rest = rest, ""
			}
			if strings.TrimSpace(hop) == "" {
				continue // empty list elements are ignored (RFC 9110 §5.6.1)
			}
			a, ok := parseHop(hop)
			if !ok {
				return ""
			}
			if !isTrusted(a, trusted) {
				return a.String()
			}
			last = a
		}
	}
	return last.String()
}

func walkForwarded(lines []string, last netip.Addr, trusted []netip.Prefix) string {
	var ring [maxForwardedHops]string
	n := 0
	for _, line := range lines {
		for rest := line; rest != ""; {
			var elem string
			elem, rest = nextForwardedPart(rest, ',')
			if strings.TrimSpace(elem) == "" {
				continue
			}
			ring[n%maxForwardedHops] = forwardedFor(elem)
			n++
		}
	}
	for k := 1; k <= min(n, maxForwardedHops); k++ {
		a, ok := parseHop(ring[(n-k)%maxForwardedHops])
		if !ok {
			return ""
		}
		if !isTrusted(a, trusted) {
			return a.String()
		}
		last = a
	}
	if n > maxForwardedHops {
		return "" // the farthest hops were not kept
	}
	return last.String()
}

// nextForwardedPart splits s at the first sep outside a quoted string.
func nextForwardedPart(s string, sep byte) (part, rest string) {
	quoted := false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case quoted && c == '\\':
			i++
		case c == '"':
			quoted = !quoted
		case !quoted && c == sep:
			return s[:i], s[i+1:]
		}
	}
	return s, ""
}

// forwardedFor returns the unquoted for= value of one Forwarded element, or
// "" if it has none (or an unusable one).
func forwardedFor(elem string) string {
	for rest := elem; rest != ""; {
		var pair string
		pair, rest = nextForwardedPart(rest, ';')
		name, value, ok := strings.Cut(pair, "=")
		if !ok || !strings.EqualFold(strings.TrimSpace(name), "for") {
			continue
		}
		value = strings.TrimSpace(value)
		if value == "" || value[0] != '"' {
			return value
		}
		if len(value) < 2 || value[len(value)-1] != '"' {
			return ""
		}
		// An address never needs quoted-pair escapes; refuse them rather
		// than unescape.
		value = value[1 : len(value)-1]
		if strings.ContainsAny(value, "\\\"") {
			return ""
		}
		return value
	}
	return ""
}
