package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testutil"
)

// This file is the README harness's machinery: parsing README.md into
// marked blocks and commands, the port and database substitutions, output
// matching, and the bash session that runs a section. TestReadme
// (readme_test.go) states the rules; the code here applies them.

// mdBlock is one fenced block of the README with the marker before it.
type mdBlock struct {
	Section string // the "## " heading the block is under
	Line    int    // 1-based line of its opening fence
	Lang    string
	Body    string
	Marker  marker
}

// marker is a parsed `<!-- test: KIND ARG -->` comment.
type marker struct {
	Kind string // "run", "server", "restart", "file" or "skip"
	Arg  string // server, restart: the address as written; file: the name; skip: the reason
}

var markerRe = regexp.MustCompile(`^<!--\s*test:\s*(.*?)\s*-->$`)

// parseMarker reads the inside of a marker comment.
func parseMarker(s string) (marker, error) {
	kind, arg, _ := strings.Cut(strings.TrimSpace(s), " ")
	arg = strings.TrimSpace(arg)
	switch kind {
	case "run":
		if arg != "" {
			return marker{}, fmt.Errorf("`run` takes no argument, got %q", arg)
		}
	case "server", "restart":
		if !addrRe.MatchString(arg) || addrRe.FindString(arg) != arg {
			return marker{}, fmt.Errorf("`%s` needs the address it listens on as written (127.0.0.1:PORT or localhost:PORT, PORT 8000-8999), got %q", kind, arg)
		}
	case "file":
		if arg == "" || strings.ContainsAny(arg, " /") {
			return marker{}, fmt.Errorf("`file` needs a plain file name, got %q", arg)
		}
	case "skip":
		if !strings.HasPrefix(arg, "(") || !strings.HasSuffix(arg, ")") || len(arg) < 3 {
			return marker{}, fmt.Errorf("`skip` needs a reason in parentheses, got %q", arg)
		}
		arg = arg[1 : len(arg)-1]
	default:
		return marker{}, fmt.Errorf("unknown kind %q (run, server ADDR, restart ADDR, file NAME, skip (REASON))", kind)
	}
	return marker{Kind: kind, Arg: arg}, nil
}

// parseReadme returns every fenced block of a README with its marker, and
// one error per block without a valid one: the last non-blank line before
// a block's opening fence must be its marker.
func parseReadme(text string) ([]mdBlock, []error) {
	var blocks []mdBlock
	var errs []error
	lines := strings.Split(text, "\n")
	section := ""
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		if h, ok := strings.CutPrefix(line, "## "); ok {
			section = strings.TrimSpace(h)
		}
		fence, ok := strings.CutPrefix(line, "```")
		if !ok {
			continue
		}
		b := mdBlock{Section: section, Line: i + 1, Lang: strings.TrimSpace(fence)}
		var body []string
		for i++; i < len(lines) && !strings.HasPrefix(lines[i], "```"); i++ {
			body = append(body, lines[i])
		}
		if i == len(lines) {
			errs = append(errs, fmt.Errorf("README.md:%d: block never closed", b.Line))
			break
		}
		b.Body = strings.Join(body, "\n")
		m := markerRe.FindStringSubmatch(lastNonBlank(lines[:b.Line-1]))
		if m == nil {
			errs = append(errs, fmt.Errorf("README.md:%d: block has no `<!-- test: ... -->` marker on the line before it (run, server ADDR, file NAME or skip (REASON))", b.Line))
			continue
		}
		mk, err := parseMarker(m[1])
		if err != nil {
			errs = append(errs, fmt.Errorf("README.md:%d: marker: %w", b.Line, err))
			continue
		}
		b.Marker = mk
		blocks = append(blocks, b)
	}
	return blocks, errs
}

func lastNonBlank(lines []string) string {
	for i := len(lines) - 1; i >= 0; i-- {
		if s := strings.TrimSpace(lines[i]); s != "" {
			return s
		}
	}
	return ""
}

// command is one shell command of a block, with the output it must print.
type command struct {
	Line       int    // 1-based line in the README
	Text       string // as written (continuations joined), substitutions not yet applied
	Expect     string // from a `# →` comment
	HasExpect  bool
	Background bool // ends with `&`
}

// expectMark introduces an expected output in a comment.
const expectMark = "# →"

// splitCommands cuts a block body into commands: one a line, a line ending
// in `\` continued on the next; blank and comment lines are not commands,
// except a `# → OUTPUT` line, which is the expected output of the command
// just before it. first is the README line of the body's first line.
func splitCommands(body string, first int) ([]command, error) {
	var cmds []command
	lines := strings.Split(body, "\n")
	for i := 0; i < len(lines); i++ {
		n := first + i
		line := lines[i]
		for strings.HasSuffix(line, `\`) && i+1 < len(lines) {
			i++
			line = strings.TrimSuffix(line, `\`) + "\n" + lines[i]
		}
		trimmed := strings.TrimSpace(line)
		if trimmed == "" {
			continue
		}
		if strings.HasPrefix(trimmed, "#") {
			want, ok := expectedOutput(trimmed)
			if !ok {
				continue
			}
			if len(cmds) == 0 || cmds[len(cmds)-1].HasExpect {
				return nil, fmt.Errorf("README.md:%d: a %q line must follow a command that has no expected output yet", n, expectMark)
			}
			cmds[len(cmds)-1].Expect, cmds[len(cmds)-1].HasExpect = want, true
			continue
		}
		c := command{Line: n, Text: line}
		code := stripComment(line)
		if want, ok := expectedOutput(line[len(code):]); ok {
			c.Text = strings.TrimRight(code, " \t")
			c.Expect, c.HasExpect = want, true
		}
		code = strings.TrimSpace(code)
		c.Background = strings.HasSuffix(code, "&") && !strings.HasSuffix(code, "&&")
		cmds = append(cmds, c)
	}
	return cmds, nil
}

// expectedOutput reads a comment of the form `# → OUTPUT` (any spaces
// between # and →).
func expectedOutput(comment string) (string, bool) {
	rest, ok := strings.CutPrefix(comment, "#")
	if !ok {
		return "", false
	}
	want, ok := strings.CutPrefix(strings.TrimLeft(rest, " \t"), "→")
	return strings.TrimSpace(want), ok
}

// stripComment drops a shell comment: a `#` that starts a word outside
// quotes, and what follows it.
func stripComment(s string) string {
	var quote byte
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			} else if c == '\\' && quote == '"' {
				i++
			}
		case c == '\'' || c == '"':
			quote = c
		case c == '\\':
			i++
		case c == '#' && (i == 0 || s[i-1] == ' ' || s[i-1] == '\t'):
			return s[:i]
		}
	}
	return s
}

// outputMatches applies the README's output rule: both sides trimmed, every
// run of white space (newlines included) compared as one space, and each
// `...` in want standing for any text, possibly empty; the rest must be
// equal.
func outputMatches(got, want string) bool {
	norm := func(s string) string { return strings.Join(strings.Fields(s), " ") }
	parts := strings.Split(norm(want), "...")
	for i, p := range parts {
		parts[i] = regexp.QuoteMeta(p)
	}
	return regexp.MustCompile(`(?s)^` + strings.Join(parts, `.*`) + `$`).MatchString(norm(got))
}

// addrRe is a README address whose port the harness replaces.
var addrRe = regexp.MustCompile(`\b(127\.0\.0\.1|localhost):(8\d{3})\b`)

// portMap gives each README port (8000-8999 after 127.0.0.1: or
// localhost:) one free port, the same for the whole README run.
type portMap struct {
	t     testing.TB
	ports map[string]string
}

func newPortMap(t testing.TB) *portMap { return &portMap{t: t, ports: map[string]string{}} }

// port returns the free port standing for the README's port p.
func (m *portMap) port(p string) string {
	if free, ok := m.ports[p]; ok {
		return free
	}
	_, free, err := splitHostPort(testutil.FreeAddr(m.t))
	if err != nil {
		m.t.Fatal(err)
	}
	m.ports[p] = free
	return free
}

func splitHostPort(addr string) (string, string, error) {
	i := strings.LastIndexByte(addr, ':')
	if i < 0 {
		return "", "", fmt.Errorf("no port in %q", addr)
	}
	return addr[:i], addr[i+1:], nil
}

// apply rewrites every README address in s to its free port.
func (m *portMap) apply(s string) string {
	return addrRe.ReplaceAllStringFunc(s, func(a string) string {
		sub := addrRe.FindStringSubmatch(a)
		return sub[1] + ":" + m.port(sub[2])
	})
}

// dbNames gives each README database name a name unique to this run; the
// harness drops the database when the test ends.
type dbNames map[string]string

func (d dbNames) apply(s string) string {
	for readme, real := range d {
		s = regexp.MustCompile(`\b`+regexp.QuoteMeta(readme)+`\b`).ReplaceAllString(s, real)
	}
	return s
}

// copyModule copies the module's files (tracked, and untracked unless
// ignored: the work tree under test) into dir.
func copyModule(t testing.TB, root, dir string) {
	t.Helper()
	out, err := exec.Command("git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard").Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	for _, name := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		src := filepath.Join(root, name)
		fi, err := os.Lstat(src)
		if err != nil || !fi.Mode().IsRegular() {
			continue // deleted in the work tree, or not a file
		}
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, b, fi.Mode().Perm()); err != nil {
			t.Fatal(err)
		}
	}
}

// shellEnv is the environment a section's shell starts with: the test's,
// without what would change what the README's commands do (a CI's
// DATABASE_URL would move the quick start onto Postgres), plus the CLI's
// and the agent's default address mapped like a written 127.0.0.1:8080,
// and a tag that marks every process the README starts.
func shellEnv(ports *portMap, tag string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case strings.HasPrefix(k, "PINNEDD_"), strings.HasPrefix(k, "PINBOARD_"):
		case k == "DATABASE_URL", k == "ADVERTISE_URL", k == "LOG_LEVEL", k == "NODE_ENV",
			k == "ENVIRONMENT", k == "APP_ENV", k == "URL", k == "MESSAGE", k == "TIMEOUT_MS":
		default:
			env = append(env, kv)
		}
	}
	def := "127.0.0.1:" + ports.port("8080")
	return append(env, "PINNEDD_ADDR="+def, "PINNEDD_HTTP_ADDR="+def, readmeTagVar+"="+tag)
}

// readmeTagVar marks the environment of every process a README run
// starts, so that the test can find any it left behind.
const readmeTagVar = "PINNEDD_README_RUN"

// tagged lists live processes whose environment carries the run's tag.
func tagged(tag string) []int {
	want := []byte(readmeTagVar + "=" + tag + "\x00")
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err == nil && bytes.Contains(env, want) && testutil.Alive(pid) {
			out = append(out, pid)
		}
	}
	return out
}

// groupMembers lists live processes in process group pgid.
func groupMembers(pgid int) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if g, err := syscall.Getpgid(pid); err == nil && g == pgid && testutil.Alive(pid) {
			out = append(out, pid)
		}
	}
	return out
}

// shell is one bash process running a README section: a reader's terminal.
// Commands go in on its stdin, one at a time; each one's stdout goes to a
// file of its own, stderr to the section's log; the shell acknowledges
// each with its exit status on a pipe (fd 3). Job control is on, so every
// background command is a process group of its own, as in a terminal.
type shell struct {
	t    *testing.T
	cmd  *exec.Cmd
	in   *os.File
	acks chan string
	out  string // directory of the commands' stdout files
	log  string // stderr of the shell and everything it starts
	n    int
	jobs []job
	// servers maps a server block's address (as written) to its job.
	servers map[string]job
	ports   *portMap
	dbs     dbNames
}

// job is a background command: a process group led by pid.
type job struct {
	pid  int
	line int
	text string
}

func startShell(t *testing.T, dir string, env []string, ports *portMap, dbs dbNames) *shell {
	t.Helper()
	out := t.TempDir()
	s := &shell{t: t, out: out, log: filepath.Join(out, "shell.log"), acks: make(chan string, 16), servers: map[string]job{}, ports: ports, dbs: dbs}
	logf, err := os.Create(s.log)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	inR, inW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	ackR, ackW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	s.cmd = exec.Command("bash", "--noprofile", "--norc", "-s")
	s.cmd.Dir, s.cmd.Env = dir, env
	s.cmd.Stdin, s.cmd.Stdout, s.cmd.Stderr = inR, logf, logf
	s.cmd.ExtraFiles = []*os.File{ackW}
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("start bash: %v", err)
	}
	inR.Close()
	ackW.Close()
	s.in = inW
	go func() {
		sc := bufio.NewScanner(ackR)
		for sc.Scan() {
			s.acks <- sc.Text()
		}
		close(s.acks)
		ackR.Close()
	}()
	s.send("set -m\n__o=" + shellQuote(out) + "\n")
	t.Cleanup(func() {
		if s.in != nil {
			s.stop(45 * time.Second)
		}
	})
	return s
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func (s *shell) send(script string) {
	if _, err := s.in.WriteString(script); err != nil {
		s.t.Fatalf("write to bash: %v\n%s", err, s.logTail())
	}
}

// ack waits for the shell's acknowledgement of command n: its exit status
// and, for a background command, the job's pid.
func (s *shell) ack(n int, timeout time.Duration, what string) (rc, pid int) {
	s.t.Helper()
	select {
	case line, ok := <-s.acks:
		if !ok {
			s.t.Fatalf("bash exited during %s\n%s", what, s.logTail())
		}
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != strconv.Itoa(n) {
			s.t.Fatalf("bash acknowledged %q, want command %d", line, n)
		}
		rc, _ = strconv.Atoi(f[1])
		if len(f) > 2 {
			pid, _ = strconv.Atoi(f[2])
		}
		return rc, pid
	case <-time.After(timeout):
		s.t.Fatalf("%s did not finish within %s\n%s", what, timeout, s.logTail())
		return 0, 0
	}
}

// run runs one command as written, substitutions applied, and checks its
// exit status and expected output. A background command becomes a job.
func (s *shell) run(c command, timeout time.Duration) {
	s.t.Helper()
	s.n++
	text := s.dbs.apply(s.ports.apply(c.Text))
	what := fmt.Sprintf("README.md:%d `%s`", c.Line, c.Text)
	outFile := filepath.Join(s.out, strconv.Itoa(s.n)+".out")
	// The group runs in this shell (cd and export persist); stdin is not
	// the script, fd 3 is not inherited.
	s.send(fmt.Sprintf("{ %s\n} </dev/null >\"$__o/%d.out\" 3>&-; echo \"%d $? $!\" >&3\n", text, s.n, s.n))
	rc, pid := s.ack(s.n, timeout, what)
	out, _ := os.ReadFile(outFile)
	if rc != 0 {
		s.t.Fatalf("%s exited %d\nstdout:\n%s\n%s", what, rc, out, s.logTail())
	}
	if c.Background {
		s.jobs = append(s.jobs, job{pid: pid, line: c.Line, text: c.Text})
		return
	}
	if c.HasExpect && !outputMatches(string(out), s.ports.apply(c.Expect)) {
		s.t.Fatalf("%s printed\n%s\nwant (README rule: trimmed, white space runs as one space, ... for any text)\n%s\n%s", what, out, c.Expect, s.logTail())
	}
}

// writeFile writes a file block into the shell's current directory.
func (s *shell) writeFile(name, body string, line int) {
	s.t.Helper()
	s.n++
	const eof = "README_HARNESS_EOF"
	if strings.Contains(body, eof) {
		s.t.Fatalf("README.md:%d: the block contains %s", line, eof)
	}
	s.send(fmt.Sprintf("cat >%s <<'%s'\n%s\n%s\necho \"%d $?\" >&3\n", shellQuote(name), eof, body, eof, s.n))
	if rc, _ := s.ack(s.n, 10*time.Second, "writing "+name); rc != 0 {
		s.t.Fatalf("README.md:%d: writing %s failed\n%s", line, name, s.logTail())
	}
}

// waitReady polls http://addr/readyz until it answers 200, failing early
// if the job serving it ended.
func (s *shell) waitReady(addr string, j job, timeout time.Duration) {
	s.t.Helper()
	url := "http://" + addr + "/readyz"
	err := testutil.Eventually(timeout, func() bool {
		if !testutil.Alive(j.pid) {
			return true
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		r, err := testutil.Do(ctx, http.MethodGet, url, "", nil)
		return err == nil && r.Code == http.StatusOK
	})
	if !testutil.Alive(j.pid) {
		s.t.Fatalf("README.md:%d `%s` exited before %s answered 200\n%s", j.line, j.text, url, s.logTail())
	}
	if err != nil {
		s.t.Fatalf("README.md:%d `%s`: %s not 200: %v\n%s", j.line, j.text, url, err, s.logTail())
	}
}

// kill9 ends the server at addr as `kill -9` would (its whole process
// group: `go run` and the agent), and waits until it and its plugins are
// gone.
func (s *shell) kill9(addr string, line int) {
	s.t.Helper()
	j, ok := s.servers[addr]
	if !ok {
		s.t.Fatalf("README.md:%d: no server block started %s before this restart", line, addr)
	}
	var procs []int
	for _, p := range groupMembers(j.pid) {
		procs = append(procs, p)
		procs = append(procs, testutil.ChildrenOf(p)...)
	}
	_ = syscall.Kill(-j.pid, syscall.SIGKILL)
	testutil.WaitFor(s.t, 10*time.Second, "the killed server's processes, its plugins included, gone", func() bool {
		for _, p := range procs {
			if testutil.Alive(p) {
				return false
			}
		}
		return true
	})
	delete(s.servers, addr)
	for i := range s.jobs {
		if s.jobs[i].pid == j.pid {
			s.jobs = append(s.jobs[:i], s.jobs[i+1:]...)
			break
		}
	}
}

// stop ends the section as a reader would close the terminal: ^C (SIGINT)
// to every job's process group, the agents drain and exit, their plugins
// with them. Whatever is still alive after the grace period is killed and
// fails the test, as does a plugin process that outlived its agent.
func (s *shell) stop(grace time.Duration) {
	s.t.Helper()
	var procs []int
	for _, j := range s.jobs {
		for _, p := range groupMembers(j.pid) {
			procs = append(procs, p)
			procs = append(procs, testutil.ChildrenOf(p)...)
		}
	}
	for i := len(s.jobs) - 1; i >= 0; i-- {
		_ = syscall.Kill(-s.jobs[i].pid, syscall.SIGINT)
	}
	if err := testutil.Eventually(grace, func() bool {
		for _, p := range procs {
			if testutil.Alive(p) {
				return false
			}
		}
		return true
	}); err != nil {
		for _, p := range procs {
			if testutil.Alive(p) {
				s.t.Errorf("process %d (of a README job) still alive %s after ^C; killing it", p, grace)
				_ = syscall.Kill(p, syscall.SIGKILL)
			}
		}
		// Only to reap them before the check below; the test has failed.
		_ = testutil.Eventually(5*time.Second, func() bool {
			for _, p := range procs {
				if testutil.Alive(p) {
					return false
				}
			}
			return true
		})
		testutil.CheckGone(s.t, procs)
	}
	// Not checked again when all went within grace: pid_max may be 32768,
	// and a busy suite reuses a pid within seconds.
	s.jobs = nil
	s.in.Close()
	s.in = nil
	done := make(chan error, 1)
	go func() { done <- s.cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-done
		s.t.Errorf("bash did not exit after its input ended\n%s", s.logTail())
	}
}

// logTail is the end of the section's stderr log, for failure messages.
func (s *shell) logTail() string {
	b, _ := os.ReadFile(s.log)
	var lines []string
	for _, l := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		// curl's progress meter (its stdout is a file here, not a terminal).
		if strings.Contains(l, "--:--") || strings.Contains(l, "% Total") || strings.Contains(l, "Dload  Upload") {
			continue
		}
		lines = append(lines, l)
	}
	return "stderr (last lines of " + s.log + "):\n" + strings.Join(lines[max(0, len(lines)-40):], "\n")
}
