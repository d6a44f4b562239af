package clusterport

import (
	"log/slog"
	"testing"

	"github.com/pinnedd/pinnedd/internal/clustertls"
)

// The ledger's rules, entry by entry: the first CA recorded stays, a rotation adds the CA that
// issues from then on, only a CA that does not issue retires (and its key goes), and a key comes
// back sealed only as a newer record of the same CA.
func TestLedgerApplyRules(t *testing.T) {
	sealer, err := clustertls.NewSealer("a-token-of-at-least-thirty-two-characters")
	if err != nil {
		t.Fatal(err)
	}
	newCA := func(name string) (cert, key string) {
		ca, err := clustertls.NewCA(name)
		if err != nil {
			t.Fatal(err)
		}
		return string(ca.CertPEM()), string(ca.KeyPEM())
	}
	unusable := 0
	l := NewLedger(sealer, 0, slog.New(slog.DiscardHandler))
	l.CountUnusable(func() { unusable++ })
	first, firstKey := newCA("first")
	second, secondKey := newCA("second")

	if l.Apply(OpCARetire, first, "") || l.Apply(OpCARotate, first, firstKey) {
		t.Fatal("a retirement or a rotation applied with no CA recorded")
	}
	if !l.Apply(OpCA, first, firstKey) || l.Apply(OpCA, second, secondKey) {
		t.Fatal("the first CA is recorded, and a second bootstrap's must not replace it")
	}
	if ca := l.Issuer(); ca == nil || string(ca.CertPEM()) != first {
		t.Fatal("the first CA does not issue")
	}
	if l.KeyToSeal() == nil {
		t.Fatal("a key recorded in clear is not one to seal")
	}
	if !l.Apply(OpCA, first, string(sealer.Seal(clustertls.LabelCAKey, []byte(firstKey)))) || l.KeyToSeal() != nil {
		t.Fatal("the CA recorded again sealed did not replace its clear key")
	}
	if l.Apply(OpCARetire, first, "") {
		t.Fatal("the issuing CA retired")
	}
	if !l.Apply(OpCARotate, second, secondKey) {
		t.Fatal("a rotation did not apply")
	}
	if _, n := l.Trusted(); n != 2 || len(l.Retirable()) != 1 || l.Retirable()[0] != first {
		t.Fatalf("after the rotation: %d trusted, retirable %d", n, len(l.Retirable()))
	}
	if ca := l.Issuer(); ca == nil || string(ca.CertPEM()) != second {
		t.Fatal("the rotated-in CA does not issue")
	}
	if !l.Apply(OpCARetire, first, "") || l.Apply(OpCARetire, first, "") {
		t.Fatal("the old CA retires once")
	}
	recs, issuer := l.Records()
	if len(recs) != 2 || !recs[0].Retired || recs[0].Key != "" || issuer != 1 {
		t.Fatalf("records %+v, issuer %d", recs, issuer)
	}
	if _, n := l.Trusted(); n != 1 {
		t.Fatalf("%d trusted after the retirement", n)
	}

	// A recorded CA whose key does not open here issues nothing, and is counted.
	other, err := clustertls.NewSealer("another-token-of-at-least-thirty-two-chars")
	if err != nil {
		t.Fatal(err)
	}
	third, thirdKey := newCA("third")
	l2 := NewLedger(sealer, 0, slog.New(slog.DiscardHandler))
	l2.CountUnusable(func() { unusable++ })
	l2.Restore([]CARecord{{Cert: third, Key: string(other.Seal(clustertls.LabelCAKey, []byte(thirdKey)))}})
	if l2.Issuer() != nil || unusable != 1 {
		t.Fatalf("a CA sealed under another token issues (unusable counted %d)", unusable)
	}
}
