package main

import (
	"bufio"
	"context"
	"errors"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/pinnedd/pinnedd/agent"
	"github.com/pinnedd/pinnedd/internal/testutil"
	"github.com/pinnedd/pinnedd/supervisor"
)

// envLine is a KEY=value line of the env template; a commented-out one
// (#KEY=value) is a documented alternative.
var envLine = regexp.MustCompile(`^(#?)([A-Z][A-Z0-9_]*)=(.*)$`)

// readEnvTemplate returns systemd/pinnedd.env's active settings and the names
// of its commented-out ones.
func readEnvTemplate(t *testing.T) (active map[string]string, commented []string) {
	t.Helper()
	f, err := os.Open("../systemd/pinnedd.env")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	active = map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		m := envLine.FindStringSubmatch(sc.Text())
		switch {
		case m == nil:
		case m[1] == "#":
			commented = append(commented, m[2])
		default:
			active[m[2]] = m[3]
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return active, commented
}

// agentEnvVars are the variables `pinnedd agent` reads, flag by flag.
func agentEnvVars() []string {
	var names []string
	for _, f := range agentCommand().Flags {
		if ev, ok := f.(interface{ GetEnvVars() []string }); ok {
			names = append(names, ev.GetEnvVars()...)
		}
	}
	return names
}

// configFromEnv runs the agent's flag parsing and validation (what `pinnedd
// agent` does before it starts anything) on exactly the environment env.
func configFromEnv(t *testing.T, env map[string]string) (agent.Config, error) {
	for _, name := range agentEnvVars() {
		t.Setenv(name, "") // restored at the end of the test
		os.Unsetenv(name)
	}
	for k, v := range env {
		t.Setenv(k, v)
	}
	var cfg agent.Config
	cmd := agentCommand()
	cmd.Action = func(c *cli.Context) (err error) {
		cfg, err = agentConfigFrom(c)
		return err
	}
	app := &cli.App{Name: "pinnedd", Commands: []*cli.Command{cmd}}
	err := app.Run([]string{"pinnedd", "agent"})
	return cfg, err
}

// TestSystemdEnvTemplateStartsANode: systemd/pinnedd.env, with only its
// placeholders filled in (the token, the plugin binary), is a configuration
// the agent accepts, and so is its documented alternative for instance state
// (--local-state instead of DATABASE_URL). Every variable it names, set or
// commented out, is one the agent reads.
func TestSystemdEnvTemplateStartsANode(t *testing.T) {
	active, commented := readEnvTemplate(t)
	known := agentEnvVars()
	for _, name := range append(slices.Sorted(maps.Keys(active)), commented...) {
		if !slices.Contains(known, name) {
			t.Errorf("pinnedd.env names %s, which pinnedd agent does not read", name)
		}
	}

	tok, err := newToken()
	if err != nil {
		t.Fatal(err)
	}
	plugin := filepath.Join(t.TempDir(), "chat")
	if err := os.WriteFile(plugin, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	filled := map[string]string{}
	for k, v := range active {
		filled[k] = v
	}
	filled["PINBOARD_TOKEN"] = tok
	filled["PINNEDD_PLUGINS"] = strings.ReplaceAll(active["PINNEDD_PLUGINS"], "/opt/pinned/chat", plugin)

	cfg, err := configFromEnv(t, filled)
	if err != nil {
		t.Fatalf("the agent refuses the filled-in template: %v", err)
	}
	if cfg.DatabaseURL != active["DATABASE_URL"] || cfg.NodeID != active["PINNEDD_NODE_ID"] ||
		cfg.Join != active["PINNEDD_JOIN"] || len(cfg.Specs) != 1 || cfg.Dev {
		t.Fatalf("config from the template: %+v", cfg)
	}

	if !slices.Contains(commented, "PINNEDD_LOCAL_STATE") {
		t.Fatal("pinnedd.env does not offer PINNEDD_LOCAL_STATE as the alternative to DATABASE_URL")
	}
	local := map[string]string{"PINNEDD_LOCAL_STATE": "true"}
	for k, v := range filled {
		if k != "DATABASE_URL" {
			local[k] = v
		}
	}
	if _, err := configFromEnv(t, local); err != nil {
		t.Fatalf("the agent refuses the template with PINNEDD_LOCAL_STATE instead of DATABASE_URL: %v", err)
	}
}

// unitSettings returns systemd/pinnedd.service's Key=value settings by
// section ("Unit.StartLimitBurst").
func unitSettings(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile("../systemd/pinnedd.service")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	section := ""
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "["):
			section = strings.Trim(line, "[]")
		default:
			if k, v, ok := strings.Cut(line, "="); ok {
				out[section+"."+k] = v
			}
		}
	}
	return out
}

// TestSystemdUnitGivesUp: the unit restarts a failed agent, but not forever
// (a start limit), and not at all when the agent refused its configuration:
// the exit status the agent really gives then (the shipped template, whose
// token is a placeholder) is the one the unit does not restart on.
func TestSystemdUnitGivesUp(t *testing.T) {
	u := unitSettings(t)
	interval, err := systemdSeconds(u["Unit.StartLimitIntervalSec"])
	if err != nil || interval <= 0 {
		t.Errorf("StartLimitIntervalSec=%q: want a positive limit (0 restarts forever)", u["Unit.StartLimitIntervalSec"])
	}
	if n, err := strconv.Atoi(u["Unit.StartLimitBurst"]); err != nil || n <= 0 {
		t.Errorf("StartLimitBurst=%q: want a positive count", u["Unit.StartLimitBurst"])
	}
	if u["Service.Restart"] != "on-failure" {
		t.Errorf("Restart=%q", u["Service.Restart"])
	}
	if !slices.Contains(strings.Fields(u["Service.RestartPreventExitStatus"]), strconv.Itoa(exitConfig)) {
		t.Errorf("RestartPreventExitStatus=%q: want %d, the agent's exit status for a refused configuration", u["Service.RestartPreventExitStatus"], exitConfig)
	}

	active, _ := readEnvTemplate(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, testutil.Bin(t, "pinnedd"), "agent")
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}
	for k, v := range active {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitConfig || !strings.Contains(string(out), "PINBOARD_TOKEN") {
		t.Fatalf("pinnedd agent on the unfilled template: %v (want exit %d, the token refused)\n%s", err, exitConfig, out)
	}
}

// systemdSeconds parses a systemd time span as the unit writes them: plain
// seconds, or Go-like units with "min" for minutes.
func systemdSeconds(v string) (time.Duration, error) {
	if n, err := strconv.Atoi(v); err == nil {
		return time.Duration(n) * time.Second, nil
	}
	return time.ParseDuration(strings.ReplaceAll(v, "min", "m"))
}

// TestSystemdUnitRunsPluginsAsOtherUsers: the shipped unit runs the agent as
// root with exactly the capabilities it checks for before running plugins
// as other users (a missing one would refuse every start, an extra one
// would be root's power for nothing), and pinnedd.sysusers makes the
// account a root agent runs its plugins as by default.
func TestSystemdUnitRunsPluginsAsOtherUsers(t *testing.T) {
	u := unitSettings(t)
	if u["Service.User"] != "root" || u["Service.Group"] != "root" {
		t.Errorf("User=%q Group=%q, want root", u["Service.User"], u["Service.Group"])
	}
	caps := strings.Fields(u["Service.CapabilityBoundingSet"])
	slices.Sort(caps)
	want := supervisor.SwitchCapabilities()
	slices.Sort(want)
	if !slices.Equal(caps, want) {
		t.Errorf("CapabilityBoundingSet=%q, want %q", u["Service.CapabilityBoundingSet"], want)
	}
	if u["Service.AmbientCapabilities"] != "" {
		t.Errorf("AmbientCapabilities=%q: plugins would inherit them", u["Service.AmbientCapabilities"])
	}
	b, err := os.ReadFile("../systemd/pinnedd.sysusers")
	if err != nil {
		t.Fatal(err)
	}
	var accounts []string
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 3 && f[0] == "u" {
			accounts = append(accounts, f[1])
		}
	}
	if !slices.Equal(accounts, []string{supervisor.DefaultPluginUserName}) {
		t.Errorf("pinnedd.sysusers makes users %q, want %s alone", accounts, supervisor.DefaultPluginUserName)
	}
}
