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

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// exitCoder lets a command choose its exit status.
type exitCoder interface{ ExitCode() int }

func run(args []string) int {
	app := newApp()
	if err := app.Run(args); err != nil {
		fmt.Fprintln(os.Stderr, "pinnedd:", err)
		var ec exitCoder
		if errors.As(err, &ec) {
			return ec.ExitCode()
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
			pluginHostCommand(),
		}, append(clusterCommands(), opsCommands()...)...),
		HideHelpCommand: true,
	}
}

func versionCommand() *cli.Command {
	return &cli.Command{
		Name:  "version",
		Usage: "print the version",
		Action: func(c *cli.Context) error {
			fmt.Fprintf(c.App.Writer, "pinnedd %s\n", version)
			return nil
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
