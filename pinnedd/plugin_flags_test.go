package main

import (
	"os"
	"strings"
	"testing"

	"github.com/pinnedd/pinnedd/supervisor"
)

// --plugin in both modes: single mode takes /NS=PATH and nothing more;
// hostname-aware mode takes HOST/NS=PATH with its options (which the CLI
// split at their commas), groups a binary's namespaces by binding, and
// says what is wrong with a bad one.
func TestPluginFlags(t *testing.T) {
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	specs, err := pluginSpecs([]string{"/counters=" + bin, "/chat=" + bin}, false, false)
	if err != nil || len(specs) != 1 || len(specs[0].Namespaces) != 2 || specs[0].Bind != (supervisor.Binding{}) {
		t.Fatalf("single mode: %+v %v", specs, err)
	}
	specs, err = pluginSpecs([]string{
		"pr-41.preview.example.com/counters=" + bin, "env=staging", "epoch=3",
		"PR-41.preview.example.com/chat=" + bin + ",env=staging,epoch=3",
		"pr-42.preview.example.com/counters=" + bin, "takeover=deny",
	}, false, true)
	if err != nil || len(specs) != 2 {
		t.Fatalf("hostname-aware: %+v %v", specs, err)
	}
	if want := (supervisor.Binding{Hostname: "pr-41.preview.example.com", Env: "staging", Epoch: 3}); specs[0].Bind != want || len(specs[0].Namespaces) != 2 {
		t.Errorf("pr-41: %+v, want %+v serving two namespaces", specs[0], want)
	}
	if want := (supervisor.Binding{Hostname: "pr-42.preview.example.com", Env: "pr-42.preview.example.com", Takeover: "deny"}); specs[1].Bind != want {
		t.Errorf("pr-42: %+v, want %+v", specs[1].Bind, want)
	}
	if specs[0].Name == specs[1].Name {
		t.Errorf("two plugins named %q", specs[0].Name)
	}

	for _, c := range []struct {
		flags     []string
		hostnames bool
		why       string
	}{
		{[]string{"h.test/counters=" + bin}, false, "needs --hostname-aware"},
		{[]string{"/counters=" + bin, "env=x"}, false, "needs --hostname-aware"},
		{[]string{"/counters=" + bin}, true, "under a hostname"},
		{[]string{"h.test/counters=" + bin, "takeover=maybe"}, true, "want wind_down or deny"},
		{[]string{"h.test/counters=" + bin, "epoch=-1"}, true, "want a whole number"},
		{[]string{"h.test/counters=" + bin + ",color=red"}, true, "unknown option"},
		{[]string{"::1/counters=" + bin}, true, "name one with env="},
		{[]string{"h.test/counters=" + bin, "env=a/b"}, true, "env \"a/b\""},
		{[]string{"h_x.test/counters=" + bin}, true, "is not a hostname"},
		{[]string{"h.test/counters=" + bin, "H.test/counters=" + bin + ",env=other"}, true, "given twice"},
		{[]string{"h.test/counters="}, true, "want hostname/namespace=/path/to/binary"},
	} {
		if _, err := pluginSpecs(c.flags, false, c.hostnames); err == nil || !strings.Contains(err.Error(), c.why) {
			t.Errorf("%q (hostname-aware %v): %v, want an error saying %q", c.flags, c.hostnames, err, c.why)
		}
	}
}
