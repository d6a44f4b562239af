package sdk_test

import (
	"os"
	"regexp"
	"strconv"
	"testing"

	"github.com/pinnedd/pinnedd/plugins/sdk"
	"github.com/pinnedd/pinnedd/statestore"
)

// The package doc states each limit's value next to its name, for readers
// of go doc (where a constant shows only as statestore's name): every such
// number must be the constant's.
func TestDocStatesTheLimits(t *testing.T) {
	doc, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	limits := map[string]int{
		"MaxTrayNameLen": sdk.MaxTrayNameLen, "MaxFieldNameLen": sdk.MaxFieldNameLen,
		"MaxValueLen": sdk.MaxValueLen, "MaxAppendItems": sdk.MaxAppendItems, "MaxAppendBytes": sdk.MaxAppendBytes,
		"statestore.MaxMutations": statestore.MaxMutations, "statestore.MaxCommitBytes": statestore.MaxCommitBytes,
	}
	unit := map[string]int{"": 1, " bytes": 1, " MiB": 1 << 20}
	seen := map[string]bool{}
	for _, m := range regexp.MustCompile(`((?:statestore\.)?Max\w+) \((\d+)( bytes| MiB|)\)`).FindAllStringSubmatch(string(doc), -1) {
		want, ok := limits[m[1]]
		if !ok {
			t.Errorf("doc names %s, not a known limit", m[1])
			continue
		}
		n, _ := strconv.Atoi(m[2])
		if n*unit[m[3]] != want {
			t.Errorf("doc says %s is %s%s, it is %d", m[1], m[2], m[3], want)
		}
		seen[m[1]] = true
	}
	for name := range limits {
		if !seen[name] {
			t.Errorf("doc does not state %s's value", name)
		}
	}
}
