package e2e

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testutil"
)

// TestReadme runs README.md as a reader would, block by block, and fails
// when a block does not work as written or prints something other than
// what the README shows. The rules:
//
//   - Markers. Every fenced block of the README has a marker on the last
//     non-blank line before it, `<!-- test: KIND ... -->`; a block without
//     one fails the test, so no new block escapes it. KIND is
//     `run` (run each command, in order), `server ADDR` (a foreground
//     command, an agent: started in the background and waited for until
//     http://ADDR/readyz answers 200), `file NAME` (write the block, as is,
//     to NAME in the shell's current directory: the Go code a reader saves
//     as main.go), `restart ADDR` (`kill -9` the server block of this
//     section at ADDR, process group and all, wait until it and its plugins
//     are gone, then run this block as a server) or `skip (REASON)`.
//   - Sessions. Each "## " section runs in one bash session of its own, as
//     in a fresh terminal: started at the root of a copy of the module's
//     files (the work tree under test, in a temporary directory, so
//     bin/, data dirs and a host module in ../ land there), with cd and
//     export carrying over from block to block. Sections run in README
//     order; files a section leaves (bin/pinnedd) stay for the next.
//   - Commands. One a line (a line ending in `\` continues); a line ending
//     in `&` is a background job. Each must exit 0 within commandTimeout.
//   - Outputs. A comment `# → OUTPUT`, at the end of a command's line or on
//     the line after it, is what the command prints on stdout: both sides
//     trimmed, every run of white space (newlines included) compared as one
//     space, and `...` standing for any text. Other comments are prose.
//   - Ports. Every `127.0.0.1:PORT` and `localhost:PORT` with PORT in
//     8000-8999 becomes a free port, the same README port always the same
//     free port in one run; the agent's and the CLI's default address
//     (127.0.0.1:8080) is mapped with it, through PINNEDD_HTTP_ADDR and
//     PINNEDD_ADDR in the session's environment. Other ports (Postgres's
//     5432) stay as written. The environment is the test's minus the
//     variables pinnedd and the chat clients read (DATABASE_URL,
//     PINBOARD_*, PINNEDD_*, ...).
//   - Databases. The database names pinnedd_chat, pinnedd_fleet and
//     pinnedd_preview become names unique to the run; the test drops them
//     at the end.
//   - Processes. Background jobs and servers are process groups of their
//     own (job control is on). When its section ends, each gets SIGINT, as
//     ^C in its terminal; everything in those groups and every plugin of
//     their agents must then be gone within stopGrace, and at the end of the
//     test no process started by the README may be left.
//   - Passes. The README runs twice, each pass in a copy of its own: as
//     written, then kept-alive: curl's requests go through a proxy
//     (http_proxy) that carries each to its node over a connection it
//     keeps open, so every request after a node's first arrives on a
//     connection that carried others. The outputs must be the same.
//
// Sections needing what is not there yet fail, not skip: Postgres at
// 127.0.0.1:5432 (user postgres, trust), node (20), curl and jq.
func TestReadme(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	text, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks, errs := parseReadme(string(text))
	for _, err := range errs {
		t.Error(err)
	}
	if len(errs) > 0 {
		t.FailNow()
	}
	checkFirstCommands(t, blocks)

	// Two passes: as written (each curl a new connection), then with every
	// request of a section carried to its node over a connection kept open
	// (a client that keeps its connection, as most do).
	t.Run("as-written", func(t *testing.T) { runReadme(t, root, blocks, nil) })
	t.Run("kept-alive", func(t *testing.T) {
		p := startKeptAliveProxy(t)
		runReadme(t, root, blocks, p)
		if !p.reused() {
			t.Errorf("the kept-alive pass carried %d requests on %d connections: none reused", p.requests.Load(), p.dials.Load())
		}
	})
}

// runReadme runs the README's sections in a copy of the module at root,
// with curl's requests through p if it is set.
func runReadme(t *testing.T, root string, blocks []mdBlock, p *keptAliveProxy) {
	// A directory every account may enter, as a reader's checkout usually
	// is: the suite runs as root, and a root pinnedd runs the plugins the
	// README builds (bin/counter, ../greeter) as its default account, which
	// must be able to execute them (t.TempDir's are 0700).
	tmp := testutil.SharedDir(t)
	clone := filepath.Join(tmp, "pinnedd")
	copyModule(t, root, clone)

	tag := randomHex(t)
	ports := newPortMap(t)
	dbs := dbNames{"pinnedd_chat": "pinnedd_chat_readme_" + tag, "pinnedd_fleet": "pinnedd_fleet_readme_" + tag,
		"pinnedd_preview": "pinnedd_preview_readme_" + tag}
	// Cleanups run last-in first-out, after the sections' own: by then
	// every agent using the database has stopped.
	t.Cleanup(func() {
		for _, name := range dbs {
			if out, err := exec.Command("dropdb", "--if-exists", "-h", "127.0.0.1", "-U", "postgres", name).CombinedOutput(); err != nil {
				t.Errorf("dropdb %s: %v\n%s", name, err, out)
			}
		}
	})
	t.Cleanup(func() {
		if left := tagged(tag); len(left) > 0 {
			t.Errorf("processes started by the README still alive after the test: %v", left)
		}
	})
	env := shellEnv(ports, tag)
	if p != nil {
		env = append(env, p.env()...)
	}
	for _, sec := range sections(blocks) {
		t.Run(sec.name, func(t *testing.T) {
			sh := startShell(t, clone, env, ports, dbs)
			for _, b := range sec.blocks {
				runBlock(t, sh, b)
			}
			sh.stop(stopGrace)
		})
	}
}

const (
	// commandTimeout bounds one command; the first `go build` in a fresh
	// copy of the module compiles its packages (deps come from the cache).
	commandTimeout = 3 * time.Minute
	// stopGrace is how long a stopped section's agents get to drain and
	// exit (idle instances go at once).
	stopGrace = 45 * time.Second
)

type section struct {
	name   string
	blocks []mdBlock
}

// sections groups the blocks that run by their section, in README order.
func sections(blocks []mdBlock) []section {
	var out []section
	for _, b := range blocks {
		if b.Marker.Kind == "skip" {
			continue
		}
		if len(out) == 0 || out[len(out)-1].name != b.Section {
			out = append(out, section{name: b.Section})
		}
		out[len(out)-1].blocks = append(out[len(out)-1].blocks, b)
	}
	return out
}

func runBlock(t *testing.T, sh *shell, b mdBlock) {
	t.Helper()
	switch b.Marker.Kind {
	case "file":
		sh.writeFile(b.Marker.Arg, b.Body, b.Line)
	case "run":
		cmds, err := splitCommands(b.Body, b.Line+1)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cmds {
			sh.run(c, commandTimeout)
		}
	case "server", "restart":
		if b.Marker.Kind == "restart" {
			sh.kill9(b.Marker.Arg, b.Line)
		}
		cmds, err := splitCommands(b.Body, b.Line+1)
		if err != nil {
			t.Fatal(err)
		}
		if len(cmds) != 1 || cmds[0].Background || cmds[0].HasExpect {
			t.Fatalf("README.md:%d: a server block is one foreground command with no expected output", b.Line)
		}
		c := cmds[0]
		c.Text, c.Background = c.Text+" &", true
		sh.run(c, commandTimeout)
		j := sh.jobs[len(sh.jobs)-1]
		sh.servers[b.Marker.Arg] = j
		sh.waitReady(sh.ports.apply(b.Marker.Arg), j, commandTimeout)
	}
}

// checkFirstCommands keeps the README's first two commands where a reader
// looks first: the quick start's node on its embedded default, then the
// command that runs the test suite.
func checkFirstCommands(t *testing.T, blocks []mdBlock) {
	t.Helper()
	if len(blocks) == 0 || strings.TrimSpace(blocks[0].Body) != "go run ./pinnedd agent --dev" {
		t.Errorf("the README's first block must be `go run ./pinnedd agent --dev`")
	}
	for _, b := range blocks {
		if b.Section == blocks[0].Section && strings.TrimSpace(b.Body) == "go test -race -count=1 ./..." {
			return
		}
	}
	t.Errorf("the README's first section must give the test command `go test -race -count=1 ./...`")
}

func randomHex(t *testing.T) string {
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// The harness's own rules, on small inputs: each would let README drift
// through if it broke.
func TestReadmeHarnessRules(t *testing.T) {
	t.Parallel()
	t.Run("unmarked and badly marked blocks fail", func(t *testing.T) {
		md := "## A\n\n```sh\necho hi\n```\n\n<!-- test: run -->\n```sh\necho ok\n```\n\n" +
			"<!-- test: skip -->\n```\nx\n```\n\n<!-- test: server 127.0.0.1:5432 -->\n```sh\nx\n```\n" +
			"<!-- test: sometimes -->\n```sh\nx\n```\n"
		blocks, errs := parseReadme(md)
		if len(blocks) != 1 || blocks[0].Body != "echo ok" || blocks[0].Section != "A" || blocks[0].Line != 8 {
			t.Errorf("blocks = %+v, want the one marked block", blocks)
		}
		if len(errs) != 4 {
			t.Fatalf("errors = %v, want 4: no marker, skip without a reason, server on an unmapped port, unknown kind", errs)
		}
		for i, want := range []string{"README.md:3: block has no", "skip", "server", "unknown kind"} {
			if !strings.Contains(errs[i].Error(), want) {
				t.Errorf("error %d = %v, want it to mention %q", i, errs[i], want)
			}
		}
	})
	t.Run("commands and expected outputs", func(t *testing.T) {
		body := "x=1   # prose\ncurl a   # → {\"v\":1}\n\nnode b.mjs\n#   → ... done\n" +
			"pinnedd agent --x &   # a job\nmake \\\n  all\necho '# → not a comment'"
		cmds, err := splitCommands(body, 10)
		if err != nil {
			t.Fatal(err)
		}
		want := []command{
			{Line: 10, Text: "x=1   # prose"},
			{Line: 11, Text: "curl a", Expect: `{"v":1}`, HasExpect: true},
			{Line: 13, Text: "node b.mjs", Expect: "... done", HasExpect: true},
			{Line: 15, Text: "pinnedd agent --x &   # a job", Background: true},
			{Line: 16, Text: "make \n  all"},
			{Line: 18, Text: "echo '# → not a comment'"},
		}
		if len(cmds) != len(want) {
			t.Fatalf("commands = %+v, want %+v", cmds, want)
		}
		for i := range want {
			if cmds[i] != want[i] {
				t.Errorf("command %d = %+v, want %+v", i, cmds[i], want[i])
			}
		}
		if _, err := splitCommands("# → orphan", 1); err == nil {
			t.Error("an expected output with no command before it was accepted")
		}
	})
	t.Run("output matching", func(t *testing.T) {
		for _, c := range []struct {
			got, want string
			ok        bool
		}{
			{"{\"value\":1}\n", `{"value":1}`, true},
			{`{"value":2}`, `{"value":1}`, false},
			{`{"value":1} `, `{"value":1`, false},
			{"data: {\"tick\":4}\n\ndata: {\"tick\":5}\n", `data: {"tick":...} data: {"tick":...}`, true},
			{"data: {\"tick\":4}\n", `data: {"tick":...} data: {"tick":...}`, false},
			{"user: a\nuser: a | assistant: echo: a\n", "... user: a | assistant: echo: a", true},
			{"user: a | assistant: echo: b", "... user: a | assistant: echo: a", false},
			{"anything", "...", true},
		} {
			if got := outputMatches(c.got, c.want); got != c.ok {
				t.Errorf("outputMatches(%q, %q) = %v, want %v", c.got, c.want, got, c.ok)
			}
		}
	})
	t.Run("ports map one to one, consistently", func(t *testing.T) {
		m := newPortMap(t)
		s := m.apply("a localhost:8080 b 127.0.0.1:8081 c http://127.0.0.1:8080/x d 127.0.0.1:5432 e 10.0.0.1:8080")
		p80, p81 := m.port("8080"), m.port("8081")
		if p80 == p81 || p80 == "8080" || p81 == "8081" {
			t.Fatalf("ports %s %s", p80, p81)
		}
		want := "a localhost:" + p80 + " b 127.0.0.1:" + p81 + " c http://127.0.0.1:" + p80 + "/x d 127.0.0.1:5432 e 10.0.0.1:8080"
		if s != want {
			t.Errorf("apply = %q, want %q", s, want)
		}
	})
	t.Run("database names", func(t *testing.T) {
		d := dbNames{"pinnedd_chat": "pinnedd_chat_readme_x"}
		got := d.apply("createdb pinnedd_chat; postgres://p@h:5432/pinnedd_chat; pinnedd_chats examples/chat")
		if want := "createdb pinnedd_chat_readme_x; postgres://p@h:5432/pinnedd_chat_readme_x; pinnedd_chats examples/chat"; got != want {
			t.Errorf("apply = %q, want %q", got, want)
		}
	})
}
