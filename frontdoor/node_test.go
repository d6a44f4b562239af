package frontdoor

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testdir"
	"github.com/pinnedd/pinnedd/internal/testsup"
	"github.com/pinnedd/pinnedd/internal/testutil"
	"github.com/pinnedd/pinnedd/pinboard"
	"github.com/pinnedd/pinnedd/pinboard/directory"
	"github.com/pinnedd/pinnedd/supervisor"
	"github.com/prometheus/client_golang/prometheus"
)

// nodeConfig is a test node's front door and control-plane API in one:
// Config, the worker and registry (the control plane's parts), and API
// for the API's hooks; newNode fills the API's parts from the rest.
type nodeConfig struct {
	Config
	Worker            *pinboard.Worker
	Registry          *pinboard.Registry
	AttestationWindow time.Duration
	API               pinboard.APIConfig
}

// newNode builds and wires a node's front door and API as the agent does.
func newNode(nc nodeConfig) *FrontDoor {
	cfg := nc.Config
	if cfg.Tokens == nil {
		cfg.Tokens = pinboard.NewTokens()
	}
	if cfg.Self == nil {
		cfg.Self = pinboard.NewSelf(cfg.Dir, nc.Worker)
	}
	if cfg.Gate == nil {
		cfg.Gate = pinboard.NewOwnerGate(cfg.Self, nc.AttestationWindow)
	}
	f := New(cfg)
	ac := nc.API
	ac.Dir, ac.Self, ac.Registry, ac.Tokens, ac.Gate = cfg.Dir, cfg.Self, nc.Registry, cfg.Tokens, cfg.Gate
	ac.Peers, ac.Stopping, ac.Logger, ac.Registerer, ac.Quarantine = f.Peers(), f.Stopping, cfg.Logger, cfg.Registerer, cfg.Quarantine
	if cfg.Local != nil {
		ac.Local = cfg.Local
	}
	ac.HTTPS = cfg.TLS != nil
	pinboard.NewAPI(ac).Mount(f)
	return f
}

// doorRig is a node's front door with the API mounted, on a real
// directory (committed in process) and a real HTTP server, with the token
// "op-token" for every scope.
type doorRig struct {
	f    *FrontDoor
	srv  *httptest.Server
	dir  *pinboard.Directory
	m    *directory.Machine
	reg  *prometheus.Registry
	logs *testutil.SyncBuffer
}

// newDoorRig builds the rig; adjust may change the config first (the
// server already listens at rig.srv.URL).
func newDoorRig(t *testing.T, adjust func(*doorRig, *nodeConfig)) *doorRig {
	t.Helper()
	m := directory.New()
	testdir.Apply(m, 1, directory.Init{Secret: []byte("0123456789abcdef0123456789abcdef")})
	dir := pinboard.NewDirectory(m, &testdir.Applier{M: m, Index: 1})
	t.Cleanup(dir.Close)
	rig := &doorRig{dir: dir, m: m, reg: prometheus.NewRegistry(), logs: &testutil.SyncBuffer{}}
	ready := make(chan struct{})
	rig.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-ready
		rig.f.ServeHTTP(w, r)
	}))
	cfg := nodeConfig{Config: Config{
		Dir: dir, Tokens: pinboard.NewTokens("op-token"), Registerer: rig.reg,
		Logger: slog.New(slog.NewTextHandler(rig.logs, nil)),
	}}
	if adjust != nil {
		adjust(rig, &cfg)
	}
	rig.f = newNode(cfg)
	close(ready)
	t.Cleanup(func() {
		rig.srv.Close()
		_ = rig.f.Close()
	})
	return rig
}

// register puts a worker serving namespaces into the directory
// (testdir.Register).
func (rig *doorRig) register(t *testing.T, clientID, nodeID string, ttl time.Duration, namespaces ...string) {
	t.Helper()
	testdir.Register(t, rig.dir, clientID, nodeID, ttl, namespaces...)
}

// call sends one request to the rig with token ("" for none).
func (rig *doorRig) call(t *testing.T, method, path, token, body string) (int, string, *http.Response) {
	t.Helper()
	return testutil.Call(t, method, rig.srv.URL, path, token, body)
}

// hostRig is a doorRig whose node hosts /misc: the testhost plugin under a
// real supervisor and a worker registered through the registry (challenge
// probe included), its lease renewed until the test ends, wired for drains
// as the agent wires them.
func hostRig(t *testing.T) (*doorRig, *pinboard.Worker) {
	t.Helper()
	sup := testsup.Start(t)
	var w *pinboard.Worker
	rig := newDoorRig(t, func(rig *doorRig, c *nodeConfig) {
		c.Local = sup
		c.Registry = pinboard.NewRegistry(c.Dir, time.Hour)
		w = pinboard.NewWorker(pinboard.WorkerConfig{
			NodeID: "n1", AdvertiseURL: rig.srv.URL, Namespaces: []string{"/misc"}, TTL: time.Hour, Logger: c.Logger,
			Draining: func() bool { return sup.DrainingBy(supervisor.DrainLocal) },
			OnOperatorDrain: func(active bool, deadline time.Time, cordon bool) {
				if !active {
					deadline, cordon = time.Time{}, false
				}
				sup.SetDrain(supervisor.DrainOperator, deadline, cordon)
			},
		}, c.Registry)
		c.Worker = w
		c.API.Drain = func(deadline time.Time, cordon bool) { sup.SetDrain(supervisor.DrainLocal, deadline, cordon) }
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	testutil.WaitFor(t, 10*time.Second, "the worker's registration", func() bool { return w.SessionID() != "" })
	return rig, w
}
