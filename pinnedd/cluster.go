package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/pinnedd/pinnedd/raftstore"
)

// clusterCommands are the membership and registry commands; each talks to
// the agent at --addr.
func clusterCommands() []*cli.Command {
	return []*cli.Command{
		joinCommand(),
		leaveCommand(),
		removeCommand(),
		membersCommand(),
		workersCommand(),
	}
}

// joinCommand is `pinnedd join`.
func joinCommand() *cli.Command {
	return &cli.Command{
		Name:      "join",
		Usage:     "tell the local agent to join the cluster through a member",
		ArgsUsage: "<member url>",
		Flags:     clientFlags(),
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return usagef("pinnedd join <member url> [--addr URL] takes one member URL, got %d arguments", c.NArg())
			}
			member, err := normalizeAddr("member url", c.Args().First())
			if err != nil {
				return err
			}
			if err := apiCall(c, http.MethodPost, "/_pinned/join", map[string]string{"url": member}, nil); err != nil {
				return err
			}
			_, err = fmt.Fprintf(c.App.Writer, "joined via %s\n", member)
			return err
		},
	}
}

// removeCommand is `pinnedd remove`.
func removeCommand() *cli.Command {
	return &cli.Command{
		Name:      "remove",
		Usage:     "remove a (dead) member from the Raft cluster",
		ArgsUsage: "<node id>",
		Flags:     clientFlags(),
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return usagef("pinnedd remove <node id> [--addr URL] takes one node id, got %d arguments", c.NArg())
			}
			ac, err := newAgentClient(c)
			if err != nil {
				return err
			}
			id := c.Args().First()
			err = ac.raft(c.Context, func(ctx context.Context, hc *http.Client, url, token string) error {
				return raftstore.RemoveVia(ctx, hc, url, token, id)
			})
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(c.App.Writer, "removed %s\n", id)
			return err
		},
	}
}

// membersCommand is `pinnedd members`.
func membersCommand() *cli.Command {
	return &cli.Command{
		Name:  "members",
		Usage: "list the Raft members: node, raft address, voter or not, leader, last contact",
		Flags: append(clientFlags(), &cli.BoolFlag{Name: "json", Usage: "print JSON"}),
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return usagef("pinnedd members takes no arguments, got %q", c.Args().First())
			}
			ac, err := newAgentClient(c)
			if err != nil {
				return err
			}
			var ms []raftstore.Member
			err = ac.raft(c.Context, func(ctx context.Context, hc *http.Client, url, token string) (err error) {
				ms, err = raftstore.MembersVia(ctx, hc, url, token)
				return err
			})
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return json.NewEncoder(c.App.Writer).Encode(ms)
			}
			w := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "NODE\tRAFT ADDRESS\tAPI\tSUFFRAGE\tLEADER\tLAST CONTACT")
			for _, m := range ms {
				suffrage := "nonvoter"
				if m.Voter {
					suffrage = "voter"
				}
				contact := "-"
				if !m.LastContact.IsZero() {
					contact = time.Since(m.LastContact).Round(time.Millisecond).String() + " ago"
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%v\t%s\n", m.ID, m.RaftAddr, m.APIAddr, suffrage, m.Leader, contact)
			}
			return w.Flush()
		},
	}
}

// workersCommand is `pinnedd workers`.
func workersCommand() *cli.Command {
	return &cli.Command{
		Name:  "workers",
		Usage: "list the live workers (GET /registry/workers); --all adds those whose lease lapsed",
		Flags: append(clientFlags(),
			&cli.BoolFlag{Name: "json", Usage: "print JSON"},
			&cli.BoolFlag{Name: "all", Usage: "also list workers whose lease has lapsed"},
		),
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return usagef("pinnedd workers takes no arguments, got %q", c.Args().First())
			}
			path := "/registry/workers"
			if c.Bool("all") {
				path += "?all=1"
			}
			var out struct {
				Workers []struct {
					ClientID     string   `json:"clientId"`
					NodeID       string   `json:"nodeId"`
					AdvertiseURL string   `json:"advertiseUrl"`
					Namespaces   []string `json:"namespaces"`
					Routes       []struct {
						Hostname, Namespace, Env string
						Superseded               bool
					} `json:"routes"`
					Live        bool  `json:"live"`
					ExpiresInMs int64 `json:"expiresInMs"`
					Degraded    bool  `json:"degraded"`
					Placements  int   `json:"placements"`
					drainView
				} `json:"workers"`
			}
			var raw json.RawMessage
			if err := apiCall(c, http.MethodGet, path, nil, &raw); err != nil {
				return err
			}
			if c.Bool("json") {
				_, err := fmt.Fprintln(c.App.Writer, string(raw))
				return err
			}
			if err := json.Unmarshal(raw, &out); err != nil {
				return fmt.Errorf("decode workers: %w", err)
			}
			w := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "CLIENT ID\tNODE\tADVERTISE URL\tNAMESPACES\tLEASE\tPLACEMENTS")
			for _, wk := range out.Workers {
				lease := fmt.Sprintf("%dms", wk.ExpiresInMs)
				if !wk.Live {
					lease = "expired"
				}
				lease += wk.drainView.text(" ", time.Now())
				if wk.Degraded {
					lease += " degraded"
				}
				served := wk.Namespaces
				for _, rt := range wk.Routes {
					// Hostname-aware: each route, with the env its ids live in.
					r := rt.Hostname + rt.Namespace + " (env " + rt.Env + ")"
					if rt.Superseded {
						r += " superseded"
					}
					served = append(served, r)
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%d\n", wk.ClientID, wk.NodeID, wk.AdvertiseURL, strings.Join(served, ","), lease, wk.Placements)
			}
			return w.Flush()
		},
	}
}

// leaveCommand asks an agent to leave for good: it drains, deregisters,
// leaves Raft (handing leadership over first) and exits 0. Without
// --no-wait the command returns once the agent has stopped answering.
func leaveCommand() *cli.Command {
	return &cli.Command{
		Name:  "leave",
		Usage: "take the agent at --addr out of the cluster: it drains, deregisters, leaves Raft and exits",
		Flags: append(clientFlags(),
			&cli.DurationFlag{Name: "deadline", Value: 30 * time.Second, Usage: "drain deadline: instances still busy then are evicted"},
			&cli.BoolFlag{Name: "no-wait", Usage: "return once the agent has accepted, without waiting for it to exit"},
		),
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return usagef("pinnedd leave takes no arguments (it acts on the agent at --addr), got %q", c.Args().First())
			}
			deadline, err := nonNegative(c, "deadline")
			if err != nil {
				return err
			}
			ac, err := newAgentClient(c)
			if err != nil {
				return err
			}
			var out struct {
				NodeID string `json:"nodeId"`
			}
			if err := ac.call(c.Context, http.MethodPost, "/_pinned/leave", map[string]any{"deadline": deadline.Seconds()}, &out); err != nil {
				return err
			}
			node := out.NodeID
			if node == "" {
				node = "the agent at " + ac.base
			}
			fmt.Fprintf(c.App.Writer, "%s is leaving: draining (deadline %s), then it leaves the cluster and exits\n", node, deadline)
			if c.Bool("no-wait") {
				return nil
			}
			bound := deadline + 30*time.Second
			if err := ac.waitGone(c.Context, bound); err != nil {
				return fmt.Errorf("%s: %w", node, err)
			}
			_, err = fmt.Fprintf(c.App.Writer, "%s left the cluster\n", node)
			return err
		},
	}
}

// errStillServing is waitGone's failure: the agent answered for too long.
var errStillServing = errors.New("still answers /healthz")

// waitGone polls the agent's /healthz until it stops answering (the
// process has exited), for at most bound.
func (ac *agentClient) waitGone(ctx context.Context, bound time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	base := ac.base
	// No retry of refused connections here: a refusal is the answer
	// awaited. The agent's TLS is verified as for the call that made it leave.
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true, TLSClientConfig: ac.tls}}
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/healthz", nil)
		if err != nil {
			return err
		}
		resp, err := hc.Do(req)
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("%w after %s", errStillServing, bound)
			}
			return nil
		}
		resp.Body.Close()
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w after %s", errStillServing, bound)
		case <-tick.C:
		}
	}
}
