package supervisor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/pinnedd/pinnedd/internal/testutil"
	"github.com/pinnedd/pinnedd/plugins"
	"github.com/pinnedd/pinnedd/plugins/proto"
)

func TestPluginEnvAllowList(t *testing.T) {
	parent := []string{"PATH=/bin", "HOME=/h", "LANG=C", "LC_ALL=C.UTF-8", "TZ=UTC", "TMPDIR=/t",
		"PINBOARD_TOKEN=secret", "PINBOARD_PASSPORT={}", "DATABASE_URL=postgres://x", "AWS_SECRET_ACCESS_KEY=k",
		"PINNEDD_CLUSTER_CALL_TOKEN=old", "NOTIFY_SOCKET=/run/notify", "LCX=1"}
	spec := []string{"OPERATOR_SET=1", "PINBOARD_TOKEN=again", "DATABASE_URL=postgres://y", "PINNEDD_CLUSTER_CALL_TOKEN=t", "PINNEDD_URL=http://fd"}
	env, dropped := pluginEnv(parent, spec, []string{"PINNEDD_DATA_SOCKET=/s"})
	want := []string{"PATH=/bin", "HOME=/h", "LANG=C", "LC_ALL=C.UTF-8", "TZ=UTC", "TMPDIR=/t",
		"OPERATOR_SET=1", "PINNEDD_URL=http://fd", "PINNEDD_DATA_SOCKET=/s"}
	if !slices.Equal(env, want) {
		t.Errorf("env = %q\nwant  %q", env, want)
	}
	if want := []string{"PINBOARD_TOKEN", "DATABASE_URL", "PINNEDD_CLUSTER_CALL_TOKEN"}; !slices.Equal(dropped, want) {
		t.Errorf("dropped = %q, want %q", dropped, want)
	}
}

func TestParsePluginEnv(t *testing.T) {
	for in, want := range map[string]PluginEnvSetting{
		"GOMAXPROCS":            {Key: "GOMAXPROCS", Pass: true},
		"CHAT_WORD_DELAY=5ms":   {Key: "CHAT_WORD_DELAY", Value: "5ms"},
		"EMPTY=":                {Key: "EMPTY"},
		"/threads=OPENAI_KEY":   {Namespace: "/threads", Key: "OPENAI_KEY", Pass: true},
		"/threads=MODE=a=b":     {Namespace: "/threads", Key: "MODE", Value: "a=b"},
		"/threads=_X1=with sp ": {Namespace: "/threads", Key: "_X1", Value: "with sp "},
	} {
		got, err := ParsePluginEnv(in)
		if err != nil || got != want {
			t.Errorf("ParsePluginEnv(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for in, why := range map[string]string{
		"PINBOARD_TOKEN":             "pinnedd's secrets never reach plugins",
		"/threads=PINBOARD_PASSPORT": "pinnedd's secrets never reach plugins",
		"DATABASE_URL=postgres://x":  "pinnedd's secrets never reach plugins",
		"PINNEDD_DATA_SOCKET=/tmp/x": "set by pinnedd itself",
		"PLUGIN_MIN_PORT=1":          "set by pinnedd itself",
		"NOTIFY_SOCKET":              "belongs to the pinnedd agent",
		"":                           "is not a variable name",
		"1X=2":                       "is not a variable name",
		"A-B=1":                      "is not a variable name",
		"/threads":                   "want /ns=KEY",
		"/Threads=X=1":               "invalid namespace",
	} {
		_, err := ParsePluginEnv(in)
		if !errors.Is(err, ErrPluginEnv) || !strings.Contains(err.Error(), why) {
			t.Errorf("ParsePluginEnv(%q) = %v, want ErrPluginEnv saying %q", in, err, why)
		}
	}
}

func TestApplyPluginEnv(t *testing.T) {
	specs := []Spec{{Name: "chat", Namespaces: []string{"/threads"}}, {Name: "counter", Namespaces: []string{"/counters"}}}
	var sets []PluginEnvSetting
	for _, s := range []string{"LOG_STYLE=plain", "/threads=API_KEY", "/counters=STEP=2", "UNSET_HERE"} {
		set, err := ParsePluginEnv(s)
		if err != nil {
			t.Fatal(err)
		}
		sets = append(sets, set)
	}
	lookup := func(k string) (string, bool) {
		v, ok := map[string]string{"API_KEY": "k1"}[k]
		return v, ok
	}
	if err := ApplyPluginEnv(specs, sets, lookup); err != nil {
		t.Fatal(err)
	}
	if got, want := specs[0].Env, []string{"LOG_STYLE=plain", "API_KEY=k1"}; !slices.Equal(got, want) {
		t.Errorf("chat env = %q, want %q", got, want)
	}
	if got, want := specs[1].Env, []string{"LOG_STYLE=plain", "STEP=2"}; !slices.Equal(got, want) {
		t.Errorf("counter env = %q, want %q", got, want)
	}
	set, _ := ParsePluginEnv("/jobs=X=1")
	if err := ApplyPluginEnv(specs, []PluginEnvSetting{set}, lookup); !errors.Is(err, ErrPluginEnv) || !strings.Contains(err.Error(), "no plugin serves /jobs") {
		t.Errorf("a namespace no plugin serves: %v", err)
	}
}

// startPrivileged runs testhost twice, as plugin "p" serving /misc and
// plugin "q" serving /tally, with fdURL as the node's front door.
func startPrivileged(t *testing.T, fdURL string, env []string) (*Supervisor, *httptest.Server) {
	t.Helper()
	bin := testutil.Bin(t, "testhost")
	return serveSupervisor(t, Config{
		Specs: []Spec{
			{Name: "p", Path: bin, Namespaces: []string{"/misc"}, Env: env},
			{Name: "q", Path: bin, Namespaces: []string{"/tally"}},
		},
		FrontDoorURL: fdURL,
		BackoffMin:   10 * time.Millisecond,
	})
}

func current(t *testing.T, s *Supervisor, name string) *incarnation {
	t.Helper()
	for _, p := range s.plugins().procs {
		if p.spec.Name == name {
			inc, err := p.current()
			if err != nil {
				t.Fatalf("plugin %s: %v", name, err)
			}
			return inc
		}
	}
	t.Fatalf("no plugin %s", name)
	return nil
}

// A plugin process's environment holds the allow-list, the operator's
// settings and pinnedd's own variables: none of pinnedd's secrets, and
// neither of its per-process secrets (they come over the control channel).
func TestPluginProcessEnvironment(t *testing.T) {
	t.Setenv("PINBOARD_TOKEN", "pinboard-token-that-must-not-leak-0123456789")
	t.Setenv("DATABASE_URL", "postgres://must-not-leak@127.0.0.1/x")
	t.Setenv("UNRELATED_SECRET", "must-not-leak-either")
	t.Setenv("TZ", "UTC")
	s, _ := startPrivileged(t, "http://127.0.0.1:1", []string{"OPERATOR_SET=yes", "PINBOARD_TOKEN=via-spec"})
	inc := current(t, s, "p")
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", inc.pid))
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for _, kv := range strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00") {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	for _, k := range []string{"PINBOARD_TOKEN", "DATABASE_URL", "UNRELATED_SECRET", plugins.EnvClusterCallToken} {
		if v, ok := env[k]; ok {
			t.Errorf("plugin environment has %s=%s", k, v)
		}
	}
	for k, v := range env {
		if v == inc.socketSecret || v == inc.callToken || strings.Contains(v, "must-not-leak") {
			t.Errorf("plugin environment carries a secret in %s", k)
		}
	}
	for k, want := range map[string]string{"OPERATOR_SET": "yes", "TZ": "UTC", "PATH": os.Getenv("PATH"),
		plugins.EnvFrontDoor: "http://127.0.0.1:1", plugins.Handshake.MagicCookieKey: plugins.Handshake.MagicCookieValue} {
		if env[k] != want {
			t.Errorf("plugin environment: %s=%q, want %q", k, env[k], want)
		}
	}
}

// A process that writes to a plugin's data socket itself, without the
// process's secret, is refused and runs nothing; pinnedd's own requests
// carry the secret, and instance code never sees it.
func TestDataSocketNeedsSecret(t *testing.T) {
	s, srv := startPrivileged(t, "", nil)
	ctx := context.Background()
	if r, err := testutil.Do(ctx, "POST", srv.URL+"/tally/a/inc", "", nil); err != nil || r.Body != `{"value":1}` {
		t.Fatalf("increment through pinnedd: %v %+v", err, r)
	}
	inc := current(t, s, "q")
	raw := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", inc.socket)
	}}}
	defer raw.CloseIdleConnections()
	for name, secret := range map[string]string{"none": "", "wrong": strings.Repeat("0", len(inc.socketSecret)), "another process's": current(t, s, "p").socketSecret} {
		req, _ := http.NewRequest("POST", "http://plugin/inc", nil)
		req.Header.Set(plugins.HeaderNamespace, "/tally")
		req.Header.Set(plugins.HeaderID, "a")
		if secret != "" {
			req.Header.Set(plugins.HeaderSocketSecret, secret)
		}
		resp, err := raw.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden || !bytes.Contains(body, []byte(plugins.HeaderSocketSecret)) {
			t.Errorf("raw write with %s secret: %d %s, want 403 naming %s", name, resp.StatusCode, body, plugins.HeaderSocketSecret)
		}
	}
	if r, err := testutil.Do(ctx, "GET", srv.URL+"/tally/a/value", "", nil); err != nil || r.Body != `{"value":1}` {
		t.Errorf("after the raw writes: %v %+v, want the count unchanged at 1", err, r)
	}
	// The echo host answers with the headers it saw.
	r, err := testutil.Do(ctx, "GET", srv.URL+"/misc/e/echo", "", map[string]string{plugins.HeaderSocketSecret: "client-sent"})
	if err != nil || r.Code != 200 {
		t.Fatalf("echo: %v %+v", err, r)
	}
	if strings.Contains(r.Body, "Socket-Secret") || strings.Contains(r.Body, current(t, s, "p").socketSecret) {
		t.Errorf("instance code saw the socket secret: %s", r.Body)
	}
}

// Each process's cluster-call credential reaches its instance code over
// the control channel, speaks for that process's namespaces only, and dies
// with the process.
func TestClusterCallCredential(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	fd := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get(plugins.HeaderClusterCall))
		mu.Unlock()
		fmt.Fprint(w, "ok")
	}))
	defer fd.Close()
	s, srv := startPrivileged(t, fd.URL, nil)
	call := func() (ns, token string) {
		t.Helper()
		r, err := testutil.Do(context.Background(), "GET", srv.URL+"/misc/c/call?target=/tally/x/inc", "", nil)
		if err != nil || r.Code != 200 {
			t.Fatalf("cluster call: %v %+v", err, r)
		}
		mu.Lock()
		v := seen[len(seen)-1]
		mu.Unlock()
		ns, token, err = plugins.ParseClusterCall(v)
		if err != nil {
			t.Fatalf("%s %q: %v", plugins.HeaderClusterCall, v, err)
		}
		return ns, token
	}
	ns, token := call()
	if ns != "/misc" {
		t.Errorf("cluster call names namespace %s, want /misc", ns)
	}
	if _, got, ok := s.VerifyClusterCall(token); !ok || !slices.Equal(got, []string{"/misc"}) {
		t.Errorf("VerifyClusterCall(p's credential) = %q, %v; want [/misc] (not q's /tally)", got, ok)
	}
	q := current(t, s, "q")
	if _, got, ok := s.VerifyClusterCall(q.callToken); !ok || !slices.Equal(got, []string{"/tally"}) {
		t.Errorf("VerifyClusterCall(q's credential) = %q, %v; want [/tally]", got, ok)
	}
	for _, bad := range []string{"", "nope", q.socketSecret, token[:len(token)-1]} {
		if _, got, ok := s.VerifyClusterCall(bad); ok {
			t.Errorf("VerifyClusterCall(%q) = %q, accepted", bad, got)
		}
	}

	// The process dies: its credential with it; the next one has its own.
	old := current(t, s, "p")
	_, _ = testutil.Do(context.Background(), "GET", srv.URL+"/misc/c/crash", "", nil)
	testutil.WaitFor(t, 10*time.Second, "plugin p restarted", func() bool {
		inc, err := s.plugins().procs[0].current()
		return err == nil && inc != old
	})
	if _, got, ok := s.VerifyClusterCall(token); ok {
		t.Errorf("a dead process's credential still verifies: %q", got)
	}
	s.calls.mu.RLock()
	held := len(s.calls.m)
	s.calls.mu.RUnlock()
	if held != 2 {
		t.Errorf("%d credentials held for 2 live processes", held)
	}
	_, token2 := call()
	if token2 == token {
		t.Error("the new process got the same credential")
	}
	if _, _, ok := s.VerifyClusterCall(token2); !ok {
		t.Error("the new process's credential does not verify")
	}
}

// go-plugin's control socket lies beside the data socket, reachable by
// any process of pinnedd's user: without pinnedd's client certificate a
// process can neither call Describe there (to swap in a socket secret of
// its own) nor anything else.
func TestControlSocketNeedsPinneddCertificate(t *testing.T) {
	s, srv := startPrivileged(t, "", nil)
	entries, err := os.ReadDir(s.runtimeDir)
	if err != nil {
		t.Fatal(err)
	}
	var control []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "plugin") {
			control = append(control, filepath.Join(s.runtimeDir, e.Name()))
		}
	}
	if len(control) == 0 {
		t.Fatalf("no go-plugin sockets in %s: %v", s.runtimeDir, entries)
	}
	for _, path := range control {
		conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err = proto.NewControlClient(conn).Describe(ctx, &proto.DescribeRequest{SocketSecret: "mine"})
		cancel()
		conn.Close()
		if err == nil {
			t.Errorf("Describe on %s without pinnedd's certificate succeeded", path)
		}
	}
	// Nothing changed: pinnedd's own requests still get through.
	if r, err := testutil.Do(context.Background(), "POST", srv.URL+"/tally/a/inc", "", nil); err != nil || r.Body != `{"value":1}` {
		t.Errorf("increment through pinnedd: %v %+v", err, r)
	}
}

// ensureUser returns the account name, creating it when missing.
func ensureUser(t *testing.T, name string) *User {
	t.Helper()
	testutil.EnsureUser(t, name)
	u, err := LookupUser(name)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// asUser runs a command as u, with its groups, and returns its output.
func asUser(u *User, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: u.Groups}}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// procIDs reads a process's Uid, Gid and Groups lines from
// /proc/<pid>/status.
func procIDs(t *testing.T, pid int) (uid, gid, groups string) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(line, ":")
		switch k {
		case "Uid":
			uid = strings.Join(strings.Fields(v), " ")
		case "Gid":
			gid = strings.Join(strings.Fields(v), " ")
		case "Groups":
			groups = strings.Join(strings.Fields(v), " ")
		}
	}
	return uid, gid, groups
}

func ids(n uint32, times int) string {
	return strings.TrimSpace(strings.Repeat(fmt.Sprint(n)+" ", times))
}

// Two plugins, each run as a user of its own: each process has its user's
// uid, gid and groups, HOME and a TMPDIR of its own; its sockets are in a
// directory only its user (and pinnedd) can enter; pinnedd still reaches
// both (handshake over mutual TLS, data socket), and the other plugin's
// user can neither list that directory nor connect to its data socket.
func TestPluginRunsAsItsUser(t *testing.T) {
	a, b := ensureUser(t, "pinnedd-test-a"), ensureUser(t, "pinnedd-test-b")
	bin := testutil.Bin(t, "testhost")
	// A runtime dir others can pass through, as systemd's /run/pinnedd.
	parent, err := os.MkdirTemp("", "pinnedd-rt-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(parent) })
	if err := os.Chmod(parent, 0o755); err != nil {
		t.Fatal(err)
	}
	runtimeDir := filepath.Join(parent, "run")
	s, srv := serveSupervisor(t, Config{
		Specs: []Spec{
			{Name: "p", Path: bin, Namespaces: []string{"/misc"}, User: a},
			{Name: "q", Path: bin, Namespaces: []string{"/tally"}, User: b},
		},
		RuntimeDir: runtimeDir,
	})

	if s.runtimeDir != runtimeDir {
		t.Fatalf("sockets in %s, want the runtime dir %s (reachable by the plugin users)", s.runtimeDir, runtimeDir)
	}
	if st, err := os.Stat(runtimeDir); err != nil || st.Mode().Perm() != 0o711 {
		t.Fatalf("runtime dir: %v %v, want mode 0711", st.Mode(), err)
	}
	for _, c := range []struct {
		name string
		u    *User
	}{{"p", a}, {"q", b}} {
		inc := current(t, s, c.name)
		uid, gid, groups := procIDs(t, inc.pid)
		if uid != ids(c.u.UID, 4) || gid != ids(c.u.GID, 4) {
			t.Errorf("plugin %s runs as Uid %q Gid %q, want %s's %d/%d", c.name, uid, gid, c.u.Name, c.u.UID, c.u.GID)
		}
		var want []string
		for _, g := range c.u.Groups {
			want = append(want, fmt.Sprint(g))
		}
		if groups != strings.Join(want, " ") {
			t.Errorf("plugin %s has Groups %q, want %q", c.name, groups, want)
		}
		dir := filepath.Join(runtimeDir, c.name)
		st, err := os.Stat(dir)
		if err != nil {
			t.Fatal(err)
		}
		if sys := st.Sys().(*syscall.Stat_t); sys.Uid != c.u.UID || st.Mode().Perm() != 0o700 {
			t.Errorf("%s: owner %d mode %v, want %s's, 0700", dir, sys.Uid, st.Mode().Perm(), c.u.Name)
		}
		if filepath.Dir(inc.socket) != dir {
			t.Errorf("plugin %s's data socket %s is not in its directory %s", c.name, inc.socket, dir)
		}
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", inc.pid))
		if err != nil {
			t.Fatal(err)
		}
		env := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
		for _, kv := range []string{"HOME=" + c.u.Home, "TMPDIR=" + dir} {
			if !slices.Contains(env, kv) {
				t.Errorf("plugin %s environment lacks %s: %q", c.name, kv, env)
			}
		}
	}
	if r, err := testutil.Do(context.Background(), "POST", srv.URL+"/tally/x/inc", "", nil); err != nil || r.Body != `{"value":1}` {
		t.Errorf("increment through pinnedd: %v %+v", err, r)
	}

	// b's user, q's, cannot look into p's directory nor use its socket.
	p := current(t, s, "p")
	if out, err := asUser(b, "ls", filepath.Dir(p.socket)); err == nil || !strings.Contains(out, "Permission denied") {
		t.Errorf("%s lists p's socket directory: %v %s", b.Name, err, out)
	}
	if out, err := asUser(b, "test", "-e", p.socket); err == nil {
		t.Errorf("%s reaches p's data socket %s: %s", b.Name, p.socket, out)
	}
	// a's user itself can.
	if out, err := asUser(a, "test", "-S", p.socket); err != nil {
		t.Errorf("%s cannot reach its own data socket: %v %s", a.Name, err, out)
	}
	// But not the plugin's secrets: the SDK makes the process
	// non-dumpable, so not even its own user reads its environment (the
	// data socket's secret, the cluster-call credential) or memory.
	for _, f := range []string{"environ", "mem"} {
		if out, err := asUser(a, "head", "-c", "1", fmt.Sprintf("/proc/%d/%s", p.pid, f)); err == nil {
			t.Errorf("%s reads its plugin's /proc/%d/%s: the process is dumpable", a.Name, p.pid, f)
		} else if !strings.Contains(out, "Permission denied") {
			t.Errorf("reading the plugin's %s as %s: %v %s", f, a.Name, err, out)
		}
	}

	// A crash: the next process runs as the same user, in the same
	// directory, and serves.
	_, _ = testutil.Do(context.Background(), "GET", srv.URL+"/misc/c/crash", "", nil)
	testutil.WaitFor(t, 10*time.Second, "plugin p restarted", func() bool {
		inc, err := s.plugins().procs[0].current()
		return err == nil && inc != p
	})
	next := current(t, s, "p")
	if uid, _, _ := procIDs(t, next.pid); uid != ids(a.UID, 4) || filepath.Dir(next.socket) != filepath.Dir(p.socket) {
		t.Errorf("restarted plugin p: Uid %q, socket %s; want %s's uid, in %s", uid, next.socket, a.Name, filepath.Dir(p.socket))
	}
	if r, err := testutil.Do(context.Background(), "GET", srv.URL+"/misc/c/pid", "", nil); err != nil || r.Body != fmt.Sprint(next.pid) {
		t.Errorf("restarted plugin p does not serve: %v %+v, want its pid %d", err, r, next.pid)
	}
}

// Plugin users are refused when they would hold root's power, are unknown,
// or do not fit the plugins.
func TestPluginUserRefusals(t *testing.T) {
	a, b := ensureUser(t, "pinnedd-test-a"), ensureUser(t, "pinnedd-test-b")
	for in, why := range map[string]string{
		"root":                   "it is root (uid 0)",
		"pinnedd-no-such-user-1": "unknown user",
		"/misc=root":             "it is root (uid 0)",
		"/misc=":                 "want NAME or /ns=NAME",
		"/Misc=pinnedd-test-a":   "invalid namespace",
	} {
		_, err := ParsePluginUser(in)
		if !errors.Is(err, ErrPluginUser) || !strings.Contains(err.Error(), why) {
			t.Errorf("ParsePluginUser(%q) = %v, want ErrPluginUser saying %q", in, err, why)
		}
	}
	specs := func() []Spec {
		return []Spec{{Name: "p", Namespaces: []string{"/misc", "/more"}}, {Name: "q", Namespaces: []string{"/tally"}}}
	}
	sp := specs()
	if err := ApplyPluginUsers(sp, []PluginUserSetting{{User: a}, {Namespace: "/tally", User: b}}); err != nil {
		t.Fatal(err)
	}
	if sp[0].User != a || sp[1].User != b {
		t.Errorf("users: p %v, q %v; want the default for p, /tally's for q", sp[0].User, sp[1].User)
	}
	for why, sets := range map[string][]PluginUserSetting{
		"cannot run as both":        {{Namespace: "/misc", User: a}, {Namespace: "/more", User: b}},
		"two users for /tally":      {{Namespace: "/tally", User: a}, {Namespace: "/tally", User: b}},
		"two default users":         {{User: a}, {User: b}},
		"no plugin serves /nothere": {{Namespace: "/nothere", User: a}},
	} {
		if err := ApplyPluginUsers(specs(), sets); !errors.Is(err, ErrPluginUser) || !strings.Contains(err.Error(), why) {
			t.Errorf("%v: %v, want ErrPluginUser saying %q", sets, err, why)
		}
	}
}

// As root with no default of the operator's, plugins run as pinnedd-plugin
// when the machine has it, else as nobody; an operator's default, or
// pinnedd not being root, leaves the settings as they are. A
// pinnedd-plugin that is refused does not fall back to nobody.
func TestDefaultPluginUser(t *testing.T) {
	lookupOf := func(accounts map[string]*User) func(string) (*User, error) {
		return func(name string) (*User, error) {
			u, ok := accounts[name]
			if !ok {
				return nil, fmt.Errorf("%w %q: %w", ErrPluginUser, name, user.UnknownUserError(name))
			}
			if u.UID == 0 {
				return nil, fmt.Errorf("%w %q: it is root (uid 0)", ErrPluginUser, name)
			}
			c := *u
			return &c, nil
		}
	}
	own := &User{Name: DefaultPluginUserName, UID: 990, GID: 990}
	nobody := &User{Name: SharedPluginUserName, UID: 65534, GID: 65534}
	ns := PluginUserSetting{Namespace: "/tally", User: &User{Name: "t", UID: 1001}}
	for _, c := range []struct {
		name     string
		euid     int
		settings []PluginUserSetting
		accounts map[string]*User
		want     string // the added default's name; "" none added
		err      string
	}{
		{"root, pinnedd-plugin", 0, nil, map[string]*User{DefaultPluginUserName: own, SharedPluginUserName: nobody}, DefaultPluginUserName, ""},
		{"root, only nobody", 0, nil, map[string]*User{SharedPluginUserName: nobody}, SharedPluginUserName, ""},
		{"root, a namespace's setting only", 0, []PluginUserSetting{ns}, map[string]*User{SharedPluginUserName: nobody}, SharedPluginUserName, ""},
		{"root, the operator's default", 0, []PluginUserSetting{{User: &User{Name: "op", UID: 1002}}}, map[string]*User{DefaultPluginUserName: own}, "", ""},
		{"not root", 1000, nil, map[string]*User{DefaultPluginUserName: own}, "", ""},
		{"pinnedd-plugin refused", 0, nil, map[string]*User{DefaultPluginUserName: {Name: DefaultPluginUserName}, SharedPluginUserName: nobody}, "", "it is root (uid 0)"},
		{"no account", 0, nil, map[string]*User{}, "", "no account for plugins"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := withDefaultPluginUser(c.settings, c.euid, lookupOf(c.accounts))
			if c.err != "" {
				if !errors.Is(err, ErrPluginUser) || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err %v, want ErrPluginUser saying %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.want == "" {
				if !slices.Equal(got, c.settings) {
					t.Fatalf("settings %v, want them unchanged", got)
				}
				return
			}
			if len(got) != len(c.settings)+1 {
				t.Fatalf("settings %v, want one added", got)
			}
			def := got[len(got)-1]
			if def.Namespace != "" || def.User.Name != c.want || !def.User.Default {
				t.Fatalf("added %+v (user %+v), want %s as the default", def, def.User, c.want)
			}
		})
	}
	// The default goes where the operator's would: to the plugins no
	// setting names.
	specs := []Spec{{Name: "p", Namespaces: []string{"/misc"}}, {Name: "q", Namespaces: []string{"/tally"}}}
	sets, err := withDefaultPluginUser([]PluginUserSetting{ns}, 0, lookupOf(map[string]*User{DefaultPluginUserName: own}))
	if err != nil {
		t.Fatal(err)
	}
	if err := ApplyPluginUsers(specs, sets); err != nil {
		t.Fatal(err)
	}
	if specs[0].User.Name != DefaultPluginUserName || specs[1].User != ns.User {
		t.Errorf("users: p %v, q %v; want the default for p, /tally's for q", specs[0].User, specs[1].User)
	}
}

// CheckExecutable asks the kernel for the plugin's account: a binary in a
// directory closed to it, or not executable by it, is refused, naming the
// binary, the account and what to do; one it can run passes. Afterwards no
// thread of pinnedd has the account's file-system uid (the check's thread
// puts root's back before it ends, or parks if it is the main thread).
// New refuses such a spec.
func TestCheckExecutable(t *testing.T) {
	u := ensureUser(t, "pinnedd-test-a")
	src, err := os.ReadFile(testutil.Bin(t, "testhost"))
	if err != nil {
		t.Fatal(err)
	}
	shared := testutil.SharedDir(t)
	closed := filepath.Join(shared, "closed")
	if err := os.Mkdir(closed, 0o700); err != nil {
		t.Fatal(err)
	}
	write := func(path string, mode os.FileMode) string {
		if err := os.WriteFile(path, src, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		return path
	}
	ok := write(filepath.Join(shared, "ok"), 0o755)
	for _, c := range []struct {
		path string
		why  string
	}{
		{write(filepath.Join(closed, "testhost"), 0o755), "permission denied"},
		{write(filepath.Join(shared, "owner-only"), 0o700), "permission denied"},
		{filepath.Join(shared, "missing"), "no such file"},
	} {
		sp := Spec{Name: "p", Path: c.path, User: u}
		err := sp.CheckExecutable()
		if !errors.Is(err, ErrPluginBinary) {
			t.Errorf("%s: %v, want ErrPluginBinary", c.path, err)
			continue
		}
		for _, want := range []string{c.path, u.Name, c.why, "executable by that account", "--plugin-user"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s: %q does not say %q", c.path, err, want)
			}
		}
	}
	if err := (&Spec{Name: "p", Path: ok, User: u}).CheckExecutable(); err != nil {
		t.Errorf("a binary %s can run: %v", u.Name, err)
	}
	def := *u
	def.Default = true
	if err := (&Spec{Name: "p", Path: filepath.Join(closed, "testhost"), User: &def}).CheckExecutable(); err == nil || !strings.Contains(err.Error(), "default account") {
		t.Errorf("pinnedd's default account: %v, want the error to say it is the default", err)
	}
	if err := (&Spec{Name: "p", Path: filepath.Join(closed, "testhost")}).CheckExecutable(); err != nil {
		t.Errorf("a plugin without a user (pinnedd's own): %v, want no check", err)
	}
	testutil.WaitForErr(t, 5*time.Second, "every thread back to root's file-system uid", func() error {
		tasks, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return err
		}
		for _, task := range tasks {
			b, err := os.ReadFile(filepath.Join("/proc/self/task", task.Name(), "status"))
			if err != nil {
				continue // gone
			}
			for _, line := range strings.Split(string(b), "\n") {
				if v, ok := strings.CutPrefix(line, "Uid:"); ok && strings.Fields(v)[3] != "0" {
					return fmt.Errorf("thread %s of %d: Uid:%s", task.Name(), os.Getpid(), v)
				}
			}
		}
		return nil
	})
	_, err = New(Config{Specs: []Spec{{Name: "p", Path: filepath.Join(closed, "testhost"), User: u}}})
	if !errors.Is(err, ErrPluginBinary) {
		t.Errorf("New with a binary its user cannot run: %v, want ErrPluginBinary", err)
	}
}

// Checking at run time that a plugin's account can run its binary (a
// plugin added, or one whose start failed) must leave every thread alive:
// a plugin process gets its death signal when the thread that forked it
// ends, so a check that ended its thread killed whichever plugin had been
// started on it.
func TestCheckExecutableLeavesPluginsRunning(t *testing.T) {
	u := ensureUser(t, "pinnedd-test-a")
	bin := testutil.Bin(t, "testhost")
	var specs []Spec
	for i, ns := range []string{"/misc", "/tally", "/jobs", "/keep"} {
		specs = append(specs, Spec{Name: fmt.Sprint("p", i), Path: bin, Namespaces: []string{ns}, User: u})
	}
	s, _ := serveSupervisor(t, Config{Specs: specs})
	check := Spec{Name: "q", Path: bin, User: u}
	for range 300 {
		if err := check.CheckExecutable(); err != nil {
			t.Fatal(err)
		}
	}
	// A death signal is sent as the thread ends, after the check answered:
	// one more round of checks has each earlier one's thread gone or back.
	for range 20 {
		if err := check.CheckExecutable(); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range s.Plugins() {
		if p.Restarts != 0 || p.Incarnation != 1 || !testutil.Alive(p.PID) {
			t.Errorf("plugin %s died under the checks: %+v", p.Name, p)
		}
	}
}
