package passport

import (
	"fmt"
	"testing"
)

// A token finds its key in the same time with one key as with a thousand:
// `go test -bench Lookup ./passport`.
func BenchmarkLookup(b *testing.B) {
	for _, n := range []int{1, 1000} {
		p := Single()
		var last string
		for i := range n {
			last = fmt.Sprintf("token-%04d-0123456789abcdef0123456789", i)
			p.Add(&Key{Name: fmt.Sprint(i), Scopes: []Scope{Operator}, Claims: unrestricted}, last)
		}
		b.Run(fmt.Sprintf("keys=%d", n), func(b *testing.B) {
			for b.Loop() {
				if _, ok := p.Lookup(last); !ok {
					b.Fatal("not found")
				}
			}
		})
	}
}
