package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"
)

// clientFlags are shared by every command that talks to an agent.
func clientFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "addr", Value: "http://127.0.0.1:8080", Usage: "the agent's front door", EnvVars: []string{"PINNEDD_ADDR"}},
		&cli.StringFlag{Name: "token", Value: devToken, Usage: "operator token", EnvVars: []string{"PINBOARD_TOKEN"}},
	}
}

// apiCall sends a request to the agent and decodes a JSON answer into out.
func apiCall(c *cli.Context, method, path string, body io.Reader, out any) error {
	ctx, cancel := context.WithTimeout(c.Context, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(c.String("addr"), "/")+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.String("token"))
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("reach agent: %w", err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("read answer: %w", err)
	}
	if resp.StatusCode/100 != 2 {
		var e struct {
			Error string `json:"error"`
		}
		if json.Unmarshal(data, &e) == nil && e.Error != "" {
			return fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, e.Error)
		}
		return fmt.Errorf("%s %s: %s", method, path, resp.Status)
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(data, out)
}

type statusView struct {
	NodeID       string `json:"nodeId"`
	Version      string `json:"version"`
	AdvertiseURL string `json:"advertiseUrl"`
	PID          int    `json:"pid"`
	Worker       struct {
		ClientID    string `json:"clientId"`
		Lease       string `json:"lease"`
		ExpiresInMs int64  `json:"expiresInMs"`
		Draining    bool   `json:"draining"`
	} `json:"worker"`
	Plugins []struct {
		Name       string   `json:"name"`
		State      string   `json:"state"`
		PID        int      `json:"pid"`
		Restarts   int      `json:"restarts"`
		Degraded   bool     `json:"degraded"`
		Namespaces []string `json:"namespaces"`
	} `json:"plugins"`
	Instances []struct {
		Namespace   string `json:"namespace"`
		ID          string `json:"id"`
		Generation  uint64 `json:"generation"`
		Connections int    `json:"connections"`
		IdleMs      int64  `json:"idleMs"`
	} `json:"instances"`
}

func statusCommand() *cli.Command {
	return &cli.Command{
		Name:  "status",
		Usage: "show the local agent: worker lease, plugins, instances",
		Flags: append(clientFlags(), &cli.BoolFlag{Name: "json", Usage: "print the raw JSON"}),
		Action: func(c *cli.Context) error {
			var raw json.RawMessage
			if err := apiCall(c, http.MethodGet, "/_pinned/status", nil, &raw); err != nil {
				return err
			}
			if c.Bool("json") {
				_, err := fmt.Fprintln(c.App.Writer, string(raw))
				return err
			}
			var st statusView
			if err := json.Unmarshal(raw, &st); err != nil {
				return fmt.Errorf("decode status: %w", err)
			}
			w := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
			fmt.Fprintf(w, "node\t%s (pinnedd %s, pid %d)\n", st.NodeID, st.Version, st.PID)
			fmt.Fprintf(w, "advertise\t%s\n", st.AdvertiseURL)
			fmt.Fprintf(w, "worker\t%s lease %s (expires in %dms)%s\n", st.Worker.ClientID, st.Worker.Lease, st.Worker.ExpiresInMs, map[bool]string{true: ", draining"}[st.Worker.Draining])
			fmt.Fprintln(w, "\nPLUGIN\tSTATE\tPID\tRESTARTS\tNAMESPACES")
			for _, p := range st.Plugins {
				state := p.State
				if p.Degraded {
					state += " (degraded)"
				}
				fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%s\n", p.Name, state, p.PID, p.Restarts, strings.Join(p.Namespaces, ","))
			}
			fmt.Fprintf(w, "\nINSTANCE\tGENERATION\tCONNECTIONS\tIDLE\n")
			for _, in := range st.Instances {
				fmt.Fprintf(w, "%s/%s\t%d\t%d\t%s\n", in.Namespace, in.ID, in.Generation, in.Connections, (time.Duration(in.IdleMs) * time.Millisecond).String())
			}
			return w.Flush()
		},
	}
}
