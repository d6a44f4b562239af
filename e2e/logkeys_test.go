package e2e

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// One instance is named one way in every log line: "instance", with the
// value <namespace>/<id>, so an operator's grep for an id finds every line
// about it. This holds the tree's log calls (slog's Debug, Info, Warn,
// Error, Log and With) to it: none names an instance by another key.
func TestLogLinesNameAnInstanceOneWay(t *testing.T) {
	logCalls := map[string]bool{"Debug": true, "Info": true, "Warn": true, "Error": true, "Log": true, "With": true,
		"DebugContext": true, "InfoContext": true, "WarnContext": true, "ErrorContext": true}
	fset := token.NewFileSet()
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || !logCalls[sel.Sel.Name] {
				return true
			}
			keys := map[string]bool{}
			for _, a := range call.Args {
				if lit, ok := a.(*ast.BasicLit); ok && lit.Kind == token.STRING {
					if s, err := strconv.Unquote(lit.Value); err == nil {
						keys[s] = true
					}
				}
			}
			for _, bad := range []string{"key", "ns", "instance_id"} {
				if keys[bad] {
					t.Errorf("%s: a log line names an instance by %q; use \"instance\" (<namespace>/<id>)", fset.Position(call.Pos()), bad)
				}
			}
			if keys["namespace"] && keys["id"] {
				t.Errorf("%s: a log line names an instance by \"namespace\" and \"id\"; use \"instance\" (<namespace>/<id>)", fset.Position(call.Pos()))
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
