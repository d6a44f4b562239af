package clusterport

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"time"

	"github.com/hashicorp/raft"

	"github.com/pinnedd/pinnedd/internal/clustertls"
	"github.com/pinnedd/pinnedd/internal/httpx"
)

// Config is a node's cluster port: where it listens, how the node comes by its certificate,
// and the settings of the cluster's own CA.
type Config struct {
	NodeID string
	// DataDir holds tls/: this node's key and certificate and the CAs it trusts, with the
	// cluster's own CA.
	DataDir string
	// Addr is the bind address ("127.0.0.1:0" picks a free port); Advertise what the other
	// nodes dial (default the bound address; required when Addr binds every interface).
	Addr, Advertise string
	// CAFile, CertFile and KeyFile bring the operator's own PKI: the CA this node trusts and
	// its certificate (CommonName = NodeID) and key, PEM. All three or none. With none, the
	// cluster runs its own CA: created by the bootstrap node, replicated in the log so any
	// leader can issue, and a joining node gets its certificate as it joins.
	CAFile, CertFile, KeyFile string
	// Bootstrap: this node bootstraps a new cluster (and creates its CA) if its data dir holds
	// no state.
	Bootstrap bool
	// Tokens are the tokens a join proof may be made with and the CA is pinned for, the
	// deployment token first.
	Tokens []string
	// Sealer keeps the keys at rest sealed (nil: in clear).
	Sealer *clustertls.Sealer
	// Validity is how long the certificates the cluster's CA issues hold (0: the default).
	Validity time.Duration
	// ServerConn, if set, makes the server side of TLS over an accepted connection in place
	// of tls.Server (Options.ServerConn).
	ServerConn func(raw net.Conn, cfg *tls.Config) (*tls.Conn, error)
	Logger     *slog.Logger
}

// Cluster is a node's cluster port with what stands behind it: its identity, the cluster
// CA's part on this node, the client of node-to-node HTTP, and the membership checks, which
// follow the log's configuration. The log's store opens it (Listen) once it knows whether its
// data dir holds state, and attaches itself before it runs.
type Cluster struct {
	cfg     Config
	log     *slog.Logger
	ledger  *Ledger
	port    *Port
	ca      *Authority
	ident   *clustertls.Identity
	peerTLS *tls.Config
	client  *http.Client
	closeFn func()
	members memberCache
	// attached is closed once the log is attached: admission waits for it.
	attached chan struct{}
}

// NewCluster is a cluster port not yet listening. It serves one store: it opens once.
func NewCluster(cfg Config) *Cluster {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	c := &Cluster{cfg: cfg, log: cfg.Logger, attached: make(chan struct{})}
	c.ledger = NewLedger(cfg.Sealer, cfg.Validity, cfg.Logger)
	return c
}

// Ledger is the CAs the log records: the log's state machine applies its entries to it.
func (c *Cluster) Ledger() *Ledger { return c.ledger }

// Authority is this node's part in the cluster CA (after Listen).
func (c *Cluster) Authority() *Authority { return c.ca }

// Own: the operator brings the PKI.
func (c *Cluster) own() bool {
	return c.cfg.CAFile != "" || c.cfg.CertFile != "" || c.cfg.KeyFile != ""
}

// Hosts are what this node's certificate names.
func (c *Cluster) hosts() []string { return Hosts(c.cfg.Advertise, c.cfg.Addr) }

// Listen loads this node's identity (LoadIdentity; existing: the data dir holds the log's
// state) and opens the port, as Raft's stream layer.
func (c *Cluster) Listen(existing bool) (raft.StreamLayer, error) {
	if c.ca != nil {
		return nil, errors.New("the cluster port is open already: a Cluster opens once")
	}
	keys := Keys{Dir: filepath.Join(c.cfg.DataDir, "tls"), Sealer: c.cfg.Sealer, Logger: c.log}
	ident, localCA, err := LoadIdentity(keys, Setup{
		NodeID: c.cfg.NodeID, CAFile: c.cfg.CAFile, CertFile: c.cfg.CertFile, KeyFile: c.cfg.KeyFile,
		Create: c.cfg.Bootstrap, Existing: existing, Hosts: c.hosts(), Validity: c.cfg.Validity,
	})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", c.cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("cluster port on %s: %w", c.cfg.Addr, err)
	}
	adv := ln.Addr()
	if c.cfg.Advertise != "" {
		if adv, err = net.ResolveTCPAddr("tcp", c.cfg.Advertise); err != nil {
			_ = ln.Close()
			return nil, fmt.Errorf("%w: advertised address %q: %w", ErrConfig, c.cfg.Advertise, err)
		}
	} else if tcp, ok := adv.(*net.TCPAddr); ok && tcp.IP.IsUnspecified() {
		_ = ln.Close()
		return nil, fmt.Errorf("%w: %s binds every interface: set the address other nodes dial (--raft-advertise-addr)", ErrConfig, c.cfg.Addr)
	}
	c.ident = ident
	c.peerTLS = ident.ClientConfig(ALPNHTTP)
	tr := &http.Transport{TLSClientConfig: c.peerTLS, MaxIdleConnsPerHost: 64, IdleConnTimeout: 90 * time.Second}
	// A connection beyond the idle pool is closed after its request, and a new one costs
	// a handshake: keep as many as forwards run at once.
	sync := &httpx.SyncTransport{TLS: c.peerTLS, Fallback: tr, MaxIdlePerHost: peerIdlePerHost, DialTimeout: 5 * time.Second}
	c.client = &http.Client{Transport: sync}
	c.closeFn = func() { sync.Close(); tr.CloseIdleConnections() }
	c.port = New(ln, adv, ident, Options{
		Admit: c.admit, MemberHost: c.memberHost, ServerConn: c.cfg.ServerConn, Logger: c.log.With("component", "raft-tls"),
	})
	c.ca = NewAuthority(AuthorityConfig{
		NodeID: c.cfg.NodeID, Tokens: c.cfg.Tokens, Sealer: c.cfg.Sealer, Validity: c.cfg.Validity,
		Own: c.own(), Existing: existing, Hosts: c.hosts(), Logger: c.log,
	}, c.ledger, nil, keys, ident, localCA, c.port)
	return c.port, nil
}

// peerIdlePerHost bounds the idle connections kept to each peer's cluster port.
const peerIdlePerHost = 512

// Attach hands the cluster the log it follows, once the log runs: from then on its
// configuration admits peers, and the CA records itself in it.
func (c *Cluster) Attach(log Log) {
	c.ca.log = log
	c.members.mu.Lock()
	c.members.log = log
	c.members.mu.Unlock()
	close(c.attached)
}

// Identity is this node's certificate and trust (after Listen).
func (c *Cluster) Identity() *clustertls.Identity { return c.ident }

// PeerTLS is the client side of node-to-node HTTP: this node's certificate, the cluster CA,
// ALPN for the cluster port's HTTP. One config for the process's life: it reads the identity
// at every handshake and keeps sessions to resume.
func (c *Cluster) PeerTLS() *tls.Config { return c.peerTLS }

// PeerClient calls other nodes' cluster ports, over mutual TLS.
func (c *Cluster) PeerClient() *http.Client { return c.client }

// PeerAddr is the cluster address (host:port of the cluster port) of node id, if it is a
// member of the latest configuration. A miss re-reads the configuration at most once a
// second, so a node no configuration holds (an outside worker) costs a map lookup.
func (c *Cluster) PeerAddr(id string) (string, bool) {
	addr, ok, _ := c.members.lookup(id)
	return addr, ok
}

// admit is the membership check on an authenticated inbound connection: the peer's node id
// must be in the log's latest configuration. A node with no configuration yet (new, waiting to
// be joined) accepts any cluster certificate: the leader adding it must get through.
func (c *Cluster) admit(nodeID string) error {
	select {
	case <-c.attached:
	case <-time.After(handshakeTimeout):
		return errors.New("raft is not running yet")
	}
	servers, err := c.members.log.Configuration()
	if err != nil || len(servers) == 0 {
		return nil
	}
	for _, srv := range servers {
		if srv.ID == nodeID {
			return nil
		}
	}
	// The cache learns of a removal appended but not yet committed here, as it would at
	// the commit: the refused node is then known to have just left.
	c.members.set(servers)
	if c.members.leftWithin(nodeID, departedGrace) {
		return fmt.Errorf("node %q is %w", nodeID, ErrLeft)
	}
	return fmt.Errorf("node %q is %w", nodeID, ErrNotMember)
}

// Configured records the members of a configuration the log committed (read as the latest,
// appended one: a replayed old configuration must neither drop current members from the checks
// nor cut their connections), and sweeps connections from nodes it no longer holds.
func (c *Cluster) Configured(servers []Server) {
	c.members.set(servers)
	if len(servers) == 0 {
		return
	}
	ids := make(map[string]bool, len(servers))
	for _, srv := range servers {
		ids[srv.ID] = true
	}
	c.port.Sweep(func(id string) bool { return ids[id] })
}

// memberHost: ip is the address of one of the latest configuration's members (reading the
// configuration if it was never read).
func (c *Cluster) memberHost(ip string) bool {
	if c.members.cur.Load() == nil {
		c.members.reread()
	}
	return c.members.hosts.Has(ip)
}

// IsMember: node may call this node's cluster port. As for Raft (admit), a node with no
// configuration yet accepts any cluster certificate.
func (c *Cluster) IsMember(node string) bool {
	_, ok, none := c.members.lookup(node)
	return ok || none
}

// Serve serves HTTP between nodes on the cluster port with h, until StopHTTP: only a member
// reaches it: its certificate was checked in the handshake, and its membership is checked
// again on every request (a removed node's request is answered 403 and its connection
// closed). handBacks are as for Port.Serve.
func (c *Cluster) Serve(h http.Handler, handBacks ...net.Listener) {
	c.port.Serve(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		node := NodeFrom(r.Context())
		if !c.IsMember(node) {
			w.Header().Set("Connection", "close")
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("X-Content-Type-Options", "nosniff")
			w.WriteHeader(http.StatusForbidden)
			_ = json.NewEncoder(w).Encode(map[string]string{
				"error": fmt.Sprintf("node %q is not a member of the cluster", node), "code": "forbidden",
			})
			return
		}
		h.ServeHTTP(w, r)
	}), handBacks...)
}

// StopHTTP stops the cluster port's HTTP (Port.StopHTTP).
func (c *Cluster) StopHTTP(ctx context.Context, graceful bool) {
	if c.port != nil {
		c.port.StopHTTP(ctx, graceful)
	}
}

// CloseClients closes the idle connections of node-to-node calls; the port itself closes with
// Raft's transport.
func (c *Cluster) CloseClients() {
	if c.closeFn != nil {
		c.closeFn()
	}
}
