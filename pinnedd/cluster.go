package main

import (
	"bytes"
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
		{
			Name:      "join",
			Usage:     "tell the local agent to join the cluster through a member",
			ArgsUsage: "<member url>",
			Flags:     clientFlags(),
			Action: func(c *cli.Context) error {
				if c.NArg() != 1 {
					return errors.New("usage: pinnedd join [--addr URL] <member url>")
				}
				body, _ := json.Marshal(map[string]string{"url": c.Args().First()})
				if err := apiCall(c, http.MethodPost, "/_pinned/join", bytes.NewReader(body), nil); err != nil {
					return err
				}
				fmt.Fprintf(c.App.Writer, "joined via %s\n", c.Args().First())
				return nil
			},
		},
		{
			Name:  "leave",
			Usage: "take the agent out of the Raft cluster (leadership is handed over first)",
			Flags: clientFlags(),
			Action: func(c *cli.Context) error {
				if err := raftstore.LeaveVia(c.Context, &http.Client{Timeout: 30 * time.Second}, c.String("addr"), c.String("token")); err != nil {
					return err
				}
				fmt.Fprintln(c.App.Writer, "left the cluster")
				return nil
			},
		},
		{
			Name:      "remove",
			Usage:     "remove a (dead) member from the Raft cluster",
			ArgsUsage: "<node id>",
			Flags:     clientFlags(),
			Action: func(c *cli.Context) error {
				if c.NArg() != 1 {
					return errors.New("usage: pinnedd remove [--addr URL] <node id>")
				}
				if err := raftstore.RemoveVia(c.Context, &http.Client{Timeout: 30 * time.Second}, c.String("addr"), c.String("token"), c.Args().First()); err != nil {
					return err
				}
				fmt.Fprintf(c.App.Writer, "removed %s\n", c.Args().First())
				return nil
			},
		},
		{
			Name:  "members",
			Usage: "list the Raft members: node, raft address, voter or not, leader, last contact",
			Flags: append(clientFlags(), &cli.BoolFlag{Name: "json", Usage: "print JSON"}),
			Action: func(c *cli.Context) error {
				ms, err := raftstore.MembersVia(c.Context, &http.Client{Timeout: 30 * time.Second}, c.String("addr"), c.String("token"))
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
		},
		{
			Name:  "workers",
			Usage: "list the registered workers (GET /registry/workers)",
			Flags: append(clientFlags(), &cli.BoolFlag{Name: "json", Usage: "print JSON"}),
			Action: func(c *cli.Context) error {
				var out struct {
					Workers []struct {
						ClientID     string   `json:"clientId"`
						NodeID       string   `json:"nodeId"`
						AdvertiseURL string   `json:"advertiseUrl"`
						Namespaces   []string `json:"namespaces"`
						Live         bool     `json:"live"`
						ExpiresInMs  int64    `json:"expiresInMs"`
						Draining     bool     `json:"draining"`
						Degraded     bool     `json:"degraded"`
						Placements   int      `json:"placements"`
					} `json:"workers"`
				}
				if err := apiCall(c, http.MethodGet, "/registry/workers", nil, &out); err != nil {
					return err
				}
				if c.Bool("json") {
					return json.NewEncoder(c.App.Writer).Encode(out)
				}
				w := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
				fmt.Fprintln(w, "CLIENT ID\tNODE\tADVERTISE URL\tNAMESPACES\tLEASE\tPLACEMENTS")
				for _, wk := range out.Workers {
					lease := fmt.Sprintf("%dms", wk.ExpiresInMs)
					if !wk.Live {
						lease = "expired"
					}
					if wk.Draining {
						lease += " draining"
					}
					if wk.Degraded {
						lease += " degraded"
					}
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%d\n", wk.ClientID, wk.NodeID, wk.AdvertiseURL, strings.Join(wk.Namespaces, ","), lease, wk.Placements)
				}
				return w.Flush()
			},
		},
	}
}
