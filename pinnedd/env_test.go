package main

import (
	"bytes"
	"io"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"
)

// agentFlagsFrom runs `pinnedd agent --dev args...` in-process with env set
// and returns what the agent would be configured with, without starting it.
func agentFlagsFrom(t *testing.T, env map[string]string, args ...string) (logLevel, advertise string, leaseTTL time.Duration) {
	t.Helper()
	for _, name := range []string{"PINNEDD_LOG_LEVEL", "LOG_LEVEL", "PINNEDD_ADVERTISE_URL", "ADVERTISE_URL", "PINBOARD_LEASE_TTL_MS", "PINNEDD_LEASE_TTL"} {
		v, ok := env[name]
		t.Setenv(name, v) // restored after the test
		if !ok {
			os.Unsetenv(name)
		}
	}
	app := newApp()
	app.Writer, app.ErrWriter = io.Discard, io.Discard
	cmd := findPath(t, app, []string{"agent"})
	cmd.Action = func(c *cli.Context) error {
		cfg, err := agentConfigFrom(c)
		if err != nil {
			return err
		}
		logLevel, advertise, leaseTTL = c.String("log-level"), cfg.AdvertiseURL, cfg.LeaseTTL
		return nil
	}
	line, err := reorderArgs(app, append([]string{"pinnedd", "agent", "--dev"}, args...))
	if err != nil {
		t.Fatal(err)
	}
	if err := app.Run(line); err != nil {
		t.Fatalf("agent %q with %v: %v", args, env, err)
	}
	return logLevel, advertise, leaseTTL
}

// TestEnvNames: pinnedd's own variables are PINNEDD_*, the seed's keep
// their names, and the old names still work, losing to the new ones; the
// lease TTL has one name (the seed's, in milliseconds) and an alias.
func TestEnvNames(t *testing.T) {
	for _, tc := range []struct {
		env       map[string]string
		args      []string
		level     string
		advertise string
		ttl       time.Duration
	}{
		{env: map[string]string{}, level: "info", ttl: 15 * time.Second},
		{env: map[string]string{"PINNEDD_LOG_LEVEL": "debug", "PINNEDD_ADVERTISE_URL": "http://10.0.0.6:8080"}, level: "debug", advertise: "http://10.0.0.6:8080", ttl: 15 * time.Second},
		{env: map[string]string{"LOG_LEVEL": "warn", "ADVERTISE_URL": "http://old:1"}, level: "warn", advertise: "http://old:1", ttl: 15 * time.Second},
		{env: map[string]string{"PINNEDD_LOG_LEVEL": "debug", "LOG_LEVEL": "warn", "PINNEDD_ADVERTISE_URL": "http://new:2", "ADVERTISE_URL": "http://old:1"}, level: "debug", advertise: "http://new:2", ttl: 15 * time.Second},
		{env: map[string]string{"PINBOARD_LEASE_TTL_MS": "20000"}, level: "info", ttl: 20 * time.Second},
		{env: map[string]string{"PINNEDD_LEASE_TTL": "25s"}, level: "info", ttl: 25 * time.Second},
		{env: map[string]string{"PINBOARD_LEASE_TTL_MS": "20000", "PINNEDD_LEASE_TTL": "25s"}, level: "info", ttl: 20 * time.Second},
		{env: map[string]string{"PINBOARD_LEASE_TTL_MS": "20000"}, args: []string{"--lease-ttl", "30s"}, level: "info", ttl: 30 * time.Second},
		{env: map[string]string{}, args: []string{"--lease-ttl", "12000"}, level: "info", ttl: 12 * time.Second},
	} {
		level, advertise, ttl := agentFlagsFrom(t, tc.env, tc.args...)
		if level != tc.level || advertise != tc.advertise || ttl != tc.ttl {
			t.Errorf("env %v args %q: log level %q, advertise %q, lease TTL %s; want %q, %q, %s", tc.env, tc.args, level, advertise, ttl, tc.level, tc.advertise, tc.ttl)
		}
	}
}

// TestDeprecatedEnvWarns: each old name in use gets one WARN naming its
// replacement; current names get none.
func TestDeprecatedEnvWarns(t *testing.T) {
	var buf bytes.Buffer
	env := map[string]string{"LOG_LEVEL": "info", "PINNEDD_LEASE_TTL": "15s", "PINNEDD_ADVERTISE_URL": "http://x:1"}
	warnDeprecatedEnv(slog.New(slog.NewTextHandler(&buf, nil)), func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	out := buf.String()
	if strings.Count(out, "level=WARN") != 2 || !strings.Contains(out, "name=LOG_LEVEL use=PINNEDD_LOG_LEVEL") || !strings.Contains(out, "name=PINNEDD_LEASE_TTL use=PINBOARD_LEASE_TTL_MS") {
		t.Fatalf("warnings:\n%s", out)
	}
}

// TestEnvNamesPrefixed: every variable a flag reads first is PINNEDD_*, or
// one of the seed's names; and the systemd env template uses only those.
func TestEnvNamesPrefixed(t *testing.T) {
	seed := map[string]bool{"DATABASE_URL": true}
	primary := map[string]bool{}
	for _, l := range leafCommands(newApp().Commands, nil) {
		for _, f := range l.cmd.Flags {
			ef, ok := f.(interface{ GetEnvVars() []string })
			if !ok || len(ef.GetEnvVars()) == 0 {
				continue
			}
			name := ef.GetEnvVars()[0]
			primary[name] = true
			if !strings.HasPrefix(name, "PINNEDD_") && !strings.HasPrefix(name, "PINBOARD_") && !seed[name] {
				t.Errorf("pinnedd %s --%s reads $%s first: want a PINNEDD_ name", strings.Join(l.path, " "), f.Names()[0], name)
			}
		}
	}
	tmpl, err := os.ReadFile("../systemd/pinnedd.env")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`(?m)^#?([A-Z][A-Z0-9_]+)=`).FindAllStringSubmatch(string(tmpl), -1) {
		if !primary[m[1]] {
			t.Errorf("systemd/pinnedd.env sets %s, which is no flag's current name (deprecated: %q)", m[1], deprecatedEnv[m[1]])
		}
	}
}
