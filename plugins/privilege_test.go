package plugins

import (
	"errors"
	"testing"
)

func TestParseClusterCall(t *testing.T) {
	ns, tok, err := ParseClusterCall(ClusterCallValue("/counters", "c0ffee"))
	if err != nil || ns != "/counters" || tok != "c0ffee" {
		t.Errorf("round trip: %q %q %v", ns, tok, err)
	}
	for _, v := range []string{"", "c0ffee", "/counters", "/counters ", "counters c0ffee", "/counters c0 ffee", "/registry c0ffee", "/counters\tc0ffee"} {
		if _, _, err := ParseClusterCall(v); !errors.Is(err, ErrClusterCallMalformed) {
			t.Errorf("ParseClusterCall(%q) = %v, want ErrClusterCallMalformed", v, err)
		}
	}
}

func TestPluginEnvRules(t *testing.T) {
	for name, want := range map[string]bool{"PATH": true, "HOME": true, "LANG": true, "LC_ALL": true, "LC_CTYPE": true, "TZ": true, "TMPDIR": true,
		"PINBOARD_TOKEN": false, "DATABASE_URL": false, "PATHX": false, "LCX": false, "USER": false, "GODEBUG": false} {
		if Allowed(name) != want {
			t.Errorf("Allowed(%s) = %v, want %v", name, !want, want)
		}
	}
	for name, secret := range map[string]bool{"PINBOARD_TOKEN": true, "PINBOARD_PASSPORT": true, "DATABASE_URL": true, EnvClusterCallToken: true,
		"PINNEDD_URL": false, "MY_DATABASE_URL": false} {
		if SecretEnv(name) != secret {
			t.Errorf("SecretEnv(%s) = %v, want %v", name, !secret, secret)
		}
	}
	for name, reserved := range map[string]bool{"PINBOARD_X": true, "PINNEDD_URL": true, Handshake.MagicCookieKey: true, "PLUGIN_MIN_PORT": true,
		"NOTIFY_SOCKET": true, "CHAT_WORD_DELAY": false, "GOMAXPROCS": false} {
		if (ReservedEnv(name) != "") != reserved {
			t.Errorf("ReservedEnv(%s) = %q, want reserved %v", name, ReservedEnv(name), reserved)
		}
	}
}
