package pinboard

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestAttestation(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	now := time.UnixMilli(1_800_000_000_000)
	a := Attestation{Target: "w1", Caller: "w2", Generation: 42, At: now}
	h := Sign(key, a, "POST", "/_pinned/i/counters/x/increment")

	var v Verifier
	got, err := v.Verify(key, h, "w1", "POST", "/_pinned/i/counters/x/increment", now.Add(time.Second))
	if err != nil || got.Generation != 42 || got.Caller != "w2" || got.Target != "w1" {
		t.Fatalf("valid attestation: %+v %v", got, err)
	}
	// The same header again is a replay.
	if _, err := v.Verify(key, h, "w1", "POST", "/_pinned/i/counters/x/increment", now.Add(2*time.Second)); !errors.Is(err, ErrAttestationReplayed) {
		t.Fatalf("replay: %v", err)
	}

	fresh := func() string { return Sign(key, a, "POST", "/_pinned/i/counters/x/increment") }
	for _, c := range []struct {
		name                    string
		key                     []byte
		header, self, meth, pth string
		at                      time.Time
		want                    error
	}{
		{"missing", key, "", "w1", "POST", "/_pinned/i/counters/x/increment", now, ErrAttestationMissing},
		{"no key", nil, fresh(), "w1", "POST", "/_pinned/i/counters/x/increment", now, ErrAttestationNoKey},
		{"malformed", key, "v1.a.b", "w1", "POST", "/_pinned/i/counters/x/increment", now, ErrAttestationMalformed},
		{"wrong version", key, strings.Replace(fresh(), "v1.", "v2.", 1), "w1", "POST", "/_pinned/i/counters/x/increment", now, ErrAttestationMalformed},
		{"other key", []byte("another key, same length, 32 byt"), fresh(), "w1", "POST", "/_pinned/i/counters/x/increment", now, ErrAttestationForged},
		{"other worker", key, fresh(), "w3", "POST", "/_pinned/i/counters/x/increment", now, ErrAttestationForged},
		{"other method", key, fresh(), "w1", "GET", "/_pinned/i/counters/x/increment", now, ErrAttestationForged},
		{"other path", key, fresh(), "w1", "POST", "/_pinned/i/counters/y/increment", now, ErrAttestationForged},
		{"tampered generation", key, strings.Replace(fresh(), ".42.", ".43.", 1), "w1", "POST", "/_pinned/i/counters/x/increment", now, ErrAttestationForged},
		{"too old", key, fresh(), "w1", "POST", "/_pinned/i/counters/x/increment", now.Add(DefaultAttestationWindow + time.Second), ErrAttestationExpired},
		{"from the future", key, fresh(), "w1", "POST", "/_pinned/i/counters/x/increment", now.Add(-DefaultAttestationWindow - time.Second), ErrAttestationExpired},
	} {
		var v Verifier
		if _, err := v.Verify(c.key, c.header, c.self, c.meth, c.pth, c.at); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
}

// One header verified from many goroutines at once is accepted exactly
// once: every copy of a nonce meets the same replay shard.
func TestAttestationReplayRace(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	var v Verifier
	now := time.Now()
	for i := range 50 {
		h := Sign(key, Attestation{Target: "w1", Caller: "w2", Generation: 7, At: now, Nonce: fmt.Sprintf("race%d", i)}, "GET", "/p")
		var ok atomic.Int32
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := v.Verify(key, h, "w1", "GET", "/p", now); err == nil {
					ok.Add(1)
				} else if !errors.Is(err, ErrAttestationReplayed) {
					t.Errorf("verify: %v", err)
				}
			}()
		}
		wg.Wait()
		if ok.Load() != 1 {
			t.Fatalf("nonce race%d accepted %d times, want once", i, ok.Load())
		}
	}
}

// Sign's nonces are remembered a bit per counter, other nonces in a map;
// both refuse a second use and are forgotten once their attestation has
// expired, so the cache does not grow with the request rate times forever.
func TestReplayCacheForgets(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	v := Verifier{Window: 10 * time.Second}
	t0 := time.Now()
	at := func(nonce string) Attestation {
		return Attestation{Target: "w1", Caller: "w2", Generation: 1, At: t0, Nonce: nonce}
	}
	var signed []Attestation
	for i := range 5000 {
		h := Sign(key, at(""), "GET", "/p")
		a, err := v.Verify(key, h, "w1", "GET", "/p", t0)
		if err != nil {
			t.Fatalf("fresh nonce %d: %v", i, err)
		}
		if _, _, ok := counterNonce(a.Nonce); !ok {
			t.Fatalf("Sign's nonce %q is not of the counter shape", a.Nonce)
		}
		signed = append(signed, a)
	}
	if err := v.Spend(at("explicit-nonce"), t0); err != nil {
		t.Fatal(err)
	}
	for i, a := range signed {
		if err := v.Spend(a, t0); !errors.Is(err, ErrAttestationReplayed) {
			t.Fatalf("nonce %d spent twice: %v", i, err)
		}
	}
	if err := v.Spend(at("explicit-nonce"), t0); !errors.Is(err, ErrAttestationReplayed) {
		t.Fatalf("a map nonce spent twice: %v", err)
	}
	v.mu.Lock()
	chunks := 0
	for _, cs := range v.signers {
		chunks += len(cs)
	}
	v.mu.Unlock()
	if chunks > 6 { // 5000 consecutive counters: 5 chunks, 6 if they straddle
		t.Fatalf("5000 nonces of one signer take %d chunks", chunks)
	}
	// Past At + window every one of them would be refused as expired:
	// the next spend sweeps them all away.
	later := t0.Add(v.Window + time.Second)
	if err := v.Spend(Attestation{At: later, Nonce: "after"}, later); err != nil {
		t.Fatal(err)
	}
	v.mu.Lock()
	left, others := len(v.signers), len(v.other)
	v.mu.Unlock()
	if left != 0 || others != 1 {
		t.Fatalf("after the window: %d signers and %d other nonces remembered, want 0 and 1", left, others)
	}
}
