package testutil

import (
	"os"
	"testing"

	"github.com/pinnedd/pinnedd/internal/clustertls"
)

// OpenSealed reads the key file at path, which a node of a fleet run with
// Token sealed at rest, and opens it as label (clustertls.LabelNodeKey,
// LabelCAKey): what a test needs to act with a node's own key.
func OpenSealed(tb testing.TB, path, label string) []byte {
	tb.Helper()
	sealed, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	s, err := clustertls.NewSealer(Token)
	if err != nil {
		tb.Fatal(err)
	}
	plain, err := s.Open(label, sealed)
	if err != nil {
		tb.Fatalf("%s: %v", path, err)
	}
	return plain
}
