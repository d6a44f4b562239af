package plugins_test

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"

	"github.com/pinnedd/pinnedd/internal/testutil"
	"github.com/pinnedd/pinnedd/plugins"
	"github.com/pinnedd/pinnedd/plugins/proto"
)

// dispense starts testhost the way pinnedd does (same handshake, same
// versions offered, mutual TLS), claiming plugin protocol version
// protocol ("" for its own), and dispenses the host plugin. The process is
// killed when the test ends.
func dispense(t *testing.T, protocol string) (any, error) {
	t.Helper()
	cmd := exec.Command(testutil.Bin(t, "testhost"))
	if protocol != "" {
		cmd.Env = []string{"TESTHOST_PROTOCOL=" + protocol}
	}
	client := goplugin.NewClient(&goplugin.ClientConfig{
		HandshakeConfig:  plugins.Handshake,
		VersionedPlugins: plugins.HostVersions(),
		Cmd:              cmd,
		SkipHostEnv:      true,
		AutoMTLS:         true,
		AllowedProtocols: []goplugin.Protocol{goplugin.ProtocolGRPC},
		StartTimeout:     30 * time.Second,
		Logger:           hclog.NewNullLogger(),
	})
	t.Cleanup(func() {
		client.Kill()
		if !client.Exited() {
			t.Errorf("testhost (protocol %q) still runs after Kill", protocol)
		}
	})
	rpc, err := client.Client()
	if err != nil {
		return nil, fmt.Errorf("start: %w", err)
	}
	return rpc.Dispense(plugins.PluginName)
}

// A plugin of the current protocol is dispensed and answers; one of an
// older protocol completes the handshake and is refused at Dispense with
// ErrProtocolVersion, naming both versions; one of a newer protocol is
// refused by go-plugin at the handshake.
func TestHandshakeVersions(t *testing.T) {
	t.Run("current", func(t *testing.T) {
		raw, err := dispense(t, "")
		if err != nil {
			t.Fatalf("dispense: %v", err)
		}
		conn, ok := raw.(*plugins.Conn)
		if !ok {
			t.Fatalf("dispensed %T, want *plugins.Conn", raw)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if h, err := conn.Control.Health(ctx, &proto.HealthRequest{}); err != nil || !h.Serving {
			t.Fatalf("Health: %v %v", h, err)
		}
	})
	for v := 1; v < plugins.ProtocolVersion; v++ {
		t.Run(fmt.Sprintf("older-%d", v), func(t *testing.T) {
			raw, err := dispense(t, fmt.Sprint(v))
			t.Log(err)
			if !errors.Is(err, plugins.ErrProtocolVersion) {
				t.Fatalf("dispense = %T, %v; want ErrProtocolVersion", raw, err)
			}
			for _, want := range []string{
				fmt.Sprintf("speaks plugin protocol %d,", v),
				fmt.Sprintf("this pinnedd speaks %d", plugins.ProtocolVersion),
			} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
		})
	}
	t.Run("newer", func(t *testing.T) {
		raw, err := dispense(t, fmt.Sprint(plugins.ProtocolVersion+1))
		if err == nil {
			t.Fatalf("a plugin of protocol %d was dispensed (%T)", plugins.ProtocolVersion+1, raw)
		}
		t.Log(err)
	})
}
