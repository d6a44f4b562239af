package pinboard

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"hash"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
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
func attestMAC(key []byte, a Attestation, method, path string) (mac [sha256.Size]byte) {
	return attestMACWith(macsFor(key), a, method, path)
}

// attestMACWith is attestMAC with the key's pooled HMAC states.
func attestMACWith(macs *keyedMACs, a Attestation, method, path string) (mac [sha256.Size]byte) {
	st := macs.Get().(*macState)
	msg := append(st.msg[:0], "pinned-attestation-v1\n"...)
	msg = append(append(msg, a.Target...), '\n')
	msg = append(append(msg, a.Caller...), '\n')
	msg = append(strconv.AppendUint(msg, a.Generation, 10), '\n')
	msg = append(strconv.AppendInt(msg, a.At.UnixMilli(), 10), '\n')
	msg = append(append(msg, a.Nonce...), '\n')
	msg = append(append(msg, method...), '\n')
	msg = append(append(msg, path...), '\n')
	st.h.Write(msg)
	copy(mac[:], st.h.Sum(st.sum[:0]))
	// Reset restores the keyed state hmac saved at its first Sum: the
	// next request skips the key schedule and the allocations.
	st.h.Reset()
	if cap(msg) <= 4<<10 {
		st.msg = msg
	}
	macs.Put(st)
	return mac
}

// macState is one pooled HMAC and its scratch space (an interface call
// would move stack buffers to the heap).
type macState struct {
	h   hash.Hash
	msg []byte
	sum [sha256.Size]byte
}

// keyedMACs pools HMAC-SHA256 states for one key.
type keyedMACs struct {
	key string
	sync.Pool
}

func newKeyedMACs(key string) *keyedMACs {
	p := &keyedMACs{key: key}
	p.New = func() any { return &macState{h: hmac.New(sha256.New, []byte(p.key)), msg: make([]byte, 0, 256)} }
	return p
}

// maxCachedKeys bounds each key cache below; past it the cache starts
// afresh (keys are few: one per live worker session and the secret).
const maxCachedKeys = 4096

// macCache holds the pools of the keys in use, by key: copied on write,
// so the per-request lookup is one atomic load and a map read.
var (
	macCache   atomic.Pointer[map[string]*keyedMACs]
	macCacheMu sync.Mutex
)

func macsFor(key []byte) *keyedMACs {
	if m := macCache.Load(); m != nil {
		if p := (*m)[string(key)]; p != nil {
			return p
		}
	}
	macCacheMu.Lock()
	defer macCacheMu.Unlock()
	old := macCache.Load()
	if old != nil {
		if p := (*old)[string(key)]; p != nil {
			return p
		}
	}
	next := map[string]*keyedMACs{}
	if old != nil && len(*old) < maxCachedKeys {
		for k, v := range *old {
			next[k] = v
		}
	}
	p := newKeyedMACs(string(key))
	next[p.key] = p
	macCache.Store(&next)
	return p
}

// WorkerKey is the key a front door signs the attestations for one worker
// session with, and the key that session verifies them with (REGISTRY.md,
// "Attestation"): HMAC-SHA256 keyed by the cluster secret over
// "pinned-worker-key-v1\n" + clientId + "\n" + sessionId + "\n". Every
// node derives it from its replica (no Raft write, and it survives leader
// changes); the registry hands it to the worker in the register answer.
// The cluster secret never leaves the nodes, and one session's key says
// nothing about another's, so a worker can forge for no other worker, nor
// for its own next session.
func WorkerKey(secret []byte, clientID, sessionID string) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write([]byte("pinned-worker-key-v1\n" + clientID + "\n" + sessionID + "\n"))
	return h.Sum(nil)
}

// sessionRef names one worker session.
type sessionRef struct{ client, session string }

// sessionKeyCache holds derived session keys' pools for one cluster
// secret, copied on write like macCache.
type sessionKeyCache struct {
	secret string
	keys   map[sessionRef]*keyedMACs
}

var (
	sessionKeys   atomic.Pointer[sessionKeyCache]
	sessionKeysMu sync.Mutex
)

// sessionMACs is the pool for WorkerKey(secret, clientID, sessionID),
// derived once per session.
func sessionMACs(secret []byte, clientID, sessionID string) *keyedMACs {
	ref := sessionRef{clientID, sessionID}
	if c := sessionKeys.Load(); c != nil && c.secret == string(secret) {
		if p := c.keys[ref]; p != nil {
			return p
		}
	}
	sessionKeysMu.Lock()
	defer sessionKeysMu.Unlock()
	old := sessionKeys.Load()
	next := &sessionKeyCache{secret: string(secret), keys: map[sessionRef]*keyedMACs{}}
	if old != nil && old.secret == next.secret {
		if p := old.keys[ref]; p != nil {
			return p
		}
		if len(old.keys) < maxCachedKeys {
			for k, v := range old.keys {
				next.keys[k] = v
			}
		}
	}
	p := newKeyedMACs(string(WorkerKey(secret, clientID, sessionID)))
	// Copies, so the cache does not keep a request's strings alive.
	next.keys[sessionRef{strings.Clone(clientID), strings.Clone(sessionID)}] = p
	sessionKeys.Store(next)
	return p
}

// Nonces need to be unique, not secret (the MAC covers them): a random
// prefix per process and a counter, rather than a random read per request.
var (
	noncePrefix = func() (b [12]byte) { _, _ = rand.Read(b[:6]); return b }()
	nonceSeq    atomic.Uint64
)

// Sign returns the header value attesting a for method and path (the
// escaped instance path, query included), MACed with key.
func Sign(key []byte, a Attestation, method, path string) string {
	return signWith(macsFor(key), a, method, path)
}

// SignFor is Sign for the worker session (a.Target, sessionID): MACed with
// WorkerKey(secret, a.Target, sessionID), the key that session verifies
// with. Every attested request a front door sends a worker is signed so.
func SignFor(secret []byte, sessionID string, a Attestation, method, path string) string {
	return signWith(sessionMACs(secret, a.Target, sessionID), a, method, path)
}

func signWith(macs *keyedMACs, a Attestation, method, path string) string {
	var nonce [16]byte
	if a.Nonce == "" {
		b := noncePrefix
		n := nonceSeq.Add(1)
		for i := 11; i >= 6; i-- {
			b[i], n = byte(n), n>>8
		}
		base64.RawURLEncoding.Encode(nonce[:], b[:])
		a.Nonce = string(nonce[:])
	}
	mac := attestMACWith(macs, a, method, path)
	// A constant capacity keeps the buffer on the stack; longer ids grow it.
	out := make([]byte, 0, 256)
	out = append(out, "v1."...)
	out = append(append(out, a.Target...), '.')
	out = append(append(out, a.Caller...), '.')
	out = append(strconv.AppendUint(out, a.Generation, 10), '.')
	out = append(strconv.AppendInt(out, a.At.UnixMilli(), 10), '.')
	out = append(append(out, a.Nonce...), '.')
	out = base64.RawURLEncoding.AppendEncode(out, mac[:])
	return string(out)
}

// Verifier checks attestations and remembers nonces for the window, so a
// captured request cannot be replayed.
//
// Sign's nonces are a per-process prefix and a counter, so the nonces one
// signer spends here are remembered as one bit per counter, in chunks of
// nonceChunkBits; any other nonce goes in a map. Either way a nonce is
// forgotten once a replay of it would be refused as expired anyway. The
// bitmap keeps the replay cache small and cheap at the owner's request
// rate (DESIGN.md, "Figures").
type Verifier struct {
	Window time.Duration

	mu        sync.Mutex
	signers   map[[6]byte]map[uint64]*nonceChunk // by prefix, then counter / nonceChunkBits
	other     map[string]int64                   // nonce -> when it may be forgotten (unix ns)
	nextSweep int64
}

const nonceChunkBits = 1024

// nonceChunk is one signer's spent counters in one range, and when the
// latest of them may be forgotten (unix ns).
type nonceChunk struct {
	bits     [nonceChunkBits / 64]uint64
	forgetAt int64
}

// Verify checks header for method and path against key at now, for the
// worker self. On success the nonce is spent.
func (v *Verifier) Verify(key []byte, header, self, method, path string, now time.Time) (Attestation, error) {
	a, err := v.Check(key, header, self, method, path, now)
	if err != nil {
		return Attestation{}, err
	}
	if err := v.Spend(a, now); err != nil {
		return Attestation{}, err
	}
	return a, nil
}

// Check is Verify without spending the nonce: a caller that may still
// leave the request to Verify (the kept-alive loop) checks first, and
// spends only once it serves the request itself.
func (v *Verifier) Check(key []byte, header, self, method, path string, now time.Time) (Attestation, error) {
	if header == "" {
		return Attestation{}, ErrAttestationMissing
	}
	if len(key) == 0 {
		return Attestation{}, ErrAttestationNoKey
	}
	// v1.target.caller.generation.ms.nonce.mac, split without allocating.
	var parts [7]string
	rest := header
	for i := range 6 {
		var ok bool
		if parts[i], rest, ok = strings.Cut(rest, "."); !ok {
			return Attestation{}, ErrAttestationMalformed
		}
	}
	parts[6] = rest
	if strings.IndexByte(rest, '.') >= 0 || parts[0] != "v1" || parts[5] == "" || len(parts[5]) > 64 {
		return Attestation{}, ErrAttestationMalformed
	}
	gen, err1 := strconv.ParseUint(parts[3], 10, 64)
	ms, err2 := strconv.ParseInt(parts[4], 10, 64)
	var macBuf [sha256.Size]byte
	n, err3 := 0, error(nil)
	if base64.RawURLEncoding.DecodedLen(len(parts[6])) != len(macBuf) {
		err3 = ErrAttestationMalformed
	} else {
		var enc [64]byte // on the stack, unlike []byte(parts[6])
		n, err3 = base64.RawURLEncoding.Decode(macBuf[:], enc[:copy(enc[:], parts[6])])
	}
	if err1 != nil || err2 != nil || err3 != nil || gen == 0 {
		return Attestation{}, ErrAttestationMalformed
	}
	a := Attestation{Target: parts[1], Caller: parts[2], Generation: gen, At: time.UnixMilli(ms), Nonce: parts[5]}
	want := attestMAC(key, a, method, path)
	if !hmac.Equal(macBuf[:n], want[:]) {
		return Attestation{}, ErrAttestationForged
	}
	if a.Target != self {
		return Attestation{}, fmt.Errorf("%w: for worker %s, this is %s", ErrAttestationForged, a.Target, self)
	}
	if d, window := now.Sub(a.At), v.window(); d > window || d < -window {
		return Attestation{}, ErrAttestationExpired
	}
	return a, nil
}

// window is how far from now an attestation's time may be.
func (v *Verifier) window() time.Duration {
	if v.Window <= 0 {
		return DefaultAttestationWindow
	}
	return v.Window
}

// Spend records a's nonce as used; ErrAttestationReplayed if it was.
func (v *Verifier) Spend(a Attestation, now time.Time) error {
	window := v.window()
	// Once At + window has passed, Check refuses the attestation as
	// expired: the nonce need not be remembered longer.
	forget := a.At.Add(window).UnixNano()
	prefix, counter, counted := counterNonce(a.Nonce)
	v.mu.Lock()
	defer v.mu.Unlock()
	if t := now.UnixNano(); t >= v.nextSweep {
		v.sweepLocked(t)
		v.nextSweep = t + int64(window/8)
	}
	if !counted {
		if _, dup := v.other[a.Nonce]; dup {
			return ErrAttestationReplayed
		}
		if v.other == nil {
			v.other = map[string]int64{}
		}
		// A copy: the nonce must not keep the whole header alive.
		v.other[strings.Clone(a.Nonce)] = forget
		return nil
	}
	chunks := v.signers[prefix]
	if chunks == nil {
		if v.signers == nil {
			v.signers = map[[6]byte]map[uint64]*nonceChunk{}
		}
		chunks = map[uint64]*nonceChunk{}
		v.signers[prefix] = chunks
	}
	c := chunks[counter/nonceChunkBits]
	if c == nil {
		c = &nonceChunk{}
		chunks[counter/nonceChunkBits] = c
	}
	bit := counter % nonceChunkBits
	word, mask := bit/64, uint64(1)<<(bit%64)
	if c.bits[word]&mask != 0 {
		return ErrAttestationReplayed
	}
	c.bits[word] |= mask
	c.forgetAt = max(c.forgetAt, forget)
	return nil
}

// sweepLocked forgets what may be forgotten at now (unix ns).
func (v *Verifier) sweepLocked(now int64) {
	for prefix, chunks := range v.signers {
		for i, c := range chunks {
			if c.forgetAt < now {
				delete(chunks, i)
			}
		}
		if len(chunks) == 0 {
			delete(v.signers, prefix)
		}
	}
	for n, at := range v.other {
		if at < now {
			delete(v.other, n)
		}
	}
}

// counterNonce splits a nonce of Sign's shape (12 bytes, base64: a 6-byte
// prefix and a 48-bit counter).
func counterNonce(n string) (prefix [6]byte, counter uint64, ok bool) {
	if len(n) != 16 {
		return prefix, 0, false
	}
	var b [12]byte
	var enc [16]byte
	if k, err := base64.RawURLEncoding.Decode(b[:], enc[:copy(enc[:], n)]); err != nil || k != 12 {
		return prefix, 0, false
	}
	copy(prefix[:], b[:6])
	for _, x := range b[6:] {
		counter = counter<<8 | uint64(x)
	}
	return prefix, counter, true
}
