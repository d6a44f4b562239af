package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/pinnedd/pinnedd/internal/certfile"
	"github.com/pinnedd/pinnedd/raftstore"
)

const (
	defaultAddr    = "http://127.0.0.1:8080"
	defaultTimeout = 30 * time.Second
	// refusedWindow bounds how long a refused connection is retried: an agent
	// that is still starting listens within it. A script, or a block a shell reads from a file or pipe,
	// may start an agent and call it at once.
	refusedWindow = 10 * time.Second
	// refusedWindowTerminal is the bound when stdin is a terminal: someone
	// typing at a prompt learns of a wrong --addr (or an agent that is not
	// running) at once. Not zero: a block pasted into a terminal also runs
	// with the terminal as stdin, and its agents were started a moment ago.
	refusedWindowTerminal = 2 * time.Second
)

// refusedWindowFor is how long a command retries a refused connection to an
// address that has not answered yet, bounded by its --timeout.
func refusedWindowFor(stdinTerminal bool, timeout time.Duration) time.Duration {
	if stdinTerminal {
		return min(refusedWindowTerminal, timeout)
	}
	return min(refusedWindow, timeout)
}

// stdinIsTerminal says whether standard input is a terminal (a person at a
// prompt) rather than a file, pipe or /dev/null.
func stdinIsTerminal() bool {
	_, err := unix.IoctlGetTermios(int(os.Stdin.Fd()), unix.TCGETS)
	return err == nil
}

// clientFlags are shared by every command that talks to an agent.
func clientFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "addr", Value: defaultAddr, Usage: "the agent's front door: a URL, host:port, :port or port", EnvVars: []string{"PINNEDD_ADDR"}},
		&cli.StringFlag{Name: "token", Usage: "operator token (none: only an agent in --dev accepts calls from loopback without one); prefer PINBOARD_TOKEN or --token-file: on the command line it is visible to every local user (ps)", EnvVars: []string{"PINBOARD_TOKEN"}},
		tokenFileFlag(),
		&cli.DurationFlag{Name: "timeout", Value: defaultTimeout, Usage: "give up on a call the agent has not answered within this long", EnvVars: []string{"PINNEDD_TIMEOUT"}},
		&cli.StringFlag{Name: "ca", Usage: "a CA certificate (PEM) that verifies an https:// --addr, besides the system roots", EnvVars: []string{"PINNEDD_CA"}},
		&cli.BoolFlag{Name: "insecure", Usage: "send the token over plain http:// to an address off this machine, where anyone on the path can read it", EnvVars: []string{"PINNEDD_INSECURE"}},
	}
}

// agentClient talks to the agent a command names with --addr.
type agentClient struct {
	base    string // normalised --addr, no trailing slash
	token   string
	timeout time.Duration
	refused time.Duration // how long a refused connection is retried
	http    *http.Client
	tls     *tls.Config // verifies an https base
}

func newAgentClient(c *cli.Context) (*agentClient, error) {
	base, err := normalizeAddr("--addr", c.String("addr"))
	if err != nil {
		return nil, err
	}
	timeout := c.Duration("timeout")
	if timeout <= 0 {
		return nil, usagef("--timeout must be positive, got %s", timeout)
	}
	errw := c.App.ErrWriter
	if errw == nil {
		errw = io.Discard
	}
	rd := &refusedDialer{window: refusedWindowFor(stdinIsTerminal(), timeout), notice: func(addr string, window time.Duration) {
		fmt.Fprintf(errw, "pinnedd: %s refused the connection; retrying for up to %s (is the agent still starting?)\n", addr, window)
	}}
	token, err := tokenFrom(c)
	if err != nil {
		return nil, err
	}
	if token != "" && !c.Bool("insecure") {
		if err := keyTravelsSafely(base); err != nil {
			return nil, err
		}
	}
	tr := rd.transport()
	if tr.TLSClientConfig, err = caConfig(c.String("ca")); err != nil {
		return nil, err
	}
	return &agentClient{
		base:    base,
		token:   token,
		timeout: timeout,
		refused: rd.window,
		http:    &http.Client{Transport: tr},
		tls:     tr.TLSClientConfig,
	}, nil
}

// keyTravelsSafely refuses to send a bearer key to base over plain HTTP
// off this machine: anyone on the path could read and reuse it.
func keyTravelsSafely(base string) error {
	u, err := url.Parse(base)
	if err != nil || u.Scheme == "https" {
		return err
	}
	host := u.Hostname()
	if ip, err := netip.ParseAddr(host); (err == nil && ip.IsLoopback()) || strings.EqualFold(host, "localhost") {
		return nil
	}
	return usagef("refusing to send the token in clear to %s: use an https:// --addr (the agent's --http-tls-cert; --ca verifies a private CA), or pass --insecure to send it anyway", base)
}

// caConfig is the TLS client config verifying an https --addr: the system
// roots, and the CA in file if one is given.
func caConfig(file string) (*tls.Config, error) {
	roots, _, err := certfile.Roots(file)
	if err != nil {
		return nil, usagef("--ca: %v", err)
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: roots}, nil
}

// normalizeAddr turns what an operator may type for an agent's address
// (what names it in errors: a URL, host:port, :port or a bare port) into a
// base URL; a port alone means this machine's loopback.
func normalizeAddr(what, addr string) (string, error) {
	s := strings.TrimSpace(addr)
	bad := func(why string) error {
		return usagef("%s %q %s: give a URL or host:port, e.g. http://127.0.0.1:8080 or 127.0.0.1:8080", what, addr, why)
	}
	if s == "" {
		return "", bad("is empty")
	}
	if isPort(s) {
		s = ":" + s // a bare port, as `--http-addr 8080` would be typed
	}
	if strings.HasPrefix(s, ":") {
		s = "127.0.0.1" + s
	}
	if !strings.Contains(s, "://") {
		s = "http://" + s
	}
	u, err := url.Parse(s)
	if err != nil {
		return "", bad("does not parse")
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return "", bad("has scheme " + u.Scheme + ", not http or https")
	case u.Hostname() == "":
		return "", bad("names no host")
	case u.User != nil || u.RawQuery != "" || u.Fragment != "":
		return "", bad("carries a user, query or fragment")
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return "", bad("has port " + p + ", not 1-65535")
		}
	} else if strings.HasSuffix(u.Host, ":") {
		return "", bad("has an empty port")
	}
	return strings.TrimRight(u.String(), "/"), nil
}

// isPort says s is all digits: a port, never a host name.
func isPort(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// refusedDialer redials a refused connection until window passes: nothing
// was sent, so it is safe for every request, and an agent that is still
// starting gets to listen. Other dial errors fail at once.
type refusedDialer struct {
	window time.Duration
	notice func(addr string, window time.Duration) // once, at the first refusal
	once   sync.Once
}

func (d *refusedDialer) transport() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.DialContext = d.dial
	return t
}

func (d *refusedDialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var nd net.Dialer
	stop := time.Now().Add(d.window)
	wait := 50 * time.Millisecond
	for {
		conn, err := nd.DialContext(ctx, network, addr)
		if err == nil || !errors.Is(err, syscall.ECONNREFUSED) {
			return conn, err
		}
		if time.Now().Add(wait).After(stop) {
			return nil, err
		}
		d.once.Do(func() {
			if d.notice != nil {
				d.notice(addr, d.window)
			}
		})
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, err
		case <-t.C:
		}
		wait = min(2*wait, 500*time.Millisecond)
	}
}

// agentError is the agent's non-2xx answer, shown in its own words.
type agentError struct {
	addr    string
	status  int
	message string
}

func (e *agentError) Error() string {
	msg := e.message
	if msg == "" {
		msg = http.StatusText(e.status)
	}
	s := fmt.Sprintf("%s answered %d: %s", e.addr, e.status, msg)
	if e.status == http.StatusUnauthorized && !strings.Contains(msg, "PINBOARD_TOKEN") {
		s += " (set PINBOARD_TOKEN or pass --token)"
	}
	return s
}

// explain rewrites a failed call's error into what the operator should
// know: the agent's own answer, or that nothing listens at --addr, or that
// it did not answer within --timeout.
func (ac *agentClient) explain(ctx context.Context, err error) error {
	var re *raftstore.RemoteError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &re):
		return &agentError{addr: ac.base, status: re.Status, message: re.Message}
	case errors.Is(err, syscall.ECONNREFUSED):
		return &explained{err: err, msg: fmt.Sprintf("cannot reach the agent at %s: connection refused for %s (is it running there? check --addr or PINNEDD_ADDR)", ac.base, ac.refused)}
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return &explained{err: err, msg: fmt.Sprintf("the agent at %s did not answer within %s (--timeout, PINNEDD_TIMEOUT)", ac.base, ac.timeout)}
	}
	var ae *agentError
	if errors.As(err, &ae) {
		return err
	}
	return fmt.Errorf("cannot reach the agent at %s: %w", ac.base, err)
}

// explained is an error told in the operator's terms; Unwrap keeps the
// cause for errors.Is.
type explained struct {
	msg string
	err error
}

func (e *explained) Error() string { return e.msg }
func (e *explained) Unwrap() error { return e.err }

// call sends a request to the agent and decodes a JSON answer into out
// (nil: the answer is not read). body, if not nil, is sent as JSON.
func (ac *agentClient) call(ctx context.Context, method, path string, body, out any) error {
	ctx, cancel := context.WithTimeout(ctx, ac.timeout)
	defer cancel()
	return ac.explain(ctx, ac.do(ctx, method, path, body, out))
}

func (ac *agentClient) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("encode %s %s: %w", method, path, err)
		}
		rd = strings.NewReader(string(b))
	}
	req, err := http.NewRequestWithContext(ctx, method, ac.base+path, rd)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	if ac.token != "" {
		req.Header.Set("Authorization", "Bearer "+ac.token)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := ac.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("read the answer to %s %s: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		e := &agentError{addr: ac.base, status: resp.StatusCode}
		var eb struct {
			Error string `json:"error"`
		}
		if json.Unmarshal(data, &eb) == nil && eb.Error != "" {
			e.message = eb.Error
		} else {
			e.message = strings.TrimSpace(string(data))
		}
		return e
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("decode the answer to %s %s: %w", method, path, err)
	}
	return nil
}

// raft runs one raftstore *Via call against the agent, within --timeout and
// through the client that rides out refused connections.
func (ac *agentClient) raft(ctx context.Context, fn func(ctx context.Context, hc *http.Client, url, token string) error) error {
	ctx, cancel := context.WithTimeout(ctx, ac.timeout)
	defer cancel()
	return ac.explain(ctx, fn(ctx, ac.http, ac.base, ac.token))
}

// apiCall is call for a command's own agent (--addr, --token, --timeout).
func apiCall(c *cli.Context, method, path string, body, out any) error {
	ac, err := newAgentClient(c)
	if err != nil {
		return err
	}
	return ac.call(c.Context, method, path, body, out)
}

type statusView struct {
	NodeID       string `json:"nodeId"`
	Version      string `json:"version"`
	Dev          bool   `json:"dev"`
	AdvertiseURL string `json:"advertiseUrl"`
	FrontDoor    string `json:"frontDoor"` // http or https
	CertNotAfter string `json:"frontDoorCertNotAfter"`
	// KeysToSeal: the keys at rest in the log still sealed under a token
	// being rotated out; nil from a node without a sealer.
	KeysToSeal *[]string `json:"keysToSeal"`
	PID        int       `json:"pid"`
	Worker     struct {
		ClientID    string `json:"clientId"`
		Lease       string `json:"lease"`
		ExpiresInMs int64  `json:"expiresInMs"`
		drainView
	} `json:"worker"`
	Plugins []struct {
		Name       string   `json:"name"`
		State      string   `json:"state"`
		PID        int      `json:"pid"`
		Restarts   int      `json:"restarts"`
		Degraded   bool     `json:"degraded"`
		Namespaces []string `json:"namespaces"`
		Hostname   string   `json:"hostname"`
		Env        string   `json:"env"`
	} `json:"plugins"`
	Instances []struct {
		Env         string `json:"env"`
		Namespace   string `json:"namespace"`
		ID          string `json:"id"`
		Generation  uint64 `json:"generation"`
		Connections int    `json:"connections"`
		IdleMs      int64  `json:"idleMs"`
	} `json:"instances"`
}

func statusCommand() *cli.Command {
	return &cli.Command{
		Name:  "status",
		Usage: "show the local agent: mode, worker lease, plugins, instances",
		Flags: append(clientFlags(), &cli.BoolFlag{Name: "json", Usage: "print the raw JSON"}),
		Action: func(c *cli.Context) error {
			if err := noArgs(c); err != nil {
				return err
			}
			var raw json.RawMessage
			if err := apiCall(c, http.MethodGet, "/_pinned/status", nil, &raw); err != nil {
				return err
			}
			if c.Bool("json") {
				_, err := fmt.Fprintln(c.App.Writer, string(raw))
				return err
			}
			var st statusView
			if err := json.Unmarshal(raw, &st); err != nil {
				return fmt.Errorf("decode status: %w", err)
			}
			return printStatus(c.App.Writer, st)
		},
	}
}

func printStatus(out io.Writer, st statusView) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	mode := "fleet"
	if st.Dev {
		mode = "dev"
	}
	fmt.Fprintf(w, "node\t%s (pinnedd %s, pid %d)\n", st.NodeID, st.Version, st.PID)
	fmt.Fprintf(w, "mode\t%s\n", mode)
	fmt.Fprintf(w, "advertise\t%s\n", st.AdvertiseURL)
	switch {
	case st.FrontDoor == "https":
		fmt.Fprintf(w, "front door\thttps (certificate valid until %s)\n", st.CertNotAfter)
	case st.FrontDoor != "":
		fmt.Fprintf(w, "front door\t%s (keys and bodies travel in clear: see --http-tls-cert)\n", st.FrontDoor)
	}
	if st.KeysToSeal != nil {
		if ks := *st.KeysToSeal; len(ks) > 0 {
			fmt.Fprintf(w, "keys at rest\t%s still sealed under a previous token (the leader seals them again; keep that token listed until then)\n", strings.Join(ks, ", "))
		} else {
			fmt.Fprintf(w, "keys at rest\tsealed under this node's token\n")
		}
	}
	fmt.Fprintf(w, "worker\t%s lease %s (expires in %dms)%s\n", st.Worker.ClientID, st.Worker.Lease, st.Worker.ExpiresInMs, st.Worker.drainView.text(", ", time.Now()))
	fmt.Fprintln(w, "\nPLUGIN\tSTATE\tPID\tRESTARTS\tNAMESPACES")
	for _, p := range st.Plugins {
		state := p.State
		if p.Degraded {
			state += " (degraded)"
		}
		served := strings.Join(p.Namespaces, ",")
		if p.Hostname != "" {
			// Hostname-aware: its route and the env its ids live in.
			served = p.Hostname + served + " (env " + p.Env + ")"
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%s\n", p.Name, state, p.PID, p.Restarts, served)
	}
	fmt.Fprintf(w, "\nINSTANCE\tGENERATION\tCONNECTIONS\tIDLE\n")
	for _, in := range st.Instances {
		fmt.Fprintf(w, "%s%s/%s\t%d\t%d\t%s\n", in.Env, in.Namespace, in.ID, in.Generation, in.Connections, (time.Duration(in.IdleMs) * time.Millisecond).String())
	}
	return w.Flush()
}

// drainView is how the agent reports a worker's drain: in /_pinned/status
// and in /registry/workers alike.
type drainView struct {
	Draining      bool     `json:"draining"`
	DrainSources  []string `json:"drainSources"`
	Cordoned      bool     `json:"cordoned"`
	DrainDeadline int64    `json:"drainDeadline"` // Unix ms
}

// text is "" for a worker not draining, else sep + "draining (local,
// busy instances evicted at 15:04:05, lasts until undrain)" ("since" once
// the deadline passed) or "draining (operator, cordoned)". A deadline is
// when the busy instances go, not when the drain ends: it stays in force,
// placing nothing new there, until an undrain.
func (d drainView) text(sep string, now time.Time) string {
	if !d.Draining {
		return ""
	}
	detail := append([]string(nil), d.DrainSources...)
	switch {
	case d.Cordoned:
		detail = append(detail, "cordoned")
	case d.DrainDeadline > 0:
		at := time.UnixMilli(d.DrainDeadline)
		when := "at"
		if !at.After(now) {
			when = "since"
		}
		detail = append(detail, "busy instances evicted "+when+" "+clockTime(at, now), "lasts until undrain")
	}
	if len(detail) == 0 {
		return sep + "draining"
	}
	return sep + "draining (" + strings.Join(detail, ", ") + ")"
}

// clockTime is t as a time of day when it falls on now's date, else with
// its date: a deadline days ago must not read as one today.
func clockTime(t, now time.Time) string {
	t = t.In(now.Location())
	if y, m, d := t.Date(); y == now.Year() && m == now.Month() && d == now.Day() {
		return t.Format(time.TimeOnly)
	}
	return t.Format(time.DateTime)
}
