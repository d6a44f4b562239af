package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/urfave/cli/v2"

	"github.com/pinnedd/pinnedd/internal/clustertls"
)

// tlsCommand makes a cluster CA and node certificates for bring-your-own PKI
// (--tls-ca/--tls-cert/--tls-key), in the style of `consul tls`. The common
// path needs none of it: the bootstrap node creates the cluster's CA.
func tlsCommand() *cli.Command {
	return &cli.Command{
		Name:  "tls",
		Usage: "make a cluster CA and node certificates for --tls-ca/--tls-cert/--tls-key (not needed with the cluster's own CA)",
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
					Action: func(c *cli.Context) error {
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
					},
				}},
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
					Action: func(c *cli.Context) error {
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
					},
				}},
			},
		},
	}
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
