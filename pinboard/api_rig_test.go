package pinboard

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testdir"
	"github.com/pinnedd/pinnedd/internal/testutil"
	"github.com/pinnedd/pinnedd/pinboard/directory"
	"github.com/prometheus/client_golang/prometheus"
)

// doorRig is the API on a real directory (committed in process) and a
// real HTTP server, as a front door mounts it, with the token "op-token"
// for every scope.
type doorRig struct {
	api  *API
	gate *OwnerGate
	srv  *httptest.Server
	dir  *Directory
	m    *directory.Machine
	reg  *prometheus.Registry
	logs *testutil.SyncBuffer
}

// advertisePeers reaches other nodes at their advertise URLs, as a front
// door of an insecure cluster does.
type advertisePeers struct{}

func (advertisePeers) Base(w directory.Worker) string { return strings.TrimRight(w.AdvertiseURL, "/") }
func (advertisePeers) Client() *http.Client           { return http.DefaultClient }
func (advertisePeers) Secure() bool                   { return false }

// newDoorRig builds the rig; adjust may change the config first (the
// server already listens at rig.srv.URL).
func newDoorRig(t *testing.T, adjust func(*doorRig, *APIConfig)) *doorRig {
	t.Helper()
	m := directory.New()
	testdir.Apply(m, 1, directory.Init{Secret: []byte("0123456789abcdef0123456789abcdef")})
	dir := NewDirectory(m, &testdir.Applier{M: m, Index: 1})
	t.Cleanup(dir.Close)
	rig := &doorRig{dir: dir, m: m, reg: prometheus.NewRegistry(), logs: &testutil.SyncBuffer{}}
	mux := http.NewServeMux()
	rig.srv = httptest.NewServer(mux)
	t.Cleanup(rig.srv.Close)
	cfg := APIConfig{
		Dir: dir, Tokens: NewTokens("op-token"), Registerer: rig.reg, Peers: advertisePeers{},
		Logger: slog.New(slog.NewTextHandler(rig.logs, nil)),
	}
	if adjust != nil {
		adjust(rig, &cfg)
	}
	if cfg.Self == nil {
		cfg.Self = NewSelf(dir, nil)
	}
	if cfg.Gate == nil {
		cfg.Gate = NewOwnerGate(cfg.Self, 0)
	}
	rig.gate = cfg.Gate
	rig.api = NewAPI(cfg)
	rig.api.Mount(mux)
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

// sessionRig is the API with a worker registered through the registry
// (challenge probe included).
func sessionRig(t *testing.T) (*doorRig, *Worker) {
	t.Helper()
	var w *Worker
	rig := newDoorRig(t, func(rig *doorRig, c *APIConfig) {
		c.Registry = NewRegistry(c.Dir, time.Hour)
		w = NewWorker(WorkerConfig{
			NodeID: "n1", AdvertiseURL: rig.srv.URL, Namespaces: []string{"/misc"}, TTL: time.Hour, Logger: c.Logger,
		}, c.Registry)
		c.Self = NewSelf(c.Dir, w)
	})
	if err := w.register(t.Context()); err != nil {
		t.Fatal(err)
	}
	return rig, w
}
