package boltstore_test

import (
	"path/filepath"
	"testing"

	"github.com/pinnedd/pinnedd/statestore"
	"github.com/pinnedd/pinnedd/statestore/boltstore"
	"github.com/pinnedd/pinnedd/statestore/storetest"
)

func open(t *testing.T, path string) *boltstore.Store {
	t.Helper()
	s, err := boltstore.Open(path)
	if err != nil {
		t.Fatalf("Open(%s): %v", path, err)
	}
	return s
}

func TestConformance(t *testing.T) {
	storetest.Run(t,
		func(t *testing.T) statestore.Store {
			return open(t, filepath.Join(t.TempDir(), "state.db"))
		},
		storetest.WithReopen(func(t *testing.T, s statestore.Store) statestore.Store {
			path := s.(*boltstore.Store).Path()
			if err := s.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			return open(t, path)
		}),
	)
}

func BenchmarkCommit(b *testing.B) {
	s, err := boltstore.Open(filepath.Join(b.TempDir(), "state.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	storetest.BenchCommit(b, s)
}
