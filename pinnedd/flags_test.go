package main

import (
	"strings"
	"testing"
)

// TestFlagsSayTheirDefaultOnce: a flag's help line states its default once,
// where urfave/cli prints it ("(default: ...)"), not also in its usage text.
func TestFlagsSayTheirDefaultOnce(t *testing.T) {
	for _, l := range leafCommands(newApp().Commands, nil) {
		for _, f := range l.cmd.Flags {
			line := f.String()
			if u := f.(interface{ GetUsage() string }).GetUsage(); strings.Contains(strings.ToLower(u), "default") {
				t.Errorf("pinnedd %s: --%s: its usage text names a default; that belongs in DefaultText: %s", strings.Join(l.path, " "), f.Names()[0], u)
			}
			if n := strings.Count(strings.ToLower(line), "default"); n > 1 {
				t.Errorf("pinnedd %s: %s says a default %d times", strings.Join(l.path, " "), line, n)
			}
		}
	}
}
