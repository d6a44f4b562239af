package main

import (
	"go/build"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The README's layout table says what each package may import; the code
// imports nothing else of this module (test files aside). A row whose
// third column is "—" is a group of packages, not checked here.
func TestLayoutTableHoldsTheImports(t *testing.T) {
	const module = "github.com/pinnedd/pinnedd/"
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(readme), "## How the code is laid out")
	if !ok {
		t.Fatal(`README.md has no "How the code is laid out" section`)
	}
	row := regexp.MustCompile("^\\| `([a-z/]+)/` \\| .* \\| (.*) \\|$")
	name := regexp.MustCompile("`([a-z/]+)`")
	checked := 0
	for _, line := range strings.Split(table, "\n") {
		if strings.HasPrefix(line, "## ") {
			break
		}
		m := row.FindStringSubmatch(line)
		if m == nil || m[2] == "—" {
			continue
		}
		pkg := m[1]
		var allowed []string
		for _, n := range name.FindAllStringSubmatch(m[2], -1) {
			allowed = append(allowed, n[1])
		}
		bp, err := build.ImportDir(filepath.Join("..", pkg), 0)
		if err != nil {
			t.Errorf("%s: %v", pkg, err)
			continue
		}
		checked++
		var imports []string
		for _, imp := range bp.Imports {
			if own, ok := strings.CutPrefix(imp, module); ok {
				imports = append(imports, own)
				if !slices.Contains(allowed, own) {
					t.Errorf("%s imports %s, which the README's layout table does not allow it", pkg, own)
				}
			}
		}
		for _, a := range allowed {
			if !slices.Contains(imports, a) {
				t.Errorf("the README's layout table lets %s import %s, which it does not: drop it from the row", pkg, a)
			}
		}
	}
	if checked < 10 {
		t.Fatalf("checked %d rows of the layout table; is the table still there?", checked)
	}
}
