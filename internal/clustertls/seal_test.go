package clustertls

import (
	"bytes"
	"errors"
	"testing"
)

func TestSealOpens(t *testing.T) {
	s, err := NewSealer("token-one")
	if err != nil {
		t.Fatal(err)
	}
	plain := []byte("the CA key")
	sealed := s.Seal(LabelCAKey, plain)
	if !IsSealed(sealed) || bytes.Contains(sealed, plain) {
		t.Fatalf("sealed form %q", sealed)
	}
	if got, err := s.Open(LabelCAKey, sealed); err != nil || !bytes.Equal(got, plain) {
		t.Fatalf("open: %q, %v", got, err)
	}
	if bytes.Equal(sealed, s.Seal(LabelCAKey, plain)) {
		t.Fatal("two seals of the same key are equal: the nonce is not fresh")
	}

	// Under another label (a node key passed off as the CA key), another token, or
	// altered: it does not open.
	if _, err := s.Open(LabelNodeKey, sealed); !errors.Is(err, ErrSealed) {
		t.Fatalf("open under another label: %v", err)
	}
	other, _ := NewSealer("token-two")
	if _, err := other.Open(LabelCAKey, sealed); !errors.Is(err, ErrSealed) {
		t.Fatalf("open with another token: %v", err)
	}
	altered := bytes.Replace(sealed, []byte("Label: cluster CA key"), []byte("Label: node key"), 1)
	if _, err := s.Open(LabelNodeKey, altered); !errors.Is(err, ErrSealed) {
		t.Fatalf("open with its label rewritten: %v", err)
	}
	if _, err := s.Open(LabelCAKey, plain); !errors.Is(err, ErrBadPEM) || IsSealed(plain) {
		t.Fatalf("open of bytes in clear: %v", err)
	}

	// Rotation: a sealer with a new token first still opens what the old one sealed, and
	// seals with the new one.
	rotated, _ := NewSealer("token-two", "token-one")
	if got, err := rotated.Open(LabelCAKey, sealed); err != nil || !bytes.Equal(got, plain) {
		t.Fatalf("open of the old token's seal during rotation: %q, %v", got, err)
	}
	if _, err := s.Open(LabelCAKey, rotated.Seal(LabelCAKey, plain)); !errors.Is(err, ErrSealed) {
		t.Fatalf("the rotated sealer sealed with the old token: %v", err)
	}
	// What the old token sealed is stale (to seal again), what the new one did is not.
	if _, stale, err := rotated.OpenStale(LabelCAKey, sealed); err != nil || !stale {
		t.Fatalf("the old token's seal: stale %v, %v", stale, err)
	}
	if _, stale, err := rotated.OpenStale(LabelCAKey, rotated.Seal(LabelCAKey, plain)); err != nil || stale {
		t.Fatalf("the new token's seal: stale %v, %v", stale, err)
	}
	if _, err := NewSealer(); err == nil {
		t.Fatal("a sealer without a token")
	}
}
