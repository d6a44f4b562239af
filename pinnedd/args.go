package main

import (
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"
)

// usageError is a command line pinnedd cannot run as typed (an unknown
// command or flag, a missing argument, a bad value): it exits 2, as Go's
// flag package does, and changes nothing.
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error {
	return &usageError{fmt.Errorf(format, args...)}
}

// completionFlag is the flag urfave/cli's shell completion appends to a
// partial command line.
const completionFlag = "--generate-bash-completion"

// reorderArgs moves every flag of the command line's (sub)command in front of
// its positional arguments, so flags work before or after arguments on every
// command, as in git and kubectl (urfave/cli v2 stops parsing flags at the
// first argument). The command's own flag definitions decide what a flag
// is: a bool flag takes no value, any other takes `--flag value` or
// `--flag=value`. `--` ends flags; what follows is passed as arguments. An
// unknown flag or command is an error naming it, so a mistyped flag can never
// be dropped and a default used in its place.
func reorderArgs(app *cli.App, args []string) ([]string, error) {
	if len(args) < 2 || args[len(args)-1] == completionFlag {
		// A partial line being completed is not ours to judge.
		return args, nil
	}
	out := []string{args[0]}
	rest := args[1:]
	// Flags before the command name: the app's own (--help, --version) stay
	// there; any other is the command's (`pinnedd --addr x status`), moved
	// after its name once the command is known, and checked against it there.
	appFlags := append(app.Flags, cli.VersionFlag)
	var early []string
	for len(rest) > 0 && isFlag(rest[0]) {
		defs := appFlags
		name, _, _ := strings.Cut(strings.TrimLeft(rest[0], "-"), "=")
		if lookupFlag(defs, name) == nil {
			defs = allFlags(app.Commands)
		}
		n, err := flagTokens(defs, rest, "pinnedd")
		if err != nil {
			return nil, err
		}
		if lookupFlag(appFlags, name) != nil {
			out = append(out, rest[:n]...)
		} else {
			early = append(early, rest[:n]...)
		}
		rest = rest[n:]
	}
	if len(early) > 0 && (len(rest) == 0 || rest[0] == "--") {
		return nil, usagef("flag %s needs a command after it; see pinnedd --help", early[0])
	}
	if len(rest) == 0 || rest[0] == "--" {
		return append(out, rest...), nil
	}
	if rest[0] == "help" || rest[0] == "h" {
		// `pinnedd help [command...]` is `pinnedd [command...] --help`.
		rest = append(rest[1:len(rest):len(rest)], "--help")
		if len(rest) == 1 {
			return append(out, rest...), nil
		}
	}
	cmds, path := app.Commands, "pinnedd"
	for {
		name := rest[0]
		cmd := findCommand(cmds, name)
		if cmd == nil {
			return nil, unknownCommand(cmds, path, name)
		}
		path += " " + cmd.Name
		out, rest = append(out, name), rest[1:]
		if len(cmd.Subcommands) > 0 {
			// A parent's own flags come before its subcommand's name; any
			// other is its subcommand's, as before the command name.
			for len(rest) > 0 && isFlag(rest[0]) {
				name, _, _ := strings.Cut(strings.TrimLeft(rest[0], "-"), "=")
				own := lookupFlag(cmd.Flags, name) != nil
				defs := cmd.Flags
				if !own {
					defs = allFlags(cmd.Subcommands)
				}
				n, err := flagTokens(defs, rest, path)
				if err != nil {
					return nil, err
				}
				if own {
					out = append(out, rest[:n]...)
				} else {
					early = append(early, rest[:n]...)
				}
				rest = rest[n:]
			}
			if len(rest) == 0 || rest[0] == "--" || helpRequested(out) {
				if len(early) > 0 && !helpRequested(out) {
					return nil, usagef("flag %s needs a command of %s after it; see %s --help", early[0], path, path)
				}
				return append(out, rest...), nil
			}
			cmds = cmd.Subcommands
			continue
		}
		// Flags typed before the command name count as typed first.
		flags, pos, err := splitFlags(cmd.Flags, append(early, rest...), path)
		if err != nil {
			return nil, err
		}
		out = append(out, flags...)
		if len(pos) > 0 {
			// "--" keeps an argument such as "-x" an argument.
			out = append(append(out, "--"), pos...)
		}
		return out, nil
	}
}

// allFlags is every flag of cmds and their subcommands, the first
// definition of each name: what a flag typed before its command is.
func allFlags(cmds []*cli.Command) []cli.Flag {
	var out []cli.Flag
	seen := map[string]bool{}
	for _, c := range cmds {
		for _, f := range append(c.Flags, allFlags(c.Subcommands)...) {
			if name := f.Names()[0]; !seen[name] {
				seen[name] = true
				out = append(out, f)
			}
		}
	}
	return out
}

// splitFlags separates args into the flags defined by defs (with their
// values) and the positional arguments, each in their given order.
func splitFlags(defs []cli.Flag, args []string, path string) (flags, pos []string, err error) {
	for i := 0; i < len(args); {
		a := args[i]
		switch {
		case a == "--":
			return flags, append(pos, args[i+1:]...), nil
		case isFlag(a):
			n, err := flagTokens(defs, args[i:], path)
			if err != nil {
				return nil, nil, err
			}
			flags = append(flags, args[i:i+n]...)
			i += n
		default:
			pos = append(pos, a)
			i++
		}
	}
	return flags, pos, nil
}

// flagTokens says how many tokens the flag at args[0] spans: 1, or 2 when
// its value is the next token.
func flagTokens(defs []cli.Flag, args []string, path string) (int, error) {
	name, _, inline := strings.Cut(strings.TrimLeft(args[0], "-"), "=")
	f := lookupFlag(defs, name)
	if f == nil {
		msg := fmt.Sprintf("unknown flag %s for %s", args[0], path)
		var names []string
		for _, f := range append(defs, cli.HelpFlag) {
			names = append(names, f.Names()...)
		}
		if s := closest(names, name); s != "" {
			msg += fmt.Sprintf(" (did you mean %s?)", dashed(s))
		}
		return 0, usagef("%s; see %s --help", msg, path)
	}
	if inline || !takesValue(f) {
		return 1, nil
	}
	if len(args) < 2 {
		return 0, usagef("flag %s of %s needs a value", args[0], path)
	}
	return 2, nil
}

func isFlag(a string) bool { return len(a) > 1 && a[0] == '-' && a != "--" }

// lookupFlag finds name among defs and the help flag every command has.
func lookupFlag(defs []cli.Flag, name string) cli.Flag {
	for _, f := range append(defs, cli.HelpFlag) {
		for _, n := range f.Names() {
			if n == name {
				return f
			}
		}
	}
	return nil
}

func takesValue(f cli.Flag) bool {
	if v, ok := f.(interface{ TakesValue() bool }); ok {
		return v.TakesValue()
	}
	return true
}

func helpRequested(flags []string) bool {
	for _, f := range flags {
		if f == "-h" || f == "--help" || f == "-help" {
			return true
		}
	}
	return false
}

func findCommand(cmds []*cli.Command, name string) *cli.Command {
	for _, c := range cmds {
		if c.HasName(name) {
			return c
		}
	}
	return nil
}

func unknownCommand(cmds []*cli.Command, path, name string) error {
	msg := fmt.Sprintf("unknown command %q for %s", name, path)
	var names []string
	for _, c := range cmds {
		if !c.Hidden {
			names = append(names, c.Names()...)
		}
	}
	if s := closest(names, name); s != "" {
		msg += fmt.Sprintf(" (did you mean %s?)", s)
	}
	return usagef("%s; see %s --help", msg, path)
}

// closest is the name nearest to typed by edit distance, if it is near
// enough to be a typo (at most a third of its letters off); "" if none is.
func closest(names []string, typed string) string {
	best, bestD := "", len(typed)/3+1
	for _, n := range names {
		if d := editDistance(n, typed); d < bestD || (d == bestD && best != "" && n < best) {
			best, bestD = n, d
		}
	}
	return best
}

// editDistance is the Damerau-Levenshtein distance (optimal string
// alignment): insertions, deletions, substitutions and swaps of neighbours
// each cost 1, so "stauts" is 1 from "status".
func editDistance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}

func dashed(name string) string {
	if len(name) == 1 {
		return "-" + name
	}
	return "--" + name
}
