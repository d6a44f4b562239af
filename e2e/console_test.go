package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/pinnedd/pinnedd/internal/testutil"
	"github.com/pinnedd/pinnedd/statestore/pgstore/pgtest"
)

// browser is a headless Chromium driven over the DevTools protocol, with
// what the pages complained of (exceptions, CSP refusals, console errors).
type browser struct {
	t      *testing.T
	ctx    context.Context
	shots  string // where failure screenshots go (kept after the test)
	mu     sync.Mutex
	errors []string
}

// newBrowser starts Chromium (Debian's chromium; .ci/run installs it) at
// 1280x900. It runs as root here, so without its sandbox: tests only.
func newBrowser(t *testing.T) *browser {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("the console's tests need Chromium (apt-get install chromium; .ci/run does): %v", err)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.WindowSize(1280, 900),
		chromedp.Flag("disable-dev-shm-usage", true))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() }) // ends the browser process
	shots, err := os.MkdirTemp("", "pinnedd-console-shots-")
	if err != nil {
		t.Fatal(err)
	}
	b := &browser{t: t, ctx: ctx, shots: shots}
	// The first Run starts the browser, on the test's own context (a
	// timeout there would end the browser with it).
	if err := chromedp.Do(ctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	msgs := chromedp.Console(ctx)
	go func() {
		for m, err := range msgs {
			if err != nil {
				return
			}
			// A refused fetch is the page's business (it says so in
			// words); anything else logged as an error is a fault.
			if (m.Type == chromedp.ConsoleError || m.IsException()) && !strings.Contains(m.Text, "Failed to load resource") {
				b.mu.Lock()
				b.errors = append(b.errors, fmt.Sprintf("%s %s (%s)", m.Source, m.Text, m.URL))
				b.mu.Unlock()
			}
		}
	}()
	return b
}

// do runs actions; on failure it saves a screenshot and the page's text
// and fails the test naming them.
func (b *browser) do(what string, actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		b.fail(what, err)
	}
}

// eval evaluates a JavaScript expression that gives a string.
func (b *browser) eval(expr string) string {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Evaluate[string](expr))
	if err != nil {
		b.fail("evaluate "+expr, err)
	}
	return s
}

func (b *browser) fail(what string, err error) {
	b.t.Helper()
	name := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, strings.ToLower(what))
	shot := filepath.Join(b.shots, name+".png")
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	url, _ := chromedp.Run(ctx, chromedp.Location())
	text, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.innerText`))
	if png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100)); err == nil {
		_ = os.WriteFile(shot, png, 0o644)
	}
	b.t.Fatalf("%s: %v\npage %s, screenshot %s\npage text:\n%s\nerrors in the page: %q", what, err, url, shot, text, b.pageErrors())
}

func (b *browser) pageErrors() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.errors...)
}

// waitFor polls a JavaScript expression until it is true.
func (b *browser) waitFor(what string, timeout time.Duration, expr string) {
	b.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](expr))
		cancel()
		if err == nil && ok {
			return
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = fmt.Errorf("still false after %s: %s", timeout, expr)
			}
			b.fail(what, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// screenshot saves the page (the README's pictures) when
// CONSOLE_SCREENSHOTS names a directory.
func (b *browser) screenshot(name string) {
	b.t.Helper()
	dir := os.Getenv("CONSOLE_SCREENSHOTS")
	if dir == "" {
		return
	}
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		b.fail("screenshot "+name, err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), png, 0o644); err != nil {
		b.t.Fatal(err)
	}
}

// confirm clicks the button labelled label and confirms its dialog.
func (b *browser) confirm(label string) {
	b.t.Helper()
	b.do("click "+label,
		chromedp.Click(chromedp.CSS(fmt.Sprintf(`button[aria-label=%q]`, label))),
		chromedp.WaitVisible(chromedp.ID("confirm-ok")),
		chromedp.Click(chromedp.ID("confirm-ok")))
}

func js(s string) string { b, _ := json.Marshal(s); return string(b) }

// The walkthrough in a real browser against a real three-node
// fleet: the fleet page with a token, its nodes and plugins; cordon a node
// with its button and see the directory report it; wind an instance
// down; the inspector on a chat thread: send, see the echo, kill the
// owner, see it reconnect with the transcript intact.
func TestConsoleInABrowser(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t)
	chat := chatBin(t)
	var nodes []*node
	for i, id := range []string{"n1", "n2", "n3"} {
		extra := []string{"--join", ""}
		if i == 0 {
			extra = []string{"--bootstrap"}
		} else {
			extra[1] = nodes[0].url()
		}
		n := newNode(t, id, append(extra, "--database-url", dsn, "--plugin", "/threads="+chat)...)
		n.a = testutil.LaunchAgent(t, chatEnv, n.args...)
		nodes = append(nodes, n)
	}
	agents := []*testutil.Agent{nodes[0].a, nodes[1].a, nodes[2].a}
	for _, a := range agents {
		if err := a.WaitReady(60 * time.Second); err != nil {
			t.Fatalf("not ready: %v\n%s", err, a.Logs())
		}
	}
	testutil.WaitFleet(t, 30*time.Second, agents...)
	b := newBrowser(t)
	console := nodes[0].url() + "/_pinned/console/"

	// Without a token the page says so in words; with one it shows the fleet.
	b.do("open the fleet", chromedp.Navigate(console+"fleet"))
	b.waitFor("the page asks for a token", 20*time.Second, `document.getElementById("banner").textContent.includes("token was refused")`)
	b.do("enter the token",
		chromedp.SendKeys(chromedp.ID("token"), testutil.Token),
		chromedp.Click(chromedp.CSS(`#login button[type=submit]`)))
	b.waitFor("three hosts", 20*time.Second, `document.querySelectorAll("#hosts tbody tr[data-node]").length === 3`)
	b.waitFor("the Raft members, one leader", 20*time.Second,
		`document.querySelectorAll("#members tbody tr").length === 3 && [...document.querySelectorAll("#members tbody td")].some(td => td.textContent === "leader")`)
	for _, n := range nodes {
		b.waitFor(n.id+"'s plugins", 20*time.Second, fmt.Sprintf(
			`[...document.querySelectorAll('#plugins tbody tr[data-node=%q]')].map(r => r.textContent).join(" ").includes("/threads") &&
			 [...document.querySelectorAll('#plugins tbody tr[data-node=%q]')].map(r => r.textContent).join(" ").includes("/counters")`, n.id, n.id))
	}
	if got := b.eval(`document.getElementById("banner").textContent`); got != "" {
		t.Errorf("the banner shows %q with a good token", got)
	}
	// Every control has a name a screen reader says and a keyboard reaches.
	if got := b.eval(unlabelled); got != "" {
		t.Errorf("controls without a label, or out of the tab order: %s", got)
	}
	// The charts' history rides in the operator's /registry/stats.
	testutil.WaitFor(t, 20*time.Second, "every node's series in /registry/stats", func() bool {
		r, err := nodes[0].a.Do("GET", "/registry/stats", "")
		var out struct {
			Workers []struct {
				Series *struct {
					IntervalMs int64   `json:"intervalMs"`
					Requests   []int64 `json:"requests"`
				} `json:"series"`
			}
		}
		if err != nil || r.JSONErr(&out) != nil || len(out.Workers) != 3 {
			return false
		}
		for _, w := range out.Workers {
			if w.Series == nil || w.Series.IntervalMs != 5000 || len(w.Series.Requests) == 0 {
				return false
			}
		}
		return true
	})

	// Cordon n2 with its button: the page and the directory both report it.
	b.confirm("Cordon n2")
	b.waitFor("the page reports n2 cordoned", 20*time.Second,
		`document.querySelector('#hosts tr[data-node="n2"] td.state').textContent.includes("cordoned")`)
	testutil.WaitFor(t, 20*time.Second, "the directory reports n2 cordoned", func() bool {
		r, err := nodes[2].a.Do("GET", "/registry/workers", "")
		var out struct {
			Workers []struct {
				NodeID   string `json:"nodeId"`
				Cordoned bool   `json:"cordoned"`
			}
		}
		if err != nil || r.JSONErr(&out) != nil {
			return false
		}
		for _, w := range out.Workers {
			if w.NodeID == "n2" {
				return w.Cordoned
			}
		}
		return false
	})
	b.confirm("Undrain n2")
	b.waitFor("the page reports n2 undrained", 20*time.Second,
		`!document.querySelector('#hosts tr[data-node="n2"] td.state').textContent.includes("drain")`)

	if os.Getenv("CONSOLE_SCREENSHOTS") != "" {
		// The README's picture: a minute of traffic, so its charts have a shape.
		pictureLoad(t, nodes, time.Minute)
	}

	// Wind down an instance with its button: it is evicted.
	if r := nodes[0].a.MustDo("POST", "/counters/console-c1/increment", ""); r.Code != 200 {
		t.Fatalf("increment: %d %s", r.Code, r.Body)
	}
	b.waitFor("the instance listed", 20*time.Second, `!!document.querySelector('#instances tr[data-instance="/counters/console-c1"]')`)
	if got := b.eval(`document.querySelector('a[aria-label="Inspect /counters/console-c1"]').getAttribute("href")`); got != "/_pinned/console/inspector?url=%2Fcounters%2Fconsole-c1" {
		t.Errorf("Inspect links to %q", got)
	}
	b.screenshot("console-fleet.png")
	b.confirm("Cancel wind-down of /counters/console-c1") // none in force: answered, and the instance stays
	b.waitFor("the cancel answered", 20*time.Second, `document.getElementById("result").textContent.includes("/counters/console-c1: wind-down cancelled on 1 instance(s)")`)
	b.confirm("Wind down /counters/console-c1")
	b.waitFor("the wind-down answered", 20*time.Second, `document.getElementById("result").textContent.includes("/counters/console-c1: wind-down on 1 instance(s)")`)
	b.waitFor("the instance gone", 20*time.Second, `!document.querySelector('#instances tr[data-instance="/counters/console-c1"]')`)
	testutil.WaitFor(t, 20*time.Second, "no node runs console-c1", func() bool { return ownerOf(t, nodes, "/counters", "console-c1") == nil })

	// The drawer: ?inspect= opens a host.
	b.do("open a host's drawer", chromedp.Navigate(console+"fleet/hosts?inspect=host:n3"))
	b.waitFor("n3's drawer", 20*time.Second, `!document.getElementById("drawer").hidden && document.getElementById("drawer-body").textContent.includes("Client id")`)

	// At phone width nothing runs off the side: tables scroll in their boxes.
	b.do("phone width", chromedp.EmulateViewport(390, 844), chromedp.Navigate(console+"fleet"))
	b.waitFor("the fleet at phone width", 20*time.Second,
		`document.querySelectorAll("#hosts tbody tr[data-node]").length === 3 && document.documentElement.scrollWidth <= window.innerWidth + 1`)
	b.do("desktop width", chromedp.EmulateViewport(1280, 900))

	// The inspector on a chat thread, through n1: send, see the echo.
	thread := "/threads/console-t1"
	b.do("open the inspector", chromedp.Navigate(console+"inspector?url="+thread))
	b.waitFor("attached", 30*time.Second, `document.getElementById("status").textContent.startsWith("Attached to /threads/console-t1")`)
	b.do("send a message",
		chromedp.SendKeys(chromedp.ID("message"), "hello console"),
		chromedp.Click(chromedp.CSS(`#chat button[type=submit]`)))
	transcript := `[...document.querySelectorAll("#transcript li")].map(li => li.textContent).join(" | ")`
	first := "user: hello console | assistant: echo: hello console"
	b.waitFor("the echo", 30*time.Second, transcript+` === `+js(first)+` && document.getElementById("chat-note").textContent === "Thread idle."`)
	// The ops came in one by one: the reply's words appended as they streamed.
	b.waitFor("the ops shown", 5*time.Second, `[...document.querySelectorAll("#frames li.ops")].some(li => li.textContent.includes('"op":"append"'))`)

	// Kill the owner (the console's node stays): the inspector reconnects
	// and shows the same transcript, and the thread takes a new message.
	owner := ownerOf(t, nodes, "/threads", "console-t1")
	if owner == nil {
		t.Fatal("no node runs console-t1")
	}
	if owner == nodes[0] {
		// The browser's node must outlive the owner: inspect through another.
		b.do("open the inspector elsewhere", chromedp.Navigate(nodes[1].url()+"/_pinned/console/inspector?url="+thread))
		b.waitFor("attached elsewhere", 30*time.Second, transcript+` === `+js(first))
	}
	epoch := b.eval(`document.getElementById("status").textContent`)
	b.screenshot("console-inspector.png")
	owner.a.Signal(syscall.SIGKILL)
	if _, err := owner.a.Wait(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	b.waitFor("disconnected", 20*time.Second, `/disconnected|fin evicted|reconnect/.test(document.getElementById("status").textContent)`)
	b.waitFor("reconnected with the transcript", 60*time.Second,
		`document.getElementById("status").textContent.startsWith("Attached to /threads/console-t1") && document.getElementById("status").textContent.includes("reconnect(s)") && `+transcript+` === `+js(first))
	after := b.eval(`document.getElementById("status").textContent`)
	if epochOf(after) == epochOf(epoch) {
		t.Errorf("the epoch did not change across the owner's death: %q, then %q", epoch, after)
	}
	b.do("send after the failover",
		chromedp.SendKeys(chromedp.ID("message"), "after failover"),
		chromedp.Click(chromedp.CSS(`#chat button[type=submit]`)))
	b.waitFor("the second echo", 30*time.Second, transcript+` === `+js(first+" | user: after failover | assistant: echo: after failover"))

	// The console's own node goes away: the page says so in words and
	// keeps the last reading on screen.
	host := nodes[0]
	if owner == nodes[0] {
		host = nodes[1]
	}
	b.do("open the fleet on "+host.id, chromedp.Navigate(host.url()+"/_pinned/console/fleet"),
		chromedp.SendKeys(chromedp.ID("token"), testutil.Token),
		chromedp.Click(chromedp.CSS(`#login button[type=submit]`)))
	b.waitFor("the survivors listed", 20*time.Second, `document.querySelectorAll("#hosts tbody tr[data-node]").length >= 2`)
	host.a.Signal(syscall.SIGKILL)
	if _, err := host.a.Wait(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	b.waitFor("the node's absence in words", 20*time.Second,
		`document.getElementById("banner").textContent.includes("did not answer") && document.querySelectorAll("#hosts tbody tr[data-node]").length >= 2`)
	if errs := b.pageErrors(); len(errs) > 0 {
		t.Errorf("the pages logged errors (a CSP refusal, an exception): %q", errs)
	}
}

// pictureLoad sends counter increments for d, through every node, to six
// ids, at a rate that rises.
func pictureLoad(t *testing.T, nodes []*node, d time.Duration) {
	t.Helper()
	start := time.Now()
	for i := 0; time.Since(start) < d; i++ {
		n := nodes[i%len(nodes)]
		if _, err := n.a.Do("POST", fmt.Sprintf("/counters/picture-%d/increment", i%6), ""); err != nil {
			t.Fatal(err)
		}
		phase := time.Since(start).Seconds() / d.Seconds()
		time.Sleep(time.Duration(5+45*(1-phase)*(1-phase)) * time.Millisecond)
	}
}

// unlabelled lists the page's controls a screen reader could not name
// or a keyboard could not reach ("" when there is none).
const unlabelled = `[...document.querySelectorAll("button, input, textarea, select, a[href]")]
	.filter(e => e.offsetParent !== null || e.closest("dialog, aside"))
	.filter(e => e.tabIndex < 0 || !(e.getAttribute("aria-label") || e.textContent.trim() ||
		(e.id && document.querySelector('label[for="' + e.id + '"]')) || e.closest("label")))
	.map(e => e.outerHTML.slice(0, 80)).join(" | ")`

// epochOf picks the epoch out of the inspector's status line.
func epochOf(status string) string {
	_, rest, _ := strings.Cut(status, "epoch ")
	e, _, _ := strings.Cut(rest, ",")
	return e
}

// The console has no rights of its own: with a passport, the key typed in
// decides what the pages may read, and a refusal is said in words.
func TestConsoleWithAPassport(t *testing.T) {
	t.Parallel()
	n := newNode(t, "n1", "--bootstrap", "--plugin", "/hooks="+testutil.Bin(t, "testhost"))
	n.a = testutil.StartAgentAt(t, n.wd, append(append([]string{}, fleetEnv...), passportEnv...), n.args...)
	b := newBrowser(t)
	// login starts from no key (the page asks for one), then gives key.
	login := func(key string) {
		t.Helper()
		b.do("forget the key", chromedp.Navigate(n.url()+"/_pinned/console/fleet"), chromedp.Click(chromedp.ID("forget")))
		b.waitFor("no key", 20*time.Second, `document.getElementById("banner").textContent.startsWith("The token was refused (401)")`)
		b.do("enter a key",
			chromedp.SendKeys(chromedp.ID("token"), key),
			chromedp.Click(chromedp.CSS(`#login button[type=submit]`)))
	}

	// The node's own key has the worker scope only; an operator key
	// narrowed to /hooks reaches no fleet-wide route.
	for _, key := range []string{testutil.Token, hooksOps} {
		login(key)
		b.waitFor("a 403 in words", 20*time.Second, `document.getElementById("banner").textContent.startsWith("This token may not do that (403)")`)
		if got := b.eval(`String(document.querySelectorAll("#hosts tbody tr[data-node]").length)`); got != "0" {
			t.Errorf("a refused key sees %s hosts", got)
		}
	}
	login(opsKey)
	b.waitFor("the fleet with the operator key", 20*time.Second,
		`document.querySelectorAll("#hosts tbody tr[data-node]").length === 1 && document.getElementById("banner").hidden`)

	// An authenticated namespace: the inspector sends no key unless told,
	// and says what to do about the 401.
	b.do("inspect an authenticated namespace", chromedp.Navigate(n.url()+"/_pinned/console/inspector?url=/hooks/h1"))
	b.waitFor("the 401 in words", 20*time.Second,
		`document.getElementById("status").textContent.includes("HTTP 401") && document.getElementById("status").textContent.includes("Send my token")`)
	if errs := b.pageErrors(); len(errs) > 0 {
		t.Errorf("the pages logged errors: %q", errs)
	}
}

// In hostname-aware mode the console offers the hostnames the fleet binds
// and scopes its hosts, plugins and instances to the one chosen; the
// choice outlives a reload of the page (localStorage) and a new token
// resets it to every hostname.
func TestConsoleHostnameScope(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(testutil.SharedDir(t), "counter") // the plugin account runs it
	copyFile(t, testutil.Bin(t, "counter"), bin)
	a := testutil.StartAgent(t, nil, "--dev", "--hostname-aware", "--plugin", "127.0.0.1/counters="+bin)
	port := a.URL[strings.LastIndexByte(a.URL, ':'):]
	for _, u := range []string{"http://localhost" + port + "/counters/at-localhost/increment", "http://127.0.0.1" + port + "/counters/at-loopback/increment"} {
		if r, err := testutil.Do(context.Background(), "POST", u, "", nil); err != nil || r.Code != 200 {
			t.Fatalf("POST %s: %v %d %s", u, err, r.Code, r.Body)
		}
	}
	b := newBrowser(t)
	page := a.URL + "/_pinned/console/fleet/instances"
	rows := `[...document.querySelectorAll("#instances tbody tr[data-instance]")].map(r => r.dataset.instance).sort().join(" ")`
	b.do("open the instances", chromedp.Navigate(page))
	b.waitFor("the hostnames offered", 20*time.Second,
		`[...document.querySelectorAll("#scope-hostname option")].map(o => o.value).join(",") === ",127.0.0.1,localhost" && !document.getElementById("scope").hidden`)
	b.waitFor("both instances", 20*time.Second, rows+` === "/counters/at-localhost /counters/at-loopback"`)
	choose := func(h string) {
		t.Helper()
		b.eval(fmt.Sprintf(`(() => { const s = document.getElementById("scope-hostname"); s.value = %s; s.dispatchEvent(new Event("change")); return ""; })()`, js(h)))
	}
	choose("127.0.0.1")
	b.waitFor("only 127.0.0.1's instance", 10*time.Second, rows+` === "/counters/at-loopback"`)
	b.waitFor("only 127.0.0.1's plugin", 10*time.Second,
		`[...document.querySelectorAll("#plugins tbody tr[data-plugin]")].length === 1 && document.querySelector("#plugins tbody tr[data-plugin]").textContent.includes("127.0.0.1/counters (env 127.0.0.1)")`)
	b.do("reload the page", chromedp.Navigate(page))
	b.waitFor("the choice kept", 20*time.Second, `document.getElementById("scope-hostname").value === "127.0.0.1" && `+rows+` === "/counters/at-loopback"`)
	b.do("enter a token",
		chromedp.SendKeys(chromedp.ID("token"), testutil.Token),
		chromedp.Click(chromedp.CSS(`#login button[type=submit]`)))
	b.waitFor("every hostname again", 20*time.Second, `document.getElementById("scope-hostname").value === "" && `+rows+` === "/counters/at-localhost /counters/at-loopback"`)
	if errs := b.pageErrors(); len(errs) > 0 {
		t.Fatalf("errors in the page: %q", errs)
	}
}
