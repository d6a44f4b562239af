package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/pinnedd/pinnedd/internal/clustertls"
)

// `pinnedd tls ca create` and `tls cert create --node` make files a node
// takes as --tls-ca/--tls-cert/--tls-key: the certificate chains to the CA
// and names the node; a second run never overwrites the CA.
func TestTLSCommandsMakeAUsablePKI(t *testing.T) {
	dir := t.TempDir()
	var out bytes.Buffer
	app := &cli.App{Writer: &out, Commands: []*cli.Command{tlsCommand()}}
	run := func(args ...string) error { return app.Run(append([]string{"pinnedd", "tls"}, args...)) }
	if err := run("ca", "create", "--dir", dir); err != nil {
		t.Fatal(err)
	}
	ca := filepath.Join(dir, "pinnedd-ca.pem")
	caKey := filepath.Join(dir, "pinnedd-ca-key.pem")
	if err := run("cert", "create", "--node", "n1", "--host", "10.0.0.5", "--ca", ca, "--ca-key", caKey, "--dir", dir); err != nil {
		t.Fatal(err)
	}
	read := func(name string) []byte {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	id := &clustertls.Identity{}
	if err := id.Set(read("pinnedd-ca.pem"), read("n1.pem"), read("n1-key.pem")); err != nil {
		t.Fatalf("the files do not make an identity: %v", err)
	}
	if id.NodeID() != "n1" {
		t.Fatalf("node id %q", id.NodeID())
	}
	if st, err := os.Stat(caKey); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("CA key mode: %v %v", st.Mode(), err)
	}
	before := read("pinnedd-ca-key.pem")
	if err := run("ca", "create", "--dir", dir); err == nil || !strings.Contains(err.Error(), "not overwriting") {
		t.Fatalf("a second ca create: %v", err)
	}
	if !bytes.Equal(before, read("pinnedd-ca-key.pem")) {
		t.Fatal("the CA key was overwritten")
	}
	if err := run("cert", "create", "--node", "n2", "--ca", filepath.Join(dir, "nope.pem"), "--dir", dir); err == nil || !strings.Contains(err.Error(), "pinnedd tls ca create") {
		t.Fatalf("cert create without a CA: %v", err)
	}
}
