package memstore_test

import (
	"testing"

	"github.com/pinnedd/pinnedd/statestore"
	"github.com/pinnedd/pinnedd/statestore/memstore"
	"github.com/pinnedd/pinnedd/statestore/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) statestore.Store { return memstore.New() })
}

func BenchmarkCommit(b *testing.B) {
	s := memstore.New()
	defer s.Close()
	storetest.BenchCommit(b, s)
}
