package clustertls

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/pem"
	"errors"
	"fmt"
)

// ErrSealed means sealed bytes would not open: another deployment token sealed them, or they
// were altered.
var ErrSealed = errors.New("clustertls: sealed key does not open with this node's token")

// sealedType is the PEM type of what a Sealer seals; the block's Label header says what it is.
const sealedType = "PINNEDD SEALED"

// Sealer keeps the cluster's keys at rest (the CA key, a node's key, the cluster secret)
// sealed under the deployment token, which pinnedd holds and its plugins never see: a process
// that can read the data dir and the Raft log, but not the token, learns none of them.
// AES-256-GCM under a key derived (HKDF-SHA256) from the token stretched as for the CA pin
// (PinKey); what a sealed value is (its label) is bound to it, so one cannot stand in for
// another.
//
// It seals with the first token it was made with and opens with any of them: a token being
// rotated opens what the old one sealed.
type Sealer struct {
	aeads []cipher.AEAD
}

// NewSealer makes a Sealer for tokens (the first seals). No token: an error.
func NewSealer(tokens ...string) (*Sealer, error) {
	if len(tokens) == 0 {
		return nil, errors.New("clustertls: a sealer needs the deployment token")
	}
	s := &Sealer{}
	for _, t := range tokens {
		stretched, err := PinKey(t)
		if err != nil {
			return nil, err
		}
		key, err := hkdf.Key(sha256.New, stretched, nil, "pinnedd keys at rest v1", 32)
		if err != nil {
			return nil, fmt.Errorf("clustertls: sealing key: %w", err)
		}
		block, err := aes.NewCipher(key)
		if err != nil {
			return nil, err
		}
		aead, err := cipher.NewGCM(block)
		if err != nil {
			return nil, err
		}
		s.aeads = append(s.aeads, aead)
	}
	return s, nil
}

// Seal seals plain as label, PEM-armoured.
func (s *Sealer) Seal(label string, plain []byte) []byte {
	a := s.aeads[0]
	nonce := make([]byte, a.NonceSize())
	_, _ = rand.Read(nonce) // crypto/rand.Read never fails
	return pem.EncodeToMemory(&pem.Block{
		Type:    sealedType,
		Headers: map[string]string{"Label": label},
		Bytes:   a.Seal(nonce, nonce, plain, []byte(label)),
	})
}

// Open opens what Seal sealed as label.
func (s *Sealer) Open(label string, sealed []byte) ([]byte, error) {
	plain, _, err := s.OpenStale(label, sealed)
	return plain, err
}

// OpenStale is Open, also saying whether a token other than the first
// opened it: a token being rotated out sealed it, and the caller seals it
// again (Seal) before that token goes.
func (s *Sealer) OpenStale(label string, sealed []byte) (plain []byte, stale bool, err error) {
	b, _ := pem.Decode(sealed)
	if b == nil || b.Type != sealedType {
		return nil, false, fmt.Errorf("%w: not sealed", ErrBadPEM)
	}
	if b.Headers["Label"] != label {
		return nil, false, fmt.Errorf("%w: sealed as %q, wanted %q", ErrSealed, b.Headers["Label"], label)
	}
	for i, a := range s.aeads {
		if len(b.Bytes) < a.NonceSize() {
			break
		}
		nonce, ct := b.Bytes[:a.NonceSize()], b.Bytes[a.NonceSize():]
		if plain, err := a.Open(nil, nonce, ct, []byte(label)); err == nil {
			return plain, i > 0, nil
		}
	}
	return nil, false, ErrSealed
}

// IsSealed reports whether b is a sealed value (of any label).
func IsSealed(b []byte) bool {
	return bytes.HasPrefix(bytes.TrimSpace(b), []byte("-----BEGIN "+sealedType+"-----"))
}

// Labels of the values pinnedd seals.
const (
	LabelCAKey         = "cluster CA key"
	LabelNodeKey       = "node key"
	LabelClusterSecret = "cluster secret"
)
