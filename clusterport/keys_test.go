package clusterport

import (
	"bytes"
	"errors"
	"os"
	"testing"

	"github.com/pinnedd/pinnedd/internal/clustertls"
)

// A bootstrap node makes the cluster CA and its own certificate, its keys
// sealed at rest; started again it loads the same identity; the directory
// refuses another node's id, a member's id without a certificate, a key
// sealed under another token, and half of an operator's own PKI.
func TestLoadIdentity(t *testing.T) {
	sealer, err := clustertls.NewSealer("token-0123456789abcdef0123456789abcdef")
	if err != nil {
		t.Fatal(err)
	}
	k := Keys{Dir: t.TempDir(), Sealer: sealer, Logger: testLogger()}
	setup := Setup{NodeID: "n1", Create: true, Hosts: Hosts("127.0.0.1:7000", "127.0.0.1:7000")}
	id, ca, err := LoadIdentity(k, setup)
	if err != nil || !id.Ready() || ca == nil || id.NodeID() != "n1" {
		t.Fatalf("created: %v, ready %v, CA %v", err, id != nil && id.Ready(), ca != nil)
	}
	for _, name := range []string{clustertls.KeyFile, clustertls.CAKeyFile} {
		if b, err := os.ReadFile(k.Path(name)); err != nil || !clustertls.IsSealed(b) {
			t.Errorf("%s not sealed at rest: %v", name, err)
		}
	}
	_, cert, _ := id.Leaf()
	again, ca2, err := LoadIdentity(k, Setup{NodeID: "n1", Existing: true})
	if _, cert2, _ := again.Leaf(); err != nil || !bytes.Equal(cert, cert2) || ca2 == nil {
		t.Fatalf("loaded again: %v, same certificate %v, CA %v", err, bytes.Equal(cert, cert2), ca2 != nil)
	}
	refused := map[string]struct {
		k Keys
		s Setup
	}{
		"another node's dir":      {k, Setup{NodeID: "n2"}},
		"a member without a cert": {Keys{Dir: t.TempDir(), Logger: testLogger()}, Setup{NodeID: "n1", Existing: true}},
		"half an own PKI":         {k, Setup{NodeID: "n1", CAFile: k.Path(clustertls.CAFile)}},
	}
	other, _ := clustertls.NewSealer("another-token-0123456789abcdef012345")
	refused["another token"] = struct {
		k Keys
		s Setup
	}{Keys{Dir: k.Dir, Sealer: other, Logger: testLogger()}, Setup{NodeID: "n1"}}
	for name, c := range refused {
		if _, _, err := LoadIdentity(c.k, c.s); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: %v, want ErrConfig", name, err)
		}
	}
}
