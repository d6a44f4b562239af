package main

import (
	"bufio"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// docCommandLines finds the `pinnedd ...` command lines the docs show: in
// the code blocks of the Markdown files and the indented examples of Go doc
// comments under root. Each is its words up to the first shell operator or
// comment.
func docCommandLines(t *testing.T, root string) map[string][]string {
	t.Helper()
	lines := map[string][]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); name == ".git" || name == "node_modules" || name == "testdata" {
				return filepath.SkipDir
			}
			return nil
		}
		isMD, isGo := strings.HasSuffix(path, ".md"), strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go")
		if !isMD && !isGo {
			return nil
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		sc.Buffer(nil, 1<<20)
		inBlock := false
		for n := 1; sc.Scan(); n++ {
			l := sc.Text()
			switch {
			case isMD && strings.HasPrefix(strings.TrimSpace(l), "```"):
				inBlock = !inBlock
				continue
			case isMD && !inBlock:
				continue
			case isGo:
				if !strings.HasPrefix(l, "//\t") {
					continue
				}
				l = strings.TrimPrefix(l, "//")
			}
			words := strings.Fields(l)
			if len(words) < 2 || words[0] != "pinnedd" {
				continue
			}
			for i, w := range words {
				if strings.HasPrefix(w, "#") || strings.ContainsAny(w, "&|;><`") || strings.HasPrefix(w, "[") {
					words = words[:i]
					break
				}
			}
			lines[filepath.ToSlash(path)+":"+strconv.Itoa(n)] = words
		}
		return sc.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	return lines
}

// TestDocCommandLines: every pinnedd command line the docs show names
// commands and flags pinnedd has.
func TestDocCommandLines(t *testing.T) {
	lines := docCommandLines(t, "..")
	if len(lines) < 10 {
		t.Fatalf("found only %d documented command lines: %v", len(lines), lines)
	}
	for where, words := range lines {
		if _, err := reorderArgs(newApp(), words); err != nil {
			t.Errorf("%s: %q: %v", where, strings.Join(words, " "), err)
		}
	}
}

// TestReadmeUndoesItsDatabases: whatever database the README has you
// create, it also says how to drop, so a walkthrough can be started over.
func TestReadmeUndoesItsDatabases(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	created := regexp.MustCompile(`createdb [^\n]*?(pinnedd_\w+)`).FindAllStringSubmatch(readme, -1)
	if len(created) == 0 {
		t.Fatal("the README creates no database: the pattern is stale")
	}
	for _, m := range created {
		if !regexp.MustCompile(`dropdb [^\n` + "`" + `]*\b` + m[1] + `\b`).MatchString(readme) {
			t.Errorf("the README creates database %s but never says how to drop it", m[1])
		}
	}
	if !strings.Contains(readme, "rm -rf data && dropdb -h 127.0.0.1 -U postgres pinnedd_fleet") {
		t.Error("the fleet walkthrough does not say how to start over (rm -rf data && dropdb ... pinnedd_fleet)")
	}
}
