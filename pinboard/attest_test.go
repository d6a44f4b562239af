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
