package sdk_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/pinnedd/pinnedd/plugins"
	"github.com/pinnedd/pinnedd/plugins/proto"
	"github.com/pinnedd/pinnedd/plugins/sdk"
)

// The data socket serves only requests carrying the secret pinnedd gave in
// Describe: before Describe nothing, after it only the right secret; a
// refused request runs nothing, and the instance never sees the secret.
func TestDataSocketSecret(t *testing.T) {
	var ran atomic.Int32
	var sawSecret atomic.Bool
	rt, err := sdk.NewRuntime(map[string]sdk.Host{"/things": {New: func(*sdk.Instance) (http.Handler, error) {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ran.Add(1)
			sawSecret.Store(r.Header.Get(plugins.HeaderSocketSecret) != "")
			_, _ = io.WriteString(w, "ran")
		}), nil
	}}}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "data.sock")
	if err := rt.ListenUnix(sock); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rt.Close)
	ctx := context.Background()
	if _, err := rt.Activate(ctx, &proto.ActivateRequest{Namespace: "/things", Id: "a", Generation: 1}); err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
	t.Cleanup(client.CloseIdleConnections)
	do := func(secrets ...string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("POST", "http://plugin/x", nil)
		req.Header.Set(plugins.HeaderNamespace, "/things")
		req.Header.Set(plugins.HeaderID, "a")
		for _, s := range secrets {
			req.Header.Add(plugins.HeaderSocketSecret, s)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	if code, body := do(); code != http.StatusForbidden || !strings.Contains(body, plugins.HeaderSocketSecret) {
		t.Errorf("before Describe, no secret: %d %s; want 403 naming the header", code, body)
	}
	if code, _ := do(""); code != http.StatusForbidden {
		t.Errorf("before Describe, empty secret: %d, want 403", code)
	}
	const secret = "s3cret-from-describe"
	if _, err := rt.Describe(ctx, &proto.DescribeRequest{SocketSecret: secret, ClusterCallToken: "cred"}); err != nil {
		t.Fatal(err)
	}
	for name, secrets := range map[string][]string{"none": nil, "wrong": {"s3cret-from-describX"}, "prefix": {"s3cret"},
		"twice, one wrong": {"nope", secret}} {
		if code, _ := do(secrets...); code != http.StatusForbidden {
			t.Errorf("%s secret: %d, want 403", name, code)
		}
	}
	if n := ran.Load(); n != 0 {
		t.Fatalf("refused requests ran the handler %d times", n)
	}
	if code, body := do(secret); code != 200 || body != "ran" {
		t.Errorf("with the secret: %d %s, want 200 ran", code, body)
	}
	if sawSecret.Load() {
		t.Error("instance code saw the socket secret")
	}
	// pinnedd describes a process once: a second Describe changes nothing.
	if _, err := rt.Describe(ctx, &proto.DescribeRequest{SocketSecret: "another"}); err != nil {
		t.Fatal(err)
	}
	if code, _ := do("another"); code != http.StatusForbidden {
		t.Errorf("a second Describe's secret: %d, want 403", code)
	}
	if code, _ := do(secret); code != 200 {
		t.Errorf("the first secret after a second Describe: %d, want 200", code)
	}
}

// ClusterClient marks calls with the instance's namespace and the
// credential pinnedd gave the process in Describe, never an environment
// variable.
func TestClusterClientCredential(t *testing.T) {
	got := make(chan string, 1)
	fd := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get(plugins.HeaderClusterCall)
	}))
	defer fd.Close()
	t.Setenv(plugins.EnvFrontDoor, fd.URL)
	t.Setenv(plugins.EnvClusterCallToken, "from-the-environment")
	rt, err := sdk.NewRuntime(map[string]sdk.Host{"/things": {New: func(*sdk.Instance) (http.Handler, error) { return http.NotFoundHandler(), nil }}},
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rt.Close)
	ctx := context.Background()
	if _, err := rt.Describe(ctx, &proto.DescribeRequest{ClusterCallToken: "cred-123"}); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Activate(ctx, &proto.ActivateRequest{Namespace: "/things", Id: "a", Generation: 1}); err != nil {
		t.Fatal(err)
	}
	resp, err := rt.Instance("/things", "a").ClusterClient().Get("/counters/x/value")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if v := <-got; v != plugins.ClusterCallValue("/things", "cred-123") {
		t.Errorf("%s = %q, want %q", plugins.HeaderClusterCall, v, "/things cred-123")
	}
}
