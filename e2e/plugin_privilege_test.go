package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/pinnedd/pinnedd/internal/testutil"
	"github.com/pinnedd/pinnedd/plugins"
	"github.com/pinnedd/pinnedd/statestore/pgstore/pgtest"
)

// Plugins get least privilege. An agent started with the deployment token
// and the database URL in its environment (as systemd's EnvironmentFile
// gives them) runs the counter plugin and the built-in hosts: neither
// process's environment holds those, nor any cluster-call token; and a
// process that writes a request to a plugin's data socket itself, as the
// plugin's namespace and id headers say, gets 403 and the counter does not
// move.
func TestPluginLeastPrivilege(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t)
	a := testutil.StartAgent(t, []string{"DATABASE_URL=" + dsn, "UNRELATED_SECRET=must-not-leak"},
		"--dev", "--data-dir", t.TempDir(), "--plugin", "/counters="+testutil.Bin(t, "counter"))
	expect(t, a, "POST", "/counters/alice/increment", 200, `{"value":1}`)

	st := getStatus(t, a)
	if len(st.Plugins) < 2 {
		t.Fatalf("want the counter plugin and the built-in hosts, got %+v", st.Plugins)
	}
	var counterSocket string
	for _, p := range st.Plugins {
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", p.PID))
		if err != nil {
			t.Fatalf("plugin %s: %v", p.Name, err)
		}
		for _, kv := range strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00") {
			k, v, _ := strings.Cut(kv, "=")
			switch {
			case strings.HasPrefix(k, "PINBOARD_"), k == "DATABASE_URL", k == plugins.EnvClusterCallToken, k == "UNRELATED_SECRET":
				t.Errorf("plugin %s environment has %s", p.Name, k)
			case strings.Contains(v, testutil.Token), strings.Contains(v, dsn), strings.Contains(v, "must-not-leak"):
				t.Errorf("plugin %s environment carries a secret in %s", p.Name, k)
			case k == plugins.EnvDataSocket && p.Name == "counter":
				counterSocket = v
			}
		}
	}
	if counterSocket == "" {
		t.Fatalf("the counter plugin's environment names no %s", plugins.EnvDataSocket)
	}

	raw := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", counterSocket)
	}}}
	defer raw.CloseIdleConnections()
	req, _ := http.NewRequest("POST", "http://plugin/increment", nil)
	req.Header.Set(plugins.HeaderNamespace, "/counters")
	req.Header.Set(plugins.HeaderID, "alice")
	resp, err := raw.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("raw write to the data socket: %d %s, want 403", resp.StatusCode, body)
	}
	expect(t, a, "GET", "/counters/alice/value", 200, `{"value":1}`)
	expect(t, a, "POST", "/counters/alice/increment", 200, `{"value":2}`)
}
