package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/pinnedd/pinnedd/clusterport"
	"github.com/pinnedd/pinnedd/internal/clustertls"
	"github.com/pinnedd/pinnedd/raftstore"
)

// tlsCommand makes a cluster CA and node certificates for bring-your-own PKI
// (--tls-ca/--tls-cert/--tls-key), in the style of `consul tls`; the common
// path needs none of it (the bootstrap node creates the cluster's CA), but
// rotates that CA (`pinnedd tls rotate`).
func tlsCommand() *cli.Command {
	return &cli.Command{
		Name:  "tls",
		Usage: "rotate the cluster's own CA, or make a CA and node certificates for --tls-ca/--tls-cert/--tls-key",
		Subcommands: []*cli.Command{
			{
				Name:  "ca",
				Usage: "cluster CA commands",
				Subcommands: []*cli.Command{{
					Name:  "create",
					Usage: "write a new cluster CA: pinnedd-ca.pem (give every node as --tls-ca) and pinnedd-ca-key.pem (keep it safe)",
					Flags: []cli.Flag{
						&cli.StringFlag{Name: "dir", Value: ".", Usage: "where to write the files"},
					},
					Action: tlsCACreate,
				}},
			},
			{
				Name:  "rotate",
				Usage: "replace the cluster's own CA: members renew their certificates from a new one, then the old one is retired (certificates it issued, and certificates its key could still mint, are refused)",
				Flags: append(clientFlags(),
					&cli.DurationFlag{Name: "wait", Value: 2 * time.Minute, Usage: "wait this long for every member to renew and the old CA to be retired (0: do not wait)"}),
				Action: tlsRotate,
			},
			{
				Name:  "cert",
				Usage: "node certificate commands",
				Subcommands: []*cli.Command{{
					Name:  "create",
					Usage: "write <node>.pem and <node>-key.pem, signed by the CA, for --tls-cert and --tls-key",
					Flags: []cli.Flag{
						&cli.StringFlag{Name: "node", Usage: "the node's --node-id (the certificate's CommonName); required"},
						&cli.StringFlag{Name: "ca", Value: "pinnedd-ca.pem", Usage: "the CA certificate"},
						&cli.StringFlag{Name: "ca-key", Value: "pinnedd-ca-key.pem", Usage: "the CA key"},
						&cli.StringSliceFlag{Name: "host", Usage: "an IP or DNS name of the node, added to the certificate (repeatable)"},
						&cli.StringFlag{Name: "dir", Value: ".", Usage: "where to write the files"},
					},
					Action: tlsCertCreate,
				}},
			},
		},
	}
}

// tlsCACreate is `pinnedd tls ca create`.
func tlsCACreate(c *cli.Context) error {
	if c.NArg() > 0 {
		return usagef("pinnedd tls ca create takes no arguments, got %q", c.Args().First())
	}
	ca, err := clustertls.NewCA("pinnedd cluster CA")
	if err != nil {
		return err
	}
	certPath, keyPath := filepath.Join(c.String("dir"), "pinnedd-ca.pem"), filepath.Join(c.String("dir"), "pinnedd-ca-key.pem")
	if err := writeNew(keyPath, ca.KeyPEM(), 0o600); err != nil {
		return err
	}
	if err := writeNew(certPath, ca.CertPEM(), 0o644); err != nil {
		return err
	}
	_, err = fmt.Fprintf(c.App.Writer, "wrote %s and %s\n", certPath, keyPath)
	return err
}

// tlsRotate is `pinnedd tls rotate`: it starts the rotation through the agent at --addr and
// waits (--wait) until every member renewed and the old CA is retired.
func tlsRotate(c *cli.Context) error {
	if c.NArg() > 0 {
		return usagef("pinnedd tls rotate takes no arguments, got %q", c.Args().First())
	}
	ac, err := newAgentClient(c)
	if err != nil {
		return err
	}
	var fp string
	err = ac.raft(c.Context, func(ctx context.Context, hc *http.Client, url, token string) (err error) {
		fp, err = raftstore.RotateCAVia(ctx, hc, url, token)
		return err
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(c.App.Writer, "new cluster CA %s: members renew their certificates from it\n", fp)
	if c.Duration("wait") <= 0 {
		return nil
	}
	deadline := time.Now().Add(c.Duration("wait"))
	for {
		var st clusterport.TLSState
		err := ac.raft(c.Context, func(ctx context.Context, hc *http.Client, url, token string) (err error) {
			st, err = raftstore.TLSVia(ctx, hc, url, token)
			return err
		})
		switch {
		case err == nil && len(st.Trusted) == 1 && st.Trusted[0] == fp:
			_, err = fmt.Fprintln(c.App.Writer, "every member renewed; the old CA is retired")
			return err
		case errors.Is(err, raftstore.ErrUnauthorized), errors.Is(err, raftstore.ErrForbidden), errors.Is(err, raftstore.ErrBadRequest):
			return err // waiting longer changes nothing
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the old CA is still trusted after %s: a member has not renewed yet (down? see `pinnedd members`); it is retired once every member did, or once the member is removed", c.Duration("wait"))
		}
		select {
		case <-c.Context.Done():
			return c.Context.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// tlsCertCreate is `pinnedd tls cert create`.
func tlsCertCreate(c *cli.Context) error {
	if c.NArg() > 0 {
		return usagef("pinnedd tls cert create takes no arguments, got %q (the node goes in --node)", c.Args().First())
	}
	if c.String("node") == "" {
		return usagef("pinnedd tls cert create needs --node <node id>")
	}
	certPEM, err := os.ReadFile(c.String("ca"))
	if err != nil {
		return fmt.Errorf("--ca: %w (make one with `pinnedd tls ca create`)", err)
	}
	keyPEM, err := os.ReadFile(c.String("ca-key"))
	if err != nil {
		return fmt.Errorf("--ca-key: %w", err)
	}
	ca, err := clustertls.ParseCA(certPEM, keyPEM)
	if err != nil {
		return fmt.Errorf("--ca %s, --ca-key %s: %w", c.String("ca"), c.String("ca-key"), err)
	}
	node := c.String("node")
	cert, key, err := ca.Issue(node, c.StringSlice("host"))
	if err != nil {
		return err
	}
	certPath, keyPath := filepath.Join(c.String("dir"), node+".pem"), filepath.Join(c.String("dir"), node+"-key.pem")
	if err := writeNew(keyPath, key, 0o600); err != nil {
		return err
	}
	if err := writeNew(certPath, cert, 0o644); err != nil {
		return err
	}
	_, err = fmt.Fprintf(c.App.Writer, "wrote %s and %s\n", certPath, keyPath)
	return err
}

// writeNew writes a file that must not exist yet: a CA or key is never
// overwritten by a second run.
func writeNew(path string, data []byte, mode os.FileMode) error {
	if _, err := os.Stat(path); err == nil {
		return fmt.Errorf("%s exists: not overwriting it (remove it first, or use --dir)", path)
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return clustertls.WriteFile(path, data, mode)
}
