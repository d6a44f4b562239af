package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"
)

// opsCommands are the day-two commands: drain, undrain, wind-down, plugins.
func opsCommands() []*cli.Command {
	return []*cli.Command{
		drainCommand(),
		undrainCommand(),
		windDownCommand(),
		pluginsCommand(),
	}
}

// drainCommand is `pinnedd drain`.
func drainCommand() *cli.Command {
	return &cli.Command{
		Name:      "drain",
		Usage:     "drain a node: no new activations, idle instances go at once, the rest by the deadline",
		ArgsUsage: "[<node id>]",
		Description: "With <node id> (from `pinnedd workers` or `members`), sets an operator drain in\n" +
			"the directory on that node: it survives the node's restart and applies to a node\n" +
			"that is down when it comes back, until `pinnedd undrain <node id>`. Without one,\n" +
			"drains the agent at --addr itself, until `pinnedd undrain` or until it exits.\n" +
			"--node <client id> drains one worker process only: its restart registers a new\n" +
			"client id, which the drain does not follow.\n" +
			"The deadline is when busy instances are evicted; the drain lasts until undrain.",
		Flags: append(clientFlags(),
			&cli.DurationFlag{Name: "deadline", Value: 30 * time.Second, Usage: "evict what is left at this deadline"},
			&cli.BoolFlag{Name: "cordon", Usage: "no deadline: take no new placements, let running work finish"},
			&cli.StringFlag{Name: "node", Usage: "one worker process's `CLIENT_ID` (operator drain via the directory)"},
		),
		Action: func(c *cli.Context) error {
			target, err := drainTargetOf(c)
			if err != nil {
				return err
			}
			if c.Bool("cordon") && c.IsSet("deadline") {
				return usagef("--cordon and --deadline exclude each other: --cordon lets running work finish with no deadline")
			}
			d, err := nonNegative(c, "deadline")
			if err != nil {
				return err
			}
			var deadline any = d.Seconds()
			if c.Bool("cordon") {
				deadline = nil
			}
			if target.body == nil {
				return postJSON(c, "/_pinned/drain", map[string]any{"deadline": deadline, "cordon": c.Bool("cordon")}, "draining")
			}
			target.body["deadline"] = deadline
			return postJSON(c, "/registry/drain", target.body, "drain set on "+target.name)
		},
	}
}

// undrainCommand is `pinnedd undrain`.
func undrainCommand() *cli.Command {
	return &cli.Command{
		Name:      "undrain",
		Usage:     "revoke a drain: a node's (by node id), one worker process's (--node), or this agent's own",
		ArgsUsage: "[<node id>]",
		Flags:     append(clientFlags(), &cli.StringFlag{Name: "node", Usage: "one worker process's `CLIENT_ID`"}),
		Action: func(c *cli.Context) error {
			target, err := drainTargetOf(c)
			if err != nil {
				return err
			}
			if target.body == nil {
				return postJSON(c, "/_pinned/undrain", map[string]any{}, "undrained")
			}
			return postJSON(c, "/registry/undrain", target.body, "undrained "+target.name)
		},
	}
}

// windDownCommand is `pinnedd wind-down`.
func windDownCommand() *cli.Command {
	return &cli.Command{
		Name:      "wind-down",
		Usage:     "evict one instance, or every instance of a namespace, by a deadline",
		ArgsUsage: "<namespace> [<id>]",
		Flags: append(clientFlags(),
			&cli.DurationFlag{Name: "deadline", Value: 0, Usage: "0: as soon as its work allows"},
			&cli.BoolFlag{Name: "revoke", Usage: "cancel an earlier wind-down"},
		),
		Action: func(c *cli.Context) error {
			if c.NArg() < 1 || c.NArg() > 2 {
				return usagef("pinnedd wind-down <namespace> [<id>] [--deadline 0 | --revoke] takes a namespace and at most one id, got %d arguments", c.NArg())
			}
			if c.Bool("revoke") && c.IsSet("deadline") {
				return usagef("--revoke and --deadline exclude each other: --revoke cancels an earlier wind-down")
			}
			deadline, err := nonNegative(c, "deadline")
			if err != nil {
				return err
			}
			body := map[string]any{"namespace": c.Args().Get(0), "deadline": deadline.Seconds()}
			if c.Bool("revoke") {
				body["deadline"] = nil
			}
			if c.NArg() == 2 {
				// An empty id (an unset $ID) must not widen the
				// wind-down to the whole namespace.
				id := c.Args().Get(1)
				if id == "" {
					return usagef("the id is empty: name an instance, or give only the namespace to wind all of %s down", c.Args().Get(0))
				}
				body["id"] = id
			}
			var out struct {
				Instances int      `json:"instances"`
				Failed    []string `json:"failed"`
			}
			if err := apiCall(c, http.MethodPost, "/registry/wind_down", body, &out); err != nil {
				return err
			}
			fmt.Fprintf(c.App.Writer, "%d instance(s) winding down\n", out.Instances)
			if len(out.Failed) > 0 {
				return fmt.Errorf("some owners failed the wind-down: %s", strings.Join(out.Failed, "; "))
			}
			return nil
		},
	}
}

// pluginsCommand is `pinnedd plugins` (list, reload).
func pluginsCommand() *cli.Command {
	return &cli.Command{
		Name:  "plugins",
		Usage: "list, hot-swap, add or remove this node's plugins",
		Subcommands: []*cli.Command{
			{
				Name:  "list",
				Usage: "plugins with their process ids and versions",
				Flags: append(clientFlags(), &cli.BoolFlag{Name: "json", Usage: "print JSON: {\"plugins\": [...]} as the agent reports them"}),
				Action: func(c *cli.Context) error {
					if err := noArgs(c); err != nil {
						return err
					}
					if c.Bool("json") {
						var raw struct {
							Plugins json.RawMessage `json:"plugins"`
						}
						if err := apiCall(c, http.MethodGet, "/_pinned/status", nil, &raw); err != nil {
							return err
						}
						if len(raw.Plugins) == 0 || string(raw.Plugins) == "null" {
							raw.Plugins = json.RawMessage("[]")
						}
						return json.NewEncoder(c.App.Writer).Encode(raw)
					}
					var st struct {
						Plugins []struct {
							Name        string   `json:"name"`
							Path        string   `json:"path"`
							State       string   `json:"state"`
							PID         int      `json:"pid"`
							Incarnation int      `json:"incarnation"`
							Restarts    int      `json:"restarts"`
							Version     string   `json:"version"`
							Namespaces  []string `json:"namespaces"`
							User        string   `json:"user"`
						} `json:"plugins"`
					}
					if err := apiCall(c, http.MethodGet, "/_pinned/status", nil, &st); err != nil {
						return err
					}
					w := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
					fmt.Fprintln(w, "PLUGIN\tNAMESPACES\tSTATE\tPID\tUSER\tINCARNATION\tRESTARTS\tVERSION\tPATH")
					for _, p := range st.Plugins {
						user := p.User
						if user == "" {
							user = "-" // pinnedd's own
						}
						fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\t%d\t%d\t%s\t%s\n", p.Name, strings.Join(p.Namespaces, ","), p.State, p.PID, user, p.Incarnation, p.Restarts, p.Version, p.Path)
					}
					return w.Flush()
				},
			},
			{
				Name:      "reload",
				Usage:     "hot-swap the plugin serving a namespace (all without one): new process, old one winds down",
				ArgsUsage: "[<namespace>]",
				Flags:     clientFlags(),
				Action: func(c *cli.Context) error {
					if c.NArg() > 1 {
						return usagef("pinnedd plugins reload [<namespace>] takes at most one namespace, got %d arguments", c.NArg())
					}
					body := map[string]any{}
					if ns := c.Args().First(); ns != "" {
						body["namespace"] = ns
					}
					return postJSON(c, "/_pinned/plugins/reload", body, "reloaded")
				},
			},
			{
				Name:      "add",
				Usage:     "start a plugin on the node at --addr and serve its namespace, without restarting the node (the binary must be under the agent's --plugin-dir)",
				ArgsUsage: "/NS=PATH",
				Flags:     clientFlags(),
				Action: func(c *cli.Context) error {
					if c.NArg() != 1 {
						return usagef("pinnedd plugins add takes one /NS=PATH, got %d arguments", c.NArg())
					}
					// The agent resolves the path: make it this directory's, not the agent's.
					arg := c.Args().First()
					if ns, path, ok := strings.Cut(arg, "="); ok && path != "" {
						if abs, err := filepath.Abs(path); err == nil {
							arg = ns + "=" + abs
						}
					}
					return postJSON(c, "/_pinned/plugins/add", map[string]any{"plugin": arg}, "added")
				},
			},
			{
				Name:      "remove",
				Usage:     "stop serving a namespace on the node at --addr: its instances are evicted (each gets its grace) and its plugin ends",
				ArgsUsage: "/NS",
				Flags:     clientFlags(),
				Action: func(c *cli.Context) error {
					if c.NArg() != 1 {
						return usagef("pinnedd plugins remove takes one namespace, got %d arguments", c.NArg())
					}
					return postJSON(c, "/_pinned/plugins/remove", map[string]any{"namespace": c.Args().First()}, "removed")
				},
			},
		},
	}
}

// drainTarget is what a drain or undrain acts on: an operator drain of a
// node id (the argument) or of a client id (--node) through the directory,
// or (body nil) the agent at --addr itself.
type drainTarget struct {
	body map[string]any // the /registry/{drain,undrain} body
	name string         // for the confirmation line
}

func drainTargetOf(c *cli.Context) (drainTarget, error) {
	cmd := "pinnedd " + c.Command.Name
	switch {
	case c.NArg() > 1:
		return drainTarget{}, usagef("%s takes at most one node id, got %d arguments", cmd, c.NArg())
	case c.NArg() == 1 && c.IsSet("node"):
		return drainTarget{}, usagef("%s: give a node id or --node CLIENT_ID, not both", cmd)
	case c.NArg() == 1:
		node := c.Args().First()
		if node == "" {
			// An unset $NODE must not turn into a drain of this agent.
			return drainTarget{}, usagef("%s: the node id is empty", cmd)
		}
		return drainTarget{body: map[string]any{"nodeId": node}, name: "node " + node}, nil
	case c.IsSet("node"):
		id := c.String("node")
		if id == "" {
			return drainTarget{}, usagef("%s: --node is empty: give a worker's client id", cmd)
		}
		return drainTarget{body: map[string]any{"clientId": id}, name: id}, nil
	}
	return drainTarget{}, nil
}

func postJSON(c *cli.Context, path string, body any, done string) error {
	if err := apiCall(c, http.MethodPost, path, body, nil); err != nil {
		return err
	}
	_, err := fmt.Fprintln(c.App.Writer, done)
	return err
}

// nonNegative reads a duration flag that must not be negative.
func nonNegative(c *cli.Context, name string) (time.Duration, error) {
	d := c.Duration(name)
	if d < 0 {
		return 0, usagef("--%s must not be negative, got %s", name, d)
	}
	return d, nil
}

// noArgs refuses arguments to a command that takes none, so a stray word
// is never silently ignored.
func noArgs(c *cli.Context) error {
	if c.NArg() > 0 {
		return usagef("pinnedd %s takes no arguments, got %q", c.Command.FullName(), c.Args().First())
	}
	return nil
}
