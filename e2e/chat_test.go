package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pinnedd/pinnedd/internal/testutil"
	"github.com/pinnedd/pinnedd/statestore/pgstore/pgtest"
	"github.com/pinnedd/pinnedd/statewire/client"
	"github.com/pinnedd/pinnedd/statewire/wire"
)

// The chat tests run examples/chat the way the seed's tutorials 2 and 3 do:
// real pinnedd processes, real Postgres, and the Node clients users run.
// Replies stream at chatWordDelay instead of the seed's 50 ms so a
// 200-word echo takes seconds; the host reads CHAT_WORD_DELAY.

const chatWordDelay = "20ms"

var chatEnv = []string{"CHAT_WORD_DELAY=" + chatWordDelay, "PINNEDD_PLUGIN_ENV=CHAT_WORD_DELAY", "PINBOARD_TOKEN=" + testutil.Token}

var (
	chatBuildOnce sync.Once
	chatBinPath   string
	chatBuildErr  error
)

// chatBin builds the standalone chat plugin (testutil builds only its own
// three binaries).
func chatBin(t *testing.T) string {
	t.Helper()
	chatBuildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "pinnedd-chat-")
		if err == nil {
			// The account a root pinnedd runs the plugin as must reach it
			// (MkdirTemp makes the directory 0700).
			err = os.Chmod(dir, 0o755)
		}
		if err != nil {
			chatBuildErr = err
			return
		}
		chatBinPath = filepath.Join(dir, "chat")
		cmd := exec.Command("go", "build", "-o", chatBinPath, "./examples/chat/cmd/chat")
		cmd.Dir = ".."
		if out, err := cmd.CombinedOutput(); err != nil {
			chatBuildErr = fmt.Errorf("go build chat: %w\n%s", err, out)
		}
	})
	if chatBuildErr != nil {
		t.Fatal(chatBuildErr)
	}
	return chatBinPath
}

// nodeProc is a running `node examples/chat/<script>`; the test's cleanup
// kills it (and anything it started) if it is still running.
type nodeProc struct {
	cmd    *exec.Cmd
	mu     sync.Mutex
	lines  []string
	stderr strings.Builder
	notify chan struct{}
	done   chan struct{}
}

func startNode(t *testing.T, script string, env ...string) *nodeProc {
	t.Helper()
	bin, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node is required for the chat clients (Node.js 20): %v", err)
	}
	cmd := exec.Command(bin, filepath.Join("..", "examples", "chat", script))
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p := &nodeProc{cmd: cmd, notify: make(chan struct{}, 1), done: make(chan struct{})}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = &lockedWriter{mu: &p.mu, b: &p.stderr}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start node %s: %v", script, err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		for sc.Scan() {
			p.mu.Lock()
			p.lines = append(p.lines, sc.Text())
			p.mu.Unlock()
			select {
			case p.notify <- struct{}{}:
			default:
			}
		}
		_ = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	})
	return p
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *strings.Builder
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (p *nodeProc) last() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.lines) == 0 {
		return ""
	}
	return p.lines[len(p.lines)-1]
}

func (p *nodeProc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.lines)
	tail := p.lines[max(0, n-5):]
	return fmt.Sprintf("%d lines, last: %q; stderr: %s", n, tail, p.stderr.String())
}

// wait waits for the script to exit and fails unless it exits 0.
func (p *nodeProc) wait(t *testing.T, timeout time.Duration) {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		t.Fatalf("%s still running after %s: %s", p.cmd.Args[1], timeout, p.output())
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("%s exited %d: %s", p.cmd.Args[1], code, p.output())
	}
}

// waitLine waits until a printed line satisfies cond.
func (p *nodeProc) waitLine(t *testing.T, timeout time.Duration, what string, cond func(string) bool) {
	t.Helper()
	deadline := time.After(timeout)
	for {
		if cond(p.last()) {
			return
		}
		select {
		case <-p.notify:
		case <-p.done:
			if cond(p.last()) {
				return
			}
			t.Fatalf("%s exited before %s: %s", p.cmd.Args[1], what, p.output())
		case <-deadline:
			t.Fatalf("%s: no %s within %s: %s", p.cmd.Args[1], what, timeout, p.output())
		}
	}
}

// runNode runs a script to completion and returns its last line.
func runNode(t *testing.T, timeout time.Duration, script string, env ...string) string {
	t.Helper()
	p := startNode(t, script, env...)
	p.wait(t, timeout)
	return p.last()
}

// chatThread mirrors examples/chat's document, for assertions.
type chatThread struct {
	Messages struct {
		MainBranchID string `json:"mainBranchId"`
		Branches     map[string]struct {
			HeadID *string `json:"headId"`
		} `json:"branches"`
		Messages map[string]chatMessage `json:"messages"`
	} `json:"messages"`
	Threads map[string]struct {
		Status string `json:"status"`
	} `json:"threads"`
}

type chatMessage struct {
	ID       string  `json:"id"`
	Role     string  `json:"role"`
	ParentID *string `json:"parentId"`
	Parts    []struct {
		Type  string `json:"type"`
		Text  string `json:"text"`
		State string `json:"state"`
	} `json:"parts"`
}

func (th chatThread) status() string { return th.Threads["main"].Status }

// transcript follows the main branch's parent links.
func (th chatThread) transcript() []chatMessage {
	var out []chatMessage
	head := th.Messages.Branches[th.Messages.MainBranchID].HeadID
	for id := head; id != nil && len(out) <= len(th.Messages.Messages); {
		m, ok := th.Messages.Messages[*id]
		if !ok {
			break
		}
		out = append([]chatMessage{m}, out...)
		id = m.ParentID
	}
	return out
}

func (m chatMessage) text() string {
	var b strings.Builder
	for _, p := range m.Parts {
		b.WriteString(p.Text)
	}
	return strings.TrimSpace(b.String())
}

// line is the transcript line smoke.mjs and attach.mjs print.
func (th chatThread) line() string {
	var parts []string
	for _, m := range th.transcript() {
		parts = append(parts, m.Role+": "+m.text())
	}
	return strings.Join(parts, " | ")
}

// waitThread waits until the attached copy of the thread satisfies cond.
func waitThread(t *testing.T, s *client.Session, timeout time.Duration, what string, cond func(chatThread) bool) chatThread {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var th chatThread
	err := s.Wait(ctx, func(s *client.Session) bool {
		if st := s.Stats(); !st.Attached {
			return false
		}
		th = chatThread{}
		return s.Decode(&th) == nil && cond(th)
	})
	if err != nil {
		t.Fatalf("%s: %v; thread now: %q (%s)", what, err, th.line(), th.status())
	}
	return th
}

func echoOf(msg string) string { return "echo: " + strings.Join(strings.Fields(msg), " ") }

// streamingReply: the second turn's reply has begun.
func streamingReply(th chatThread) bool {
	m := th.transcript()
	return len(m) == 4 && m[3].Role == "assistant" && streamedWords(th.line()) >= 1
}

// streamedWords counts the words of the last assistant message so far.
func streamedWords(line string) int {
	i := strings.LastIndex(line, "assistant: ")
	if i < 0 {
		return 0
	}
	return len(strings.Fields(line[i:])) - 1
}

// The seed's tutorial 2 in Go: a durable thread on --dev with Postgres
// survives SIGTERM and kill -9 of pinnedd; a reply cut off mid-stream
// restarts from its first word under the same message id and completes.
func TestTutorial2DurableChat(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t)
	args := []string{"--dev", "--database-url", dsn, "--scan-interval", "200ms"}
	env := append([]string{"PINNEDD_DRAIN_DEADLINE=2s"}, chatEnv...)
	tutorial2(t, dsn, env, args)
}

// tutorial2 runs the scenario of TestTutorial2DurableChat on agents started
// with env and args (its chat host at /threads, its state in dsn).
func tutorial2(t *testing.T, dsn string, env, args []string) {
	t.Helper()
	a := testutil.StartAgent(t, env, args...)
	url := a.URL + "/threads/t1"

	first := "user: remember me | assistant: echo: remember me"
	if got := runNode(t, 60*time.Second, "smoke.mjs", "URL="+url, "MESSAGE=remember me"); got != first {
		t.Fatalf("smoke.mjs last line %q, want %q", got, first)
	}

	// Stop with SIGTERM (Ctrl+C), start again, attach: the same transcript.
	a.Signal(syscall.SIGTERM)
	if code, err := a.Wait(30 * time.Second); err != nil || code != 0 {
		t.Fatalf("pinnedd after SIGTERM: code %d, %v", code, err)
	}
	b := testutil.StartAgent(t, env, args...)
	url = b.URL + "/threads/t1"
	if got := runNode(t, 60*time.Second, "attach.mjs", "URL="+url); got != first {
		t.Fatalf("attach.mjs after restart: %q, want %q", got, first)
	}

	// A long turn, and kill -9 of pinnedd once several words streamed.
	long := strings.Repeat("recover ", 200)
	watch := client.New(url).Attach(t.Context())
	defer watch.Close()
	smoke := startNode(t, "smoke.mjs", "URL="+url, "MESSAGE="+long)
	smoke.waitLine(t, 60*time.Second, "several streamed words", func(l string) bool {
		return strings.Contains(l, "| user: recover") && streamedWords(l) >= 5
	})
	// The id the reply streams under, as a watcher sees it.
	cut := waitThread(t, watch, 10*time.Second, "watcher sees the reply", streamingReply).transcript()
	b.Signal(syscall.SIGKILL)
	if _, err := b.Wait(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	replyID, cutText := cut[3].ID, cut[3].text()
	if cutText == echoOf(long) {
		t.Fatalf("the reply finished before the kill; nothing was interrupted")
	}
	_ = syscall.Kill(-smoke.cmd.Process.Pid, syscall.SIGINT) // Ctrl+C
	watch.Close()

	c := testutil.StartAgent(t, env, args...)
	url = c.URL + "/threads/t1"
	// Watch the restart from the first snapshot to see where it resumes.
	watch = client.New(url).Attach(t.Context())
	defer watch.Close()
	recovered := first + " | user: " + strings.TrimSpace(long) + " | assistant: " + echoOf(long)
	if got := runNode(t, 60*time.Second, "attach.mjs", "URL="+url); got != recovered {
		t.Fatalf("attach.mjs after kill -9:\n got %q\nwant %q", got, recovered)
	}
	th := waitThread(t, watch, 10*time.Second, "recovered thread", func(th chatThread) bool { return th.line() == recovered })
	msgs := th.transcript()
	roles := []string{}
	for _, m := range msgs {
		roles = append(roles, m.Role)
	}
	if strings.Join(roles, ",") != "user,assistant,user,assistant" {
		t.Fatalf("roles %v", roles)
	}
	if msgs[3].ID != replyID {
		t.Fatalf("the reply continued under %s, want the interrupted %s", msgs[3].ID, replyID)
	}
	if msgs[1].text() != "echo: remember me" {
		t.Fatalf("the earlier reply changed: %q", msgs[1].text())
	}
	assertRestartedFromFirstWord(t, watch, replyID)

	// A new turn extends the recovered conversation.
	want := recovered + " | user: after recovery | assistant: echo: after recovery"
	if got := runNode(t, 60*time.Second, "smoke.mjs", "URL="+url, "MESSAGE=after recovery"); got != want {
		t.Fatalf("after recovery:\n got %q\nwant %q", got, want)
	}

	// The chat log is one unmarked tray row; the runs settled.
	testutil.WaitFor(t, 10*time.Second, "log tray row, nothing marked", func() bool {
		rows := trayRows(t, dsn, "/threads", "t1")
		return rows["log/~"] == "false" && !strings.Contains(fmt.Sprint(rows), "true")
	})
}

// assertRestartedFromFirstWord checks what the session saw after attaching
// to the restarted instance: the reply's text reset to "" and the first
// word appended to it was "echo:".
func assertRestartedFromFirstWord(t *testing.T, s *client.Session, replyID string) {
	t.Helper()
	textPath := fmt.Sprint(wire.Path{"messages", "messages", replyID, "parts", 0, "text"})
	var firstAppend string
	for _, f := range s.Stats().Ops {
		for _, op := range f.Ops {
			if op.Op == wire.OpAppend && fmt.Sprint(op.Path) == textPath && firstAppend == "" {
				firstAppend = op.Text
			}
		}
	}
	if s.Stats().Snapshots == 0 || firstAppend != "echo:" {
		t.Fatalf("restarted reply: first appended word %q, want \"echo:\" (snapshots %d)", firstAppend, s.Stats().Snapshots)
	}
}

// trayRows reads pinned_tray_index for one instance: "trayNs/trayId" ->
// marked.
func trayRows(t *testing.T, dsn, ns, id string) map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect %s: %v", dsn, err)
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, `SELECT ns, id, tray_ns, tray_id, marked FROM pinned_tray_index WHERE ns = $1 AND id = $2`, ns, id)
	if err != nil {
		t.Fatalf("query pinned_tray_index: %v", err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var rns, rid, tns, tid string
		var marked bool
		if err := rows.Scan(&rns, &rid, &tns, &tid, &marked); err != nil {
			t.Fatal(err)
		}
		out[tns+"/"+tid] = fmt.Sprint(marked)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// The seed's tutorial 3: two workers behind a host-less front door share
// Postgres; kill -9 the worker streaming a reply and the survivor finishes
// it after the lease expires.
func TestTutorial3FleetChat(t *testing.T) {
	t.Parallel()
	tutorial3(t, chatEnv, "--plugin", "/threads="+chatBin(t))
}

// tutorial3 runs the scenario of TestTutorial3FleetChat: a front door and
// two workers started with env, whose args (chat plugin flags) give
// /threads.
func tutorial3(t *testing.T, env []string, chatArgs ...string) {
	t.Helper()
	dsn := pgtest.NewDatabase(t)
	pb := newNode(t, "pb", "--bootstrap")
	pb.args = append(removePlugin(pb.args), "--no-hosts")
	pb.a = testutil.StartAgent(t, env, pb.args...)
	var workers []*node
	for _, id := range []string{"w1", "w2"} {
		w := newNode(t, id, append([]string{"--join", pb.url(), "--database-url", dsn}, chatArgs...)...)
		w.a = testutil.StartAgent(t, env, w.args...)
		workers = append(workers, w)
	}
	testutil.WaitFor(t, 10*time.Second, "two workers", func() bool { return len(liveWorkers(t, pb)) == 2 })
	url := pb.url() + "/threads/fleet-t1"

	// smoke.mjs waits out the cold-start quarantine (503 + Retry-After).
	first := "user: remember me | assistant: echo: remember me"
	if got := runNode(t, 60*time.Second, "smoke.mjs", "URL="+url, "MESSAGE=remember me"); got != first {
		t.Fatalf("smoke.mjs through the front door: %q, want %q", got, first)
	}

	long := strings.Repeat("recover ", 200)
	watch := client.New(url).Attach(t.Context())
	defer watch.Close()
	smoke := startNode(t, "smoke.mjs", "URL="+url, "MESSAGE="+long)
	smoke.waitLine(t, 60*time.Second, "several streamed words", func(l string) bool {
		return strings.Contains(l, "| user: recover") && streamedWords(l) >= 5
	})
	owner := ownerOf(t, workers, "/threads", "fleet-t1")
	if owner == nil {
		t.Fatal("no worker runs fleet-t1")
	}
	cut := waitThread(t, watch, 10*time.Second, "watcher sees the reply", streamingReply).transcript()
	replyID := cut[3].ID
	owner.a.Signal(syscall.SIGKILL)
	if _, err := owner.a.Wait(10 * time.Second); err != nil {
		t.Fatal(err)
	}

	// The same smoke.mjs reconnects through the front door and sees the
	// survivor finish the echo.
	recovered := first + " | user: " + strings.TrimSpace(long) + " | assistant: " + echoOf(long)
	smoke.wait(t, 60*time.Second)
	if got := smoke.last(); got != recovered {
		t.Fatalf("smoke.mjs across the failover:\n got %q\nwant %q", got, recovered)
	}
	if got := runNode(t, 30*time.Second, "attach.mjs", "URL="+url); got != recovered {
		t.Fatalf("attach.mjs after failover:\n got %q\nwant %q", got, recovered)
	}
	var survivor *node
	for _, w := range workers {
		if w != owner {
			survivor = w
		}
	}
	if ownerOf(t, []*node{survivor}, "/threads", "fleet-t1") != survivor {
		t.Fatalf("fleet-t1 is not on the survivor %s", survivor.id)
	}
	th := waitThread(t, watch, 10*time.Second, "watcher sees the recovery", func(th chatThread) bool { return th.line() == recovered })
	if msgs := th.transcript(); msgs[3].ID != replyID {
		t.Fatalf("reply continued under %s, want %s", msgs[3].ID, replyID)
	}
	want := recovered + " | user: after failover | assistant: echo: after failover"
	if got := runNode(t, 30*time.Second, "smoke.mjs", "URL="+url, "MESSAGE=after failover"); got != want {
		t.Fatalf("after failover:\n got %q\nwant %q", got, want)
	}
}

// Protocol behaviour against a real pinnedd (--dev, embedded store).
func TestStatewireProtocol(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "data")
	addr := testutil.FreeAddr(t)
	args := []string{"--dev", "--data-dir", dir, "--http-addr", addr}
	env := append([]string{"PINNEDD_DRAIN_DEADLINE=1s"}, chatEnv...)
	a := testutil.StartAgent(t, env, args...)
	ctx := t.Context()

	t.Run("ResentFrameIsAckedNotReapplied", func(t *testing.T) {
		c := client.New(a.URL + "/threads/dedup")
		s := c.Attach(ctx)
		defer s.Close()
		body := []byte(`{"clientId":"` + c.ID() + `","frames":[{"seq":1,"type":"send","message":{"id":"u-1","parts":[{"type":"text","text":"once only"}]}}]}`)
		r1, err := c.PostFrames(ctx, body)
		if err != nil || r1.Acked != 1 || r1.Admitted != 1 {
			t.Fatalf("first post: %+v %v", r1, err)
		}
		r2, err := c.PostFrames(ctx, body)
		if err != nil || r2.Acked != 1 || r2.Admitted != 0 || r2.Duplicates != 1 {
			t.Fatalf("resent frame: %+v %v", r2, err)
		}
		th := waitThread(t, s, 20*time.Second, "reply", func(th chatThread) bool {
			return th.status() == "idle" && strings.HasSuffix(th.line(), "assistant: echo: once only")
		})
		if got := th.line(); got != "user: once only | assistant: echo: once only" {
			t.Fatalf("thread after a resent frame: %q", got)
		}
	})

	t.Run("BadFramesAre4xxAndAdmitNothing", func(t *testing.T) {
		c := client.New(a.URL + "/threads/bad")
		id := c.ID()
		send := `{"seq":1,"type":"send","message":{"parts":[{"type":"text","text":"x"}]}}`
		for _, tc := range []struct {
			body string
			code int
		}{
			{`{`, 400},
			{`[]`, 400},
			{`{"frames":[` + send + `]}`, 400},
			{`{"clientId":"","frames":[` + send + `]}`, 400},
			{`{"clientId":"has space","frames":[` + send + `]}`, 400},
			{`{"clientId":"` + id + `"}`, 400},
			{`{"clientId":"` + id + `","frames":[]}`, 400},
			{`{"clientId":"` + id + `","frames":[{"type":"send"}]}`, 400},
			{`{"clientId":"` + id + `","frames":[{"seq":0,"type":"cancel"}]}`, 400},
			{`{"clientId":"` + id + `","frames":[{"seq":-1,"type":"cancel"}]}`, 400},
			{`{"clientId":"` + id + `","frames":[{"seq":1.5,"type":"cancel"}]}`, 400},
			{`{"clientId":"` + id + `","frames":[{"seq":"1","type":"cancel"}]}`, 400},
			{`{"clientId":"` + id + `","frames":[{"seq":1,"type":"launch"}]}`, 400},
			{`{"clientId":"` + id + `","frames":[{"seq":1}]}`, 400},
			{`{"clientId":"` + id + `","frames":[{"seq":1,"type":"send"}]}`, 400},
			{`{"clientId":"` + id + `","frames":[{"seq":1,"type":"send","message":{"role":"assistant","parts":[{"type":"text","text":"x"}]}}]}`, 400},
			// One bad frame spoils the request: the good one before it is
			// not admitted either.
			{`{"clientId":"` + id + `","frames":[` + send + `,{"seq":2,"type":"launch"}]}`, 400},
			{`{"clientId":"` + id + `","frames":[` + send + `,` + send + `]}`, 400},
			{`{"clientId":"` + id + `","frames":[` + send + `]} {}`, 400},
			{`{"clientId":"` + id + `","frames":[{"seq":1,"type":"send","message":{"parts":[{"type":"text","text":"` + strings.Repeat("x", 300<<10) + `"}]}}]}`, 413},
		} {
			r, err := c.PostFrames(ctx, []byte(tc.body))
			var he *client.HTTPError
			if err == nil || !asHTTPError(err, &he) || he.Code != tc.code || he.Message == "" {
				b := tc.body
				if len(b) > 120 {
					b = b[:120] + "..."
				}
				t.Errorf("POST %s: %+v %v, want %d with an error", b, r, err, tc.code)
			}
		}
		// Nothing was admitted: the client's first valid frame is seq 1,
		// and the thread holds only it.
		s := c.Attach(ctx)
		defer s.Close()
		r, err := c.PostFrames(ctx, []byte(`{"clientId":"`+id+`","frames":[`+send+`]}`))
		if err != nil || r.Admitted != 1 || r.Duplicates != 0 {
			t.Fatalf("first valid frame after bad ones: %+v %v", r, err)
		}
		th := waitThread(t, s, 20*time.Second, "reply", func(th chatThread) bool {
			return th.status() == "idle" && len(th.transcript()) == 2
		})
		if got := th.line(); got != "user: x | assistant: echo: x" {
			t.Fatalf("thread: %q", got)
		}
	})

	t.Run("TwoStreamsSeeTheSameOps", func(t *testing.T) {
		c := client.New(a.URL + "/threads/two")
		s1, s2 := c.Attach(ctx), client.New(a.URL+"/threads/two").Attach(ctx)
		defer s1.Close()
		defer s2.Close()
		for _, s := range []*client.Session{s1, s2} {
			waitThread(t, s, 10*time.Second, "attached", func(chatThread) bool { return true })
		}
		if _, err := c.Send(ctx, "send", map[string]any{"message": map[string]any{"parts": []any{map[string]any{"type": "text", "text": "one two three"}}}}); err != nil {
			t.Fatal(err)
		}
		done := func(th chatThread) bool {
			return th.status() == "idle" && th.line() == "user: one two three | assistant: echo: one two three"
		}
		waitThread(t, s1, 20*time.Second, "s1 sees the reply", done)
		waitThread(t, s2, 20*time.Second, "s2 sees the reply", done)
		o1, _ := json.Marshal(s1.Stats().Ops)
		o2, _ := json.Marshal(s2.Stats().Ops)
		if string(o1) != string(o2) || !strings.Contains(string(o1), `"op":"append"`) {
			t.Fatalf("streams differ:\n%s\n%s", o1, o2)
		}
	})

	t.Run("CancelStopsTheRun", func(t *testing.T) {
		c := client.New(a.URL + "/threads/cancel")
		s := c.Attach(ctx)
		defer s.Close()
		long := strings.Repeat("word ", 500)
		if _, err := c.Send(ctx, "send", map[string]any{"message": map[string]any{"parts": []any{map[string]any{"type": "text", "text": long}}}}); err != nil {
			t.Fatal(err)
		}
		waitThread(t, s, 20*time.Second, "streaming", func(th chatThread) bool { return streamedWords(th.line()) >= 3 })
		if _, err := c.Send(ctx, "cancel", nil); err != nil {
			t.Fatal(err)
		}
		th := waitThread(t, s, 20*time.Second, "idle after cancel", func(th chatThread) bool { return th.status() == "idle" })
		if n := streamedWords(th.line()); n >= 500 {
			t.Fatalf("cancel did not stop the reply (%d words)", n)
		}
	})

	// Last, since it stops the agent (which comes back on the same address,
	// so the subtests before it may run alone, or after it): a drain evicts
	// the instance under an open stream (fin evicted, reconnect true); the
	// session reconnects to the restarted node and starts over from a fresh
	// snapshot holding what the thread held. Its own thread, written here:
	// no subtest depends on another's.
	t.Run("FinOnEvictionThenFreshSnapshot", func(t *testing.T) {
		c := client.New(a.URL + "/threads/fin")
		s := c.Attach(ctx)
		defer s.Close()
		if _, err := c.Send(ctx, "send", map[string]any{"message": map[string]any{"parts": []any{map[string]any{"type": "text", "text": "kept"}}}}); err != nil {
			t.Fatal(err)
		}
		before := waitThread(t, s, 20*time.Second, "the reply", func(th chatThread) bool {
			return th.status() == "idle" && th.line() == "user: kept | assistant: echo: kept"
		})
		epoch := s.Stats().Epoch
		a.Signal(syscall.SIGTERM)
		if err := s.Wait(ctx, func(s *client.Session) bool { return len(s.Stats().Fins) > 0 }); err != nil {
			t.Fatal(err)
		}
		fin := s.Stats().Fins[0]
		if fin.Code != wire.FinEvicted || fin.Reconnect == nil || !*fin.Reconnect {
			t.Fatalf("fin %+v, want evicted with reconnect", fin)
		}
		if code, err := a.Wait(30 * time.Second); err != nil || code != 0 {
			t.Fatalf("pinnedd after SIGTERM: %d %v", code, err)
		}
		testutil.StartAgent(t, env, args...)
		after := waitThread(t, s, 30*time.Second, "reattached", func(chatThread) bool {
			st := s.Stats()
			return st.Snapshots >= 2 && st.Epoch != epoch
		})
		if after.line() != before.line() {
			t.Fatalf("after reconnect %q, before %q", after.line(), before.line())
		}
	})
}

func asHTTPError(err error, target **client.HTTPError) bool { return errors.As(err, target) }
