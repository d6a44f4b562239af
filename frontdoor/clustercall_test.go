package frontdoor

import (
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/pinboard"

	"github.com/pinnedd/pinnedd/plugins"
)

// A cluster call is honoured only with a live plugin process's credential
// and only for a namespace that process serves here; anything else is
// refused with the reason, never passed on as an ordinary request.
func TestClusterCallNeedsTheCallersOwnNamespace(t *testing.T) {
	creds := map[string][]string{"cred-misc": {"/misc"}}
	rig := newDoorRig(t, func(rig *doorRig, c *nodeConfig) {
		c.Registry = pinboard.NewRegistry(c.Dir, time.Hour)
		c.Worker = pinboard.NewWorker(pinboard.WorkerConfig{NodeID: "n1", AdvertiseURL: rig.srv.URL, Namespaces: []string{"/misc"}, TTL: time.Hour, Logger: c.Logger}, c.Registry)
		c.ClusterCalls = func(tok string) (string, []string, bool) { nss, ok := creds[tok]; return "", nss, ok }
	})
	for _, c := range []struct {
		header string
		ok     bool
		why    string
	}{
		{plugins.ClusterCallValue("/misc", "cred-misc"), true, ""},
		{plugins.ClusterCallValue("/counters", "cred-misc"), false, "not good for cluster calls from /counters"},
		{plugins.ClusterCallValue("/misc", "cred-gone"), false, "not good"},
		{"garbage", false, ""},
	} {
		r := httptest.NewRequest("POST", "/counters/a/increment", nil)
		r.Header.Set(plugins.HeaderClusterCall, c.header)
		_, ok, err := rig.f.clusterCall(r)
		if ok != c.ok || (err == nil) != c.ok || (c.why != "" && !strings.Contains(err.Error(), c.why)) {
			t.Errorf("%q: ok=%v err=%v, want ok=%v (%s)", c.header, ok, err, c.ok, c.why)
		}
		if r.Header.Get(plugins.HeaderClusterCall) != "" {
			t.Errorf("%q: the credential was left on the request", c.header)
		}
	}
}
