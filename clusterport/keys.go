package clusterport

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/pinnedd/pinnedd/internal/clustertls"
)

// ErrConfig is an identity the node cannot start with: files missing or
// not matching, a key sealed under another deployment token, a data dir
// of another node.
var ErrConfig = errors.New("cluster identity")

// Keys is this node's TLS directory (<data-dir>/tls): the trusted CA
// bundle, this node's certificate and key, the key of the CA a bootstrap
// node made. Keys are sealed at rest with Sealer (nil: kept in clear).
type Keys struct {
	Dir    string
	Sealer *clustertls.Sealer
	Logger *slog.Logger
}

// Path is the file name in the directory.
func (k Keys) Path(name string) string { return filepath.Join(k.Dir, name) }

// WriteFile writes a file of the directory (certificates, bundles).
func (k Keys) WriteFile(name string, data []byte) error {
	return clustertls.WriteFile(k.Path(name), data, 0o600)
}

// ReadKey reads the key file name: sealed (Sealer opens it), or in clear,
// as an older version or a node without a sealer wrote it; a key found in
// clear, or sealed under a token being rotated out, is sealed in place
// under this node's token.
func (k Keys) ReadKey(name, label string) ([]byte, error) {
	path := k.Path(name)
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if clustertls.IsSealed(b) {
		if k.Sealer == nil {
			return nil, fmt.Errorf("%w: %s is sealed with the deployment token, and this node has none", ErrConfig, path)
		}
		plain, stale, err := k.Sealer.OpenStale(label, b)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %w (was this data dir made with another PINBOARD_TOKEN?)", ErrConfig, path, err)
		}
		if stale {
			if err := k.WriteKey(name, label, plain); err != nil {
				return nil, fmt.Errorf("sealing %s again: %w", path, err)
			}
			k.Logger.Info("sealed a key again under this node's token (it opened with a token being rotated out)", "file", path)
		}
		return plain, nil
	}
	if k.Sealer != nil {
		if err := k.WriteKey(name, label, b); err != nil {
			return nil, fmt.Errorf("sealing %s: %w", path, err)
		}
		k.Logger.Info("sealed a key kept in clear", "file", path)
	}
	return b, nil
}

// WriteKey writes the key file name, sealed when there is a Sealer.
func (k Keys) WriteKey(name, label string, plain []byte) error {
	if k.Sealer != nil {
		plain = k.Sealer.Seal(label, plain)
	}
	return k.WriteFile(name, plain)
}

// Hosts are the host names and addresses a node's certificate names: those
// of its cluster addresses (advertised and bound), each once.
func Hosts(addrs ...string) []string {
	var hs []string
	for _, a := range addrs {
		if h, _, err := net.SplitHostPort(a); err == nil && h != "" && !slices.Contains(hs, h) {
			hs = append(hs, h)
		}
	}
	return hs
}

// Setup says how a node comes by its identity.
type Setup struct {
	NodeID string
	// CAFile, CertFile and KeyFile are the operator's own PKI; with them
	// the directory is not used.
	CAFile, CertFile, KeyFile string
	// Create: this node bootstraps a new cluster, and makes its CA and
	// its own certificate if the directory holds none.
	Create bool
	// Existing: the data dir holds Raft state (a member's id, which gets
	// a certificate only over its own).
	Existing bool
	Hosts    []string      // what the certificate names (Hosts)
	Validity time.Duration // of the certificates a created CA issues (0: the default)
}

// Own: the operator brings the PKI (CAFile, CertFile, KeyFile).
func (s Setup) Own() bool { return s.CAFile != "" || s.CertFile != "" || s.KeyFile != "" }

// LoadIdentity is this node's identity before the port opens: the
// operator's files, or the cluster's own CA in k (created here when s
// says so; otherwise the certificate a join stored, or none yet, which a
// join then gets). localCA is the CA whose key this node holds in k (the
// one it created, until the log records it), or nil.
func LoadIdentity(k Keys, s Setup) (id *clustertls.Identity, localCA *clustertls.CA, err error) {
	id = &clustertls.Identity{}
	if s.Own() {
		return id, nil, loadOwn(id, s)
	}
	caPEM, certPEM, _, err := readAll(k.Path(clustertls.CAFile), k.Path(clustertls.CertFile), k.Path(clustertls.KeyFile))
	var keyPEM []byte
	if err == nil {
		keyPEM, err = k.ReadKey(clustertls.KeyFile, clustertls.LabelNodeKey)
	}
	switch {
	case err == nil:
		if err := id.Set(caPEM, certPEM, keyPEM); err != nil {
			return nil, nil, fmt.Errorf("the certificate in %s: %w", k.Dir, err)
		}
		if got := id.NodeID(); got != s.NodeID {
			return nil, nil, fmt.Errorf("%w: %s holds the certificate of node %q, this node is %q (a data dir of another node?)", ErrConfig, k.Dir, got, s.NodeID)
		}
		k.Logger.Info("cluster certificate loaded", "dir", k.Dir)
		if prev, err := os.ReadFile(k.Path(clustertls.PrevCertFile)); err == nil {
			_ = id.SetPrevious(prev) // kept through a rotation under way; a renewal drops it after
		}
	case !errors.Is(err, os.ErrNotExist):
		return nil, nil, err
	case s.Create && !s.Existing:
		if err := createCA(k, id, s); err != nil {
			return nil, nil, err
		}
	case s.Existing:
		// Its id is (or was) a member's, and a member's id gets a certificate only over its own.
		return nil, nil, fmt.Errorf("%w: this data dir holds Raft state but %s holds no cluster certificate, and no member issues one for a member's id: remove this node (`pinnedd remove %s` on a member), move this data dir away and start it again with --join <member url> (or run the whole cluster with --insecure-cluster)", ErrConfig, k.Dir, s.NodeID)
	default:
		k.Logger.Info("no cluster certificate yet: a join gets one", "dir", k.Dir)
	}
	// The bootstrap node keeps the CA key; it proposes the CA into the log once it leads.
	switch keyPEM, err := k.ReadKey(clustertls.CAKeyFile, clustertls.LabelCAKey); {
	case err == nil:
		// After a rotation the trust bundle leads with the new CA, and once
		// the old one is retired it is not in it at all: the key file then
		// serves nothing (the log holds every CA's key).
		if localCA, err = clustertls.CAFromBundle(id.CAPEM(), keyPEM); errors.Is(err, clustertls.ErrUntrusted) {
			k.Logger.Info("the CA key file is of a CA no longer trusted: ignored", "file", k.Path(clustertls.CAKeyFile))
			localCA = nil
		} else if err != nil {
			return nil, nil, fmt.Errorf("the CA in %s: %w", k.Dir, err)
		}
	case !errors.Is(err, os.ErrNotExist):
		return nil, nil, err
	}
	return id, localCA, nil
}

// loadOwn sets id from the operator's files.
func loadOwn(id *clustertls.Identity, s Setup) error {
	if s.CAFile == "" || s.CertFile == "" || s.KeyFile == "" {
		return fmt.Errorf("%w: TLS needs the CA, certificate and key files together (got ca %q, cert %q, key %q)", ErrConfig, s.CAFile, s.CertFile, s.KeyFile)
	}
	ca, cert, key, err := readAll(s.CAFile, s.CertFile, s.KeyFile)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if err := id.Set(ca, cert, key); err != nil {
		return fmt.Errorf("%w: %s, %s: %w", ErrConfig, s.CertFile, s.CAFile, err)
	}
	if got := id.NodeID(); got != s.NodeID {
		return fmt.Errorf("%w: %s is for node %q, this node is %q", ErrConfig, s.CertFile, got, s.NodeID)
	}
	return nil
}

// createCA makes the cluster's CA and this node's certificate from it, in
// k, and sets id.
func createCA(k Keys, id *clustertls.Identity, s Setup) error {
	ca, err := clustertls.NewCA("pinnedd cluster CA " + s.NodeID)
	if err != nil {
		return err
	}
	ca.NodeValidity = s.Validity
	cert, key, err := ca.Issue(s.NodeID, s.Hosts)
	if err != nil {
		return err
	}
	// The CA key first: a crash between the two leaves a CA to issue from again.
	if err := k.WriteKey(clustertls.CAKeyFile, clustertls.LabelCAKey, ca.KeyPEM()); err != nil {
		return err
	}
	if err := k.WriteKey(clustertls.KeyFile, clustertls.LabelNodeKey, key); err != nil {
		return err
	}
	for name, data := range map[string][]byte{clustertls.CAFile: ca.CertPEM(), clustertls.CertFile: cert} {
		if err := k.WriteFile(name, data); err != nil {
			return err
		}
	}
	if err := id.Set(ca.CertPEM(), cert, key); err != nil {
		return err
	}
	k.Logger.Info("created the cluster CA and this node's certificate", "dir", k.Dir)
	return nil
}

func readAll(paths ...string) (caPEM, certPEM, keyPEM []byte, err error) {
	out := make([][]byte, len(paths))
	for i, p := range paths {
		if out[i], err = os.ReadFile(p); err != nil {
			return nil, nil, nil, err
		}
	}
	return out[0], out[1], out[2], nil
}
