package main

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"
)

// leafCommands lists every runnable command of the app with its path
// ("plugins reload").
func leafCommands(cmds []*cli.Command, prefix []string) (out []struct {
	path []string
	cmd  *cli.Command
}) {
	for _, c := range cmds {
		p := append(slices.Clone(prefix), c.Name)
		if len(c.Subcommands) > 0 {
			out = append(out, leafCommands(c.Subcommands, p)...)
			continue
		}
		out = append(out, struct {
			path []string
			cmd  *cli.Command
		}{p, c})
	}
	return out
}

// sampleValue is a value each kind of flag accepts, and what c.Value then
// shows for it.
func sampleValue(t *testing.T, f cli.Flag) string {
	switch f.(type) {
	case *cli.BoolFlag:
		return ""
	case *cli.DurationFlag, *cli.GenericFlag:
		return "7s"
	case *cli.IntFlag:
		return "7"
	case *cli.Float64Flag:
		return "1.5"
	case *cli.StringFlag, *cli.StringSliceFlag:
		return "/v=w"
	}
	t.Fatalf("flag %v: no sample value for %T", f.Names(), f)
	return ""
}

// TestEveryFlagAfterArguments runs every command of the real app with each
// of its flags after a positional argument, in both --flag value and
// --flag=value forms, and checks urfave/cli saw the flag set and the
// argument as an argument.
func TestEveryFlagAfterArguments(t *testing.T) {
	leaves := leafCommands(newApp().Commands, nil)
	if len(leaves) < 15 {
		t.Fatalf("found %d commands; the walk is broken", len(leaves))
	}
	for _, leaf := range leaves {
		for _, f := range leaf.cmd.Flags {
			name := f.Names()[0]
			val := sampleValue(t, f)
			forms := [][]string{{"--" + name}}
			if val != "" {
				forms = [][]string{{"--" + name, val}, {"--" + name + "=" + val}, {"-" + name, val}}
			}
			for _, form := range forms {
				line := append(append(append([]string{"pinnedd"}, leaf.path...), "ARG1"), form...)
				line = append(line, "ARG2")
				t.Run(strings.Join(line[1:], " "), func(t *testing.T) {
					app := newApp()
					app.Writer, app.ErrWriter = io.Discard, io.Discard
					var gotSet bool
					var gotValue string
					var gotArgs []string
					cmd := findPath(t, app, leaf.path)
					cmd.Action = func(c *cli.Context) error {
						gotSet = c.IsSet(name)
						gotValue = fmt.Sprint(c.Value(name))
						gotArgs = c.Args().Slice()
						return nil
					}
					args, err := reorderArgs(app, line)
					if err != nil {
						t.Fatalf("reorder: %v", err)
					}
					if err := app.Run(args); err != nil {
						t.Fatalf("run %q: %v", args, err)
					}
					if !gotSet {
						t.Fatalf("--%s after an argument was not seen (ran %q)", name, args)
					}
					if val != "" && !strings.Contains(gotValue, strings.TrimSuffix(val, "s")) {
						t.Fatalf("--%s = %q, want %q", name, gotValue, val)
					}
					if !slices.Equal(gotArgs, []string{"ARG1", "ARG2"}) {
						t.Fatalf("arguments %q, want [ARG1 ARG2] (ran %q)", gotArgs, args)
					}
				})
			}
		}
	}
}

func findPath(t *testing.T, app *cli.App, path []string) *cli.Command {
	cmds := app.Commands
	var cmd *cli.Command
	for _, p := range path {
		cmd = findCommand(cmds, p)
		if cmd == nil {
			t.Fatalf("no command %q", path)
		}
		cmds = cmd.Subcommands
	}
	return cmd
}

func TestReorderArgs(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		want string // "" with wantErr
		err  string
	}{
		{"flags first stay", "wind-down --deadline 0 /threads t1", "wind-down --deadline 0 -- /threads t1", ""},
		{"README wind-down", "wind-down /threads t1 --deadline 0", "wind-down --deadline 0 -- /threads t1", ""},
		{"join addr after", "join http://a:8082 --addr http://b:8083", "join --addr http://b:8083 -- http://a:8082", ""},
		{"subcommand addr after", "plugins reload /counters --addr http://x:17283", "plugins reload --addr http://x:17283 -- /counters", ""},
		{"inline value", "plugins reload /counters --addr=:9", "plugins reload --addr=:9 -- /counters", ""},
		{"bool takes no value", "wind-down /threads --revoke t1", "wind-down --revoke -- /threads t1", ""},
		{"bool inline", "status --json=false", "status --json=false", ""},
		{"double dash ends flags", "wind-down --deadline 1s -- /threads --revoke", "wind-down --deadline 1s -- /threads --revoke", ""},
		{"dash arg after double dash", "remove -- -n1", "remove -- -n1", ""},
		{"app flags", "--version", "--version", ""},
		{"help everywhere", "plugins reload --help", "plugins reload --help", ""},
		{"help command", "help wind-down", "wind-down --help", ""},
		{"help alone", "help", "--help", ""},
		{"parent help", "plugins -h", "plugins -h", ""},
		{"alias and value with dash", "drain --node -x", "drain --node -x", ""},
		{"no command", "", "", ""},
		{"unknown flag after arg", "plugins reload /counters --adr x", "", "unknown flag --adr for pinnedd plugins reload (did you mean --addr?)"},
		{"unknown flag before arg", "wind-down --deadlin 0 /threads", "", "unknown flag --deadlin for pinnedd wind-down (did you mean --deadline?)"},
		{"command flags before the command", "--addr x --timeout=1s status --json", "status --addr x --timeout=1s --json", ""},
		{"before a subcommand", "--addr x plugins reload /counters", "plugins reload --addr x -- /counters", ""},
		{"between parent and subcommand", "plugins --addr x reload", "plugins reload --addr x", ""},
		{"bool before the command", "--json workers", "workers --json", ""},
		{"app flag and command flag before", "--addr x --help status", "--help status --addr x", ""},
		{"unknown flag before the command", "--adr x status", "", "unknown flag --adr for pinnedd (did you mean --addr?)"},
		{"early flag not the command's", "--deadline 1s status", "", "unknown flag --deadline for pinnedd status"},
		{"early flag without a command", "--addr x", "", "flag --addr needs a command after it"},
		{"early flag without a subcommand", "--addr x plugins", "", "flag --addr needs a command of pinnedd plugins after it"},
		{"flag of another command", "status --deadline 1s", "", "unknown flag --deadline for pinnedd status"},
		{"missing value", "status --addr", "", "flag --addr of pinnedd status needs a value"},
		{"typo command", "stauts", "", `unknown command "stauts" for pinnedd (did you mean status?)`},
		{"typo subcommand", "plugins relaod", "", `unknown command "relaod" for pinnedd plugins (did you mean reload?)`},
		{"far from anything", "frobnicate", "", `unknown command "frobnicate" for pinnedd; see`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := append([]string{"pinnedd"}, strings.Fields(tc.in)...)
			got, err := reorderArgs(newApp(), in)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("reorder %q: err %v, want one containing %q", tc.in, err, tc.err)
				}
				if !errors.As(err, new(*usageError)) {
					t.Fatalf("reorder %q: %v is not a usage error", tc.in, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("reorder %q: %v", tc.in, err)
			}
			if g := strings.Join(got[1:], " "); g != tc.want {
				t.Fatalf("reorder %q = %q, want %q", tc.in, g, tc.want)
			}
		})
	}
}

// TestCompletionLineUntouched: a partial line being completed is passed
// through as typed, so urfave/cli can offer candidates for it.
func TestCompletionLineUntouched(t *testing.T) {
	in := []string{"pinnedd", "plu", completionFlag}
	got, err := reorderArgs(newApp(), in)
	if err != nil || !slices.Equal(got, in) {
		t.Fatalf("reorder %q = %q, %v", in, got, err)
	}
}

func TestClosest(t *testing.T) {
	names := []string{"status", "members", "workers", "wind-down", "drain", "undrain"}
	for typed, want := range map[string]string{
		"stauts": "status", "statu": "status", "memebrs": "members", "windown": "wind-down",
		"darin": "drain", "x": "", "frobnicate": "", "": "",
	} {
		if got := closest(names, typed); got != want {
			t.Errorf("closest(%q) = %q, want %q", typed, got, want)
		}
	}
}

// TestComplete: what the completion scripts are offered for a partial line
// (its last word is the one being typed).
func TestComplete(t *testing.T) {
	for line, want := range map[string]string{
		"":                               "agent status version token tls completion join leave remove members workers drain undrain wind-down plugins",
		"st":                             "status",
		"plugins ":                       "list reload add remove",
		"status --":                      "--addr --token --token-file --timeout --ca --insecure --json --help",
		"status -":                       "--addr --token --token-file --timeout --ca --insecure --json --help -h",
		"wind-down /threads --dead":      "--deadline",
		"--addr x pl":                    "plugins",
		"status -- ":                     "",
		"status --addr ":                 "",
		"status --addr=x --t":            "--token --token-file --timeout",
		"plugins reload /counters --add": "--addr",
		"-":                              "--version -v --help -h",
	} {
		words := strings.Split(line, " ")
		if line == "" {
			words = nil
		}
		if got := strings.Join(complete(newApp(), words), " "); got != want {
			t.Errorf("complete %q = %q, want %q", line, got, want)
		}
	}
}

// A lease an election can outlast is refused; one whose healthy stretch an
// election outlasts is warned about; the defaults and the test fleets' 3 s
// lease at --raft-timeout 300ms pass.
func TestLeaseTimingAgainstElection(t *testing.T) {
	if _, err := leaseTiming(3*time.Second, time.Second, 0); err == nil ||
		!strings.Contains(err.Error(), "--lease-ttl (3s) must be longer than a Raft election, up to 4s with --raft-timeout 1s") {
		t.Fatalf("3s lease at raft's default timeout: %v", err)
	}
	if warn, err := leaseTiming(5*time.Second, time.Second, 0); err != nil || !strings.Contains(warn, "go unhealthy") {
		t.Fatalf("5s lease, 1s heartbeats at raft's default timeout: %q %v", warn, err)
	}
	for _, c := range []struct{ ttl, hb, raft time.Duration }{
		{15 * time.Second, 3 * time.Second, 0},
		{3 * time.Second, 500 * time.Millisecond, 300 * time.Millisecond},
	} {
		if warn, err := leaseTiming(c.ttl, c.hb, c.raft); warn != "" || err != nil {
			t.Fatalf("%+v: %q %v", c, warn, err)
		}
	}
}
