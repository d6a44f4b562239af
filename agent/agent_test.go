package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/datadir"
	"github.com/pinnedd/pinnedd/internal/testutil"
	"github.com/pinnedd/pinnedd/supervisor"
)

const testToken = "agent-test-token-0123456789abcdef0123456789"

// shutdownOrder is every step Stop can take, in the order it takes them.
var shutdownOrder = []string{
	"tell systemd the node is stopping",
	"refuse new activations",
	"drain instances",
	"refuse new requests",
	"stop instances and plugins",
	"stop background work",
	"deregister the worker",
	"leave Raft",
	"stop the front door",
	"close the directory",
	"close Raft",
	"close the state store",
	"release the data dir",
	"remove the dev data dir",
}

// noHostsConfig is a one-node cluster without hosts (a pure front door and
// Raft member) on ports the kernel picks, logging JSON at debug to logs.
func noHostsConfig(t *testing.T, logs io.Writer) Config {
	t.Helper()
	return Config{
		Version: "test", NoHosts: true, NodeID: "n1", HTTPAddr: "127.0.0.1:0", RaftAddr: "127.0.0.1:0",
		DataDir: t.TempDir(), Tokens: []string{testToken}, Bootstrap: true, MaxVoters: 3,
		RaftTimeout: 300 * time.Millisecond, DrainDeadline: time.Second, LeaseTTL: 15 * time.Second, Heartbeat: time.Second,
		Logger: slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
}

// stepsLogged lists the shutdown steps logs shows, in order.
func stepsLogged(t *testing.T, logs string) []string {
	t.Helper()
	var steps []string
	sc := bufio.NewScanner(strings.NewReader(logs))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var line struct{ Msg, Step string }
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("log line %q: %v", sc.Text(), err)
		}
		if line.Msg == "shutdown step" {
			steps = append(steps, line.Step)
		}
	}
	return steps
}

// inOrder checks that got is want with some steps left out.
func inOrder(t *testing.T, got, want []string) {
	t.Helper()
	i := 0
	for _, s := range got {
		j := slices.Index(want[i:], s)
		if j < 0 {
			t.Fatalf("shutdown steps %q are not in the order %q", got, want)
		}
		i += j + 1
	}
}

// waitReady polls the node's /readyz until it answers 200.
func waitReady(t *testing.T, a *Agent) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get("http://" + a.ln.Addr().String() + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("node not ready after 20s (last: %v)", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// lockFree checks that nothing holds dir's data dir lock.
func lockFree(t *testing.T, dir string) {
	t.Helper()
	l, err := datadir.Acquire(dir)
	if err != nil {
		t.Fatalf("data dir still locked: %v", err)
	}
	_ = l.Release()
}

// A node serves once started; stopped, it takes exactly its built parts
// down in the documented order, closes its port and frees its data dir.
func TestStartServesAndStopTakesPartsDownInOrder(t *testing.T) {
	var logs testutil.SyncBuffer
	cfg := noHostsConfig(t, &logs)
	a, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	a.Start()
	waitReady(t, a)
	addr := a.ln.Addr().String()

	if err := a.Stop(Ending{DrainDeadline: cfg.DrainDeadline}); err != nil {
		t.Fatalf("a clean stop failed: %v", err)
	}
	want := []string{
		"tell systemd the node is stopping", "refuse new requests", "stop background work",
		"stop the front door", "close the directory", "close Raft", "release the data dir",
	}
	if got := stepsLogged(t, logs.String()); !slices.Equal(got, want) {
		t.Fatalf("a node without hosts stopped with steps %q, want %q", got, want)
	}
	inOrder(t, want, shutdownOrder)
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Fatalf("front door %s still accepts connections after Stop", addr)
	}
	lockFree(t, cfg.DataDir)
	if err := a.Stop(Ending{}); err != nil {
		t.Fatalf("a second Stop: %v", err)
	}
}

// A New that fails half way (Raft's address is taken) takes down what it
// had built, in Stop's order, and returns the part's error.
func TestNewCleansUpAfterAFailedPart(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	var logs testutil.SyncBuffer
	cfg := noHostsConfig(t, &logs)
	cfg.RaftAddr = taken.Addr().String()
	if _, err := New(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "open raft") {
		t.Fatalf("New with Raft's address taken: %v, want an open raft error", err)
	}
	want := []string{"stop the front door", "release the data dir"}
	if got := stepsLogged(t, logs.String()); !slices.Equal(got, want) {
		t.Fatalf("the failed New cleaned up with steps %q, want %q", got, want)
	}
	lockFree(t, cfg.DataDir)
	if strings.Contains(logs.String(), `"msg":"stopped"`) {
		t.Fatal("a node that never started logged that it stopped")
	}
}

// --dev without a data dir works in a temporary one and removes it on Stop.
func TestDevDataDirIsRemovedOnStop(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	var logs testutil.SyncBuffer
	cfg := noHostsConfig(t, &logs)
	cfg.Dev, cfg.DataDir = true, ""
	a, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Dir(a.devDir) != tmp || !strings.HasPrefix(filepath.Base(a.devDir), datadir.DevPrefix) {
		t.Fatalf("dev data dir %q, want %s* in %s", a.devDir, datadir.DevPrefix, tmp)
	}
	a.Start()
	waitReady(t, a)
	if err := a.Stop(Ending{}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(a.devDir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("dev data dir %s after Stop: %v", a.devDir, err)
	}
	if !strings.Contains(logs.String(), "DEV MODE") {
		t.Fatal("--dev did not log its warning")
	}
}

// POST /_pinned/leave ends Wait with a leave; Stop then takes the node out
// of the Raft cluster (the remaining member no longer lists it) before it
// closes Raft.
func TestLeaveRemovesTheNodeFromRaft(t *testing.T) {
	var logsA, logsB testutil.SyncBuffer
	a, err := New(context.Background(), noHostsConfig(t, &logsA))
	if err != nil {
		t.Fatal(err)
	}
	a.Start()
	defer a.Stop(Ending{})
	waitReady(t, a)

	cfgB := noHostsConfig(t, &logsB)
	cfgB.NodeID, cfgB.Bootstrap, cfgB.Join = "n2", false, a.advertise
	b, err := New(context.Background(), cfgB)
	if err != nil {
		t.Fatal(err)
	}
	b.Start()
	defer b.Stop(Ending{})
	waitReady(t, b)
	members := func() []string {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		ms, err := a.store.Members(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, m := range ms {
			ids = append(ids, m.ID)
		}
		slices.Sort(ids)
		return ids
	}
	if got := members(); !slices.Equal(got, []string{"n1", "n2"}) {
		t.Fatalf("members after the join: %v", got)
	}

	req, _ := http.NewRequest(http.MethodPost, b.advertise+"/_pinned/leave", strings.NewReader(`{"deadline": 0.5}`))
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("POST /_pinned/leave: %s", resp.Status)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e := b.Wait(ctx)
	if !e.Leave || e.DrainDeadline != 500*time.Millisecond || e.Err != nil {
		t.Fatalf("Wait after a leave request: %+v", e)
	}
	if err := b.Stop(e); err != nil {
		t.Fatalf("leaving: %v", err)
	}
	if got := members(); !slices.Equal(got, []string{"n1"}) {
		t.Fatalf("members after n2 left: %v", got)
	}
	steps := stepsLogged(t, logsB.String())
	if !slices.Contains(steps, "leave Raft") {
		t.Fatalf("a leaving node stopped with steps %q, none of them leave Raft", steps)
	}
	inOrder(t, steps, shutdownOrder)
}

// Every path the agent keeps is absolute from the start, against the
// working directory it started in: a plugin's socket under a relative data
// dir is dialed long after, by code that must not depend on it.
func TestConfigPathsMadeAbsolute(t *testing.T) {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{DataDir: "data/n1", TLSCA: "pki/ca.pem", TLSCert: "/etc/pinnedd/n1.pem", Specs: []supervisor.Spec{{Name: "c", Path: "bin/counter"}}}
	if err := cfg.absolute(); err != nil {
		t.Fatal(err)
	}
	for _, c := range [][2]string{
		{cfg.DataDir, filepath.Join(wd, "data/n1")}, {cfg.TLSCA, filepath.Join(wd, "pki/ca.pem")},
		{cfg.TLSCert, "/etc/pinnedd/n1.pem"}, {cfg.TLSKey, ""}, {cfg.Specs[0].Path, filepath.Join(wd, "bin/counter")},
	} {
		if c[0] != c[1] {
			t.Errorf("got %q, want %q", c[0], c[1])
		}
	}
}

// A plugin with no user of its own, or one whose user is pinnedd's, shares
// pinnedd's uid (the agent warns about those at start).
func TestSharedUserPlugins(t *testing.T) {
	specs := []supervisor.Spec{
		{Name: "own"}, {Name: "other", User: &supervisor.User{Name: "p", UID: 1001}}, {Name: "same", User: &supervisor.User{Name: "me", UID: 1000}},
	}
	if got := sharedUserPlugins(specs, 1000); !slices.Equal(got, []string{"own", "same"}) {
		t.Fatalf("shared with uid 1000: %v, want [own same]", got)
	}
	if got := sharedUserPlugins(specs[1:2], 1000); got != nil {
		t.Fatalf("a plugin with a user of its own: %v, want none", got)
	}
}

// A plugin run as nobody, pinnedd's fallback when the machine has no
// pinnedd-plugin, shares that account with whatever else runs as it (the
// agent warns about those at start).
func TestSharedAccountPlugins(t *testing.T) {
	specs := []supervisor.Spec{
		{Name: "own"}, {Name: "nobody", User: &supervisor.User{Name: supervisor.SharedPluginUserName, UID: 65534}},
		{Name: "plugin", User: &supervisor.User{Name: supervisor.DefaultPluginUserName, UID: 990}},
	}
	if got := sharedAccountPlugins(specs); !slices.Equal(got, []string{"nobody"}) {
		t.Fatalf("plugins run as nobody: %v, want [nobody]", got)
	}
}

// The advertise URL's scheme is the front door's: an http URL for a node
// that serves HTTPS (or the reverse) is refused at start, where other
// nodes would meet it only as failed probes and joins.
func TestAdvertiseURLMatchesTheFrontDoor(t *testing.T) {
	bound := &net.TCPAddr{IP: net.IPv4(10, 0, 0, 6), Port: 8080}
	for _, c := range []struct {
		flag, scheme, want string
		ok                 bool
	}{
		{"", "https", "https://10.0.0.6:8080", true},
		{"", "http", "http://10.0.0.6:8080", true},
		{"https://n2.example:8443/", "https", "https://n2.example:8443", true},
		{"http://10.0.0.6:8080", "https", "", false},
		{"https://10.0.0.6:8080", "http", "", false},
	} {
		got, err := advertiseURL(c.flag, c.scheme, bound)
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("advertiseURL(%q, %s) = %q, %v", c.flag, c.scheme, got, err)
		}
	}
}
