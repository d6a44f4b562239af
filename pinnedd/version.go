package main

import (
	"fmt"
	"runtime/debug"

	"github.com/urfave/cli/v2"
)

// buildVersion names this binary from what the Go toolchain recorded in it.
func buildVersion() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "devel"
	}
	return versionOf(info)
}

// versionOf is the main module's version when the build knows one (a
// tagged `go install`, or the VCS-derived version of a checkout build),
// else the VCS revision (12 hex digits, "-dirty" with uncommitted changes),
// else "devel".
func versionOf(info *debug.BuildInfo) string {
	if v := info.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	var rev string
	dirty := false
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev == "" {
		return "devel"
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if dirty {
		rev += "-dirty"
	}
	return rev
}

func versionCommand() *cli.Command {
	return &cli.Command{
		Name:  "version",
		Usage: "print the version",
		Action: func(c *cli.Context) error {
			if err := noArgs(c); err != nil {
				return err
			}
			printVersion(c)
			return nil
		},
	}
}

// printVersion is what `pinnedd version` and `pinnedd --version` both print
// (it is the app's cli.VersionPrinter).
func printVersion(c *cli.Context) {
	fmt.Fprintf(c.App.Writer, "pinnedd %s\n", version)
}
