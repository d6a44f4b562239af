package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/pinnedd/pinnedd/examples"
	"github.com/pinnedd/pinnedd/plugins/sdk"
)

// version names this build; the CLI and the agent's status report it. A
// release sets it with -ldflags "-X main.version=v1.2.3"; otherwise init
// derives it from the build info (see buildVersion).
var version string

func init() {
	if version == "" {
		version = buildVersion()
	}
	cli.VersionPrinter = printVersion
}

// exitCoder lets a command choose its exit status.
type exitCoder interface{ ExitCode() int }

func run(args []string) int {
	app := newApp()
	if n := len(args); n > 1 && args[n-1] == completionFlag {
		// A shell completing a line: list candidates, never run it.
		for _, c := range complete(app, args[1:n-1]) {
			fmt.Fprintln(os.Stdout, c)
		}
		return 0
	}
	args, err := reorderArgs(app, args)
	if err == nil {
		err = app.Run(args)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "pinnedd:", err)
		var ec exitCoder
		switch {
		case errors.As(err, &ec):
			return ec.ExitCode()
		case errors.As(err, new(*usageError)):
			return 2 // as Go's flag package: the command line, not the work, failed
		}
		return 1
	}
	return 0
}

func newApp() *cli.App {
	return &cli.App{
		Name:    "pinnedd",
		Usage:   "run stateful instances (durable objects) on your own machines",
		Version: version,
		Commands: append([]*cli.Command{
			agentCommand(),
			statusCommand(),
			versionCommand(),
			tokenCommand(),
			tlsCommand(),
			completionCommand(),
			pluginHostCommand(),
		}, append(clusterCommands(), opsCommands()...)...),
		HideHelpCommand: true,
		Suggest:         true,
		// A usage error prints what is wrong, not the whole help text; run
		// prints it once.
		OnUsageError: func(_ *cli.Context, err error, _ bool) error {
			return usagef("%w", err)
		},
	}
}

// pluginHostCommand is how pinnedd runs its built-in example hosts as a
// plugin process: it re-executes itself with this hidden command.
func pluginHostCommand() *cli.Command {
	return &cli.Command{
		Name:      "plugin-host",
		Usage:     "serve built-in hosts as a plugin (started by pinnedd itself)",
		ArgsUsage: "<namespace>...",
		Hidden:    true,
		Action: func(c *cli.Context) error {
			all := examples.Builtin()
			hosts := map[string]sdk.Host{}
			for _, ns := range c.Args().Slice() {
				h, ok := all[ns]
				if !ok {
					return fmt.Errorf("no built-in host for %s", ns)
				}
				hosts[ns] = h
			}
			sdk.Serve(hosts)
			return nil
		},
	}
}

// signalContext is cancelled on the first SIGINT/SIGTERM; a second one
// exits at once.
func signalContext() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		select {
		case <-ch:
			cancel()
		case <-ctx.Done():
			signal.Stop(ch)
			return
		}
		<-ch
		fmt.Fprintln(os.Stderr, "pinnedd: second signal, exiting now")
		os.Exit(1)
	}()
	return ctx, cancel
}
