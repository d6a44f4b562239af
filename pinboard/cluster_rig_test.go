package pinboard

// The in-process cluster rig the claims benchmark and the directory
// hand-off tests share.

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/clusterport"
	"github.com/pinnedd/pinnedd/internal/clustertls"
	"github.com/pinnedd/pinnedd/internal/relay"
	"github.com/pinnedd/pinnedd/pinboard/directory"
	"github.com/pinnedd/pinnedd/raftstore"
)

// benchNode is one in-process member of a real 3-node cluster: raft on
// disk, TCP transport, HTTP forwarding to the leader.
type benchNode struct {
	store *raftstore.Store
	dir   *Directory
	// silent makes the node's POST /_raft/apply swallow what followers
	// forward and never answer, as a leader cut off by a partition does;
	// each one swallowed is sent on swallowed (if there is room).
	silent    atomic.Bool
	swallowed chan struct{}
}

func startBenchCluster(b testing.TB, n int) []*benchNode {
	b.Helper()
	return startBenchClusterTLS(b, n, false)
}

// startBenchClusterTLS is startBenchCluster whose Raft runs over mutual
// TLS (withTLS), each node with a certificate from one CA made here (the
// bring-your-own-PKI path: the transport is what a default node runs).
func startBenchClusterTLS(b testing.TB, n int, withTLS bool) []*benchNode {
	b.Helper()
	var ca *clustertls.CA
	if withTLS {
		var err error
		if ca, err = clustertls.NewCA("pinnedd bench CA"); err != nil {
			b.Fatal(err)
		}
	}
	ctx := context.Background()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	nodes := make([]*benchNode, n)
	for i := range n {
		var h atomic.Pointer[http.Handler]
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if hp := h.Load(); hp != nil {
				(*hp).ServeHTTP(w, r)
				return
			}
			http.Error(w, "starting", http.StatusServiceUnavailable)
		}))
		b.Cleanup(srv.Close)
		m := directory.New()
		id := fmt.Sprintf("n%d", i)
		cluster := benchTLS(b, ca, id, quiet)
		store, err := raftstore.Open(ctx, raftstore.Config{
			NodeID: id, RaftAddr: "127.0.0.1:0", APIAddr: srv.URL, DataDir: b.TempDir(),
			// Raft's default (LAN) timeouts: with three nodes sharing two
			// saturated cores, shorter ones cost elections mid-run.
			Bootstrap: i == 0, Logger: quiet, Token: "t", Cluster: cluster,
		}, m)
		if err != nil {
			b.Fatal(err)
		}
		dir := NewDirectory(m, store)
		mux := http.NewServeMux()
		raftRPC := store.Handler(nil)
		mux.Handle(raftstore.HandlerPrefix, raftRPC)
		nodes[i] = &benchNode{store: store, dir: dir, swallowed: make(chan struct{}, 16)}
		nd := nodes[i]
		mux.HandleFunc("POST "+raftstore.HandlerPrefix+"apply", func(w http.ResponseWriter, r *http.Request) {
			if nd.silent.Load() {
				select {
				case nd.swallowed <- struct{}{}:
				default:
				}
				// Read the batch first: the server notices a closed
				// connection only once the body has been read.
				_, _ = io.Copy(io.Discard, r.Body)
				<-r.Context().Done() // the sender gave up
				return
			}
			raftRPC.ServeHTTP(w, r)
		})
		var handler http.Handler = mux
		h.Store(&handler)
		// With TLS, followers forward to the leader's cluster port (the
		// silent switch above is for the plain rig).
		if cluster != nil {
			cluster.Serve(store.PeerHandler())
		}
		b.Cleanup(func() {
			nodes[i].dir.Close()
			_ = store.Close(context.Background())
		})
		if i == 0 {
			if err := store.WaitForLeader(ctx); err != nil {
				b.Fatal(err)
			}
			continue
		}
		if err := nodes[0].store.Join(ctx, store.NodeID(), store.RaftAddr(), srv.URL); err != nil {
			b.Fatal(err)
		}
	}
	for _, nd := range nodes {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if err := nd.store.WaitForLeader(wctx); err != nil {
			b.Fatal(err)
		}
		cancel()
	}
	res, err := nodes[0].dir.Do(ctx, directory.Register{
		ClientID: "w1", SessionID: "s1", NodeID: "n0", AdvertiseURL: "http://w1", Namespaces: []string{"/b"},
		Headroom: 1 << 30, TTLMs: time.Hour.Milliseconds(), Now: time.Now().UnixMilli(),
	})
	if err != nil || res.Code != directory.CodeOK {
		b.Fatalf("register: %v %v", res.Code, err)
	}
	return nodes
}

// benchTLS writes a key and a certificate for node id from ca into a
// temporary directory and returns the cluster port naming them (nil: no
// ca, an insecure cluster).
func benchTLS(b testing.TB, ca *clustertls.CA, id string, log *slog.Logger) *clusterport.Cluster {
	if ca == nil {
		return nil
	}
	key, err := clustertls.NewKey()
	if err != nil {
		b.Fatal(err)
	}
	csr, err := clustertls.NewCSR(key, id, []string{"127.0.0.1"})
	if err != nil {
		b.Fatal(err)
	}
	cert, err := ca.SignCSR(csr, id)
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	cfg := clusterport.Config{NodeID: id, DataDir: b.TempDir(), Addr: "127.0.0.1:0", Tokens: []string{"t"}, Logger: log,
		CAFile: filepath.Join(dir, "ca.pem"), CertFile: filepath.Join(dir, "cert.pem"), KeyFile: filepath.Join(dir, "key.pem"),
		ServerConn: relay.ServerTLS} // as the agent with its fast path
	for path, data := range map[string][]byte{cfg.CAFile: ca.CertPEM(), cfg.CertFile: cert, cfg.KeyFile: key} {
		if err := clustertls.WriteFile(path, data, 0o600); err != nil {
			b.Fatal(err)
		}
	}
	return clusterport.NewCluster(cfg)
}
