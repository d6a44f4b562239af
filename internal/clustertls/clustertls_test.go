package clustertls

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"testing"
)

// The pin vouches for one CA under one token, and is keyed by the token
// stretched (PinKey), never by the token itself: a pin anyone can fetch
// must not test a guess of the token at the cost of one HMAC.
func TestPin(t *testing.T) {
	ca, err := NewCA("pinnedd test CA")
	if err != nil {
		t.Fatal(err)
	}
	other, err := NewCA("pinnedd test CA")
	if err != nil {
		t.Fatal(err)
	}
	const token = "a-deployment-token-of-some-length-0123"
	pin, err := Pin(token, ca.CertPEM())
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckPin(token, ca.CertPEM(), pin); err != nil {
		t.Fatalf("own pin refused: %v", err)
	}
	flipped := "0" // the pin with its last digit changed (it may be 0 already)
	if pin[len(pin)-1] == '0' {
		flipped = "1"
	}
	for name, check := range map[string]error{
		"another token": CheckPin(token+"x", ca.CertPEM(), pin),
		"another CA":    CheckPin(token, other.CertPEM(), pin),
		"another pin":   CheckPin(token, ca.CertPEM(), pin[:len(pin)-1]+flipped),
	} {
		if !errors.Is(check, ErrPinMismatch) {
			t.Errorf("%s: %v, want ErrPinMismatch", name, check)
		}
	}
	cert, _ := ParseCert(ca.CertPEM())
	plain := hmac.New(sha256.New, []byte(token))
	plain.Write([]byte("pinnedd cluster CA\x00"))
	plain.Write(cert.Raw)
	if pin == hex.EncodeToString(plain.Sum(nil)) {
		t.Fatal("the pin is keyed by the token itself: one HMAC tests a guess")
	}
	if PinIterations < 100_000 {
		t.Fatalf("PinIterations = %d: too cheap a guess", PinIterations)
	}
}

// BenchmarkPinKey is what one guess of the token costs through the pin.
func BenchmarkPinKey(b *testing.B) {
	for b.Loop() {
		pinKeys.Clear()
		if _, err := PinKey("token"); err != nil {
			b.Fatal(err)
		}
	}
}
