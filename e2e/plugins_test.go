package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testutil"
)

// A plugin added to a running node and removed again while another
// namespace is under load: pinnedd plugins add serves the new namespace
// at once, remove takes it away and ends its process, and no request of
// the other namespace fails meanwhile. Only a binary under --plugin-dir
// that nobody but root could have changed may be added.
func TestPluginsAddAndRemoveAtRunTime(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(testutil.SharedDir(t), "plugins")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "testhost")
	copyFile(t, testutil.Bin(t, "testhost"), bin)
	outside := filepath.Join(testutil.SharedDir(t), "testhost")
	copyFile(t, testutil.Bin(t, "testhost"), outside)
	a := testutil.StartAgent(t, nil, "--dev", "--plugin-dir", dir)

	// Increments of the built-in counters, which never stop serving: any
	// answer but 200 fails the test, a retryable 503 too.
	l := startLoad(a, 4, func(w int) string { return fmt.Sprintf("/counters/load%d/increment", w) })
	acked := &l.acked
	testutil.WaitFor(t, 10*time.Second, "load flowing", func() bool { return acked.Load() > 20 })

	expect(t, a, "POST", "/tally/t1/inc", 404, `{"error":"unknown namespace"}`)
	for _, c := range []struct{ arg, why string }{
		{"/tally=" + outside, "is not under --plugin-dir"},
		{"/counters=" + bin, "plugin did not start: plugin does not serve the configured namespace"},
	} {
		if out, err := testutil.CLI(t, "plugins", "add", "--addr", a.URL, c.arg); err == nil || !strings.Contains(out, c.why) {
			t.Fatalf("plugins add %s: %v\n%s", c.arg, err, out)
		}
	}
	// Group-writable: anyone in the group could have swapped it.
	if err := os.Chmod(bin, 0o775); err != nil {
		t.Fatal(err)
	}
	if out, err := testutil.CLI(t, "plugins", "add", "--addr", a.URL, "/tally="+bin); err == nil || !strings.Contains(out, "writable by its group or others") {
		t.Fatalf("plugins add of a group-writable binary: %v\n%s", err, out)
	}
	if err := os.Chmod(bin, 0o755); err != nil {
		t.Fatal(err)
	}

	if out, err := testutil.CLI(t, "plugins", "add", "--addr", a.URL, "/tally="+bin); err != nil {
		t.Fatalf("plugins add: %v\n%s", err, out)
	}
	expect(t, a, "POST", "/tally/t1/inc", 200, `{"value":1}`)
	pid := pluginPID(t, a, "testhost")
	if out, err := testutil.CLI(t, "plugins", "add", "--addr", a.URL, "/tally="+bin); err == nil || !strings.Contains(out, "namespace /tally is served by both testhost and testhost-2") {
		t.Fatalf("plugins add of a namespace another plugin serves: %v\n%s", err, out)
	}
	out, _ := testutil.CLI(t, "plugins", "list", "--addr", a.URL)
	if !strings.Contains(out, "testhost") || !strings.Contains(out, "/tally") {
		t.Fatalf("plugins list after add:\n%s", out)
	}

	if out, err := testutil.CLI(t, "plugins", "remove", "--addr", a.URL, "/tally"); err != nil {
		t.Fatalf("plugins remove: %v\n%s", err, out)
	}
	testutil.WaitFor(t, 10*time.Second, "the removed plugin's process gone", func() bool { return !testutil.Alive(pid) })
	expect(t, a, "POST", "/tally/t1/inc", 404, `{"error":"unknown namespace"}`)
	if out, err := testutil.CLI(t, "plugins", "remove", "--addr", a.URL, "/tally"); err == nil || !strings.Contains(out, "no plugin of this node serves it") {
		t.Fatalf("plugins remove of a namespace no plugin serves: %v\n%s", err, out)
	}

	before := acked.Load()
	testutil.WaitFor(t, 10*time.Second, "load after the removal", func() bool { return acked.Load() > before+20 })
	if b := l.Stop(); b != nil || l.refused.Load() != 0 {
		t.Fatalf("a request of another namespace failed meanwhile: %v (%d refused)", b, l.refused.Load())
	}
}

// Without --plugin-dir, nothing is added at run time.
func TestPluginsAddNeedsPluginDir(t *testing.T) {
	t.Parallel()
	a := testutil.StartAgent(t, nil, "--dev")
	out, err := testutil.CLI(t, "plugins", "add", "--addr", a.URL, "/tally="+testutil.Bin(t, "testhost"))
	if err == nil || !strings.Contains(out, "--plugin-dir") {
		t.Fatalf("plugins add without --plugin-dir: %v\n%s", err, out)
	}
}
