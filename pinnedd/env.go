package main

import (
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"time"
)

// deprecatedEnv maps each old environment variable name to the one that
// replaced it. Every flag reads its current name first, then these aliases
// (envVars), so an old env file keeps working; the agent warns about each
// alias it finds in use (warnDeprecatedEnv). pinnedd's own variables are
// PINNEDD_*; the seed's names (PINBOARD_*, DATABASE_URL) stay as they are.
var deprecatedEnv = map[string]string{
	// The seed's worker and pinboard names, too generic for a daemon's
	// environment (any program may read LOG_LEVEL).
	"ADVERTISE_URL": "PINNEDD_ADVERTISE_URL",
	"LOG_LEVEL":     "PINNEDD_LOG_LEVEL",
	// The lease TTL had two names; the seed's is the one.
	"PINNEDD_LEASE_TTL": "PINBOARD_LEASE_TTL_MS",
}

// envVars is a flag's EnvVars: name, then its deprecated aliases.
func envVars(name string) []string {
	var aliases []string
	for old, cur := range deprecatedEnv {
		if cur == name {
			aliases = append(aliases, old)
		}
	}
	slices.Sort(aliases)
	return append([]string{name}, aliases...)
}

// warnDeprecatedEnv logs one WARN for each deprecated variable that is set,
// naming its replacement (which wins when both are set).
func warnDeprecatedEnv(log *slog.Logger, lookup func(string) (string, bool)) {
	olds := make([]string, 0, len(deprecatedEnv))
	for old := range deprecatedEnv {
		olds = append(olds, old)
	}
	slices.Sort(olds)
	for _, old := range olds {
		if _, set := lookup(old); set {
			log.Warn("deprecated environment variable: rename it", "name", old, "use", deprecatedEnv[old])
		}
	}
}

// msDuration is a duration flag's value that also takes a bare number of
// milliseconds, as the seed's PINBOARD_LEASE_TTL_MS=15000 does: "15000"
// and "15s" are the same TTL.
type msDuration struct{ d time.Duration }

func (v *msDuration) Set(s string) error {
	if ms, err := strconv.ParseInt(s, 10, 64); err == nil {
		v.d = time.Duration(ms) * time.Millisecond
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("want a duration such as 15s, or milliseconds such as 15000: %w", err)
	}
	v.d = d
	return nil
}

func (v *msDuration) String() string {
	if v == nil {
		return ""
	}
	return v.d.String()
}

// Get makes it a flag.Getter, as urfave/cli's Context.Value needs.
func (v *msDuration) Get() any { return v.d }
