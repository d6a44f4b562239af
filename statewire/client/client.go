// Package client is the Go Statewire client: it attaches to an instance's
// stream and keeps a local copy of its document (reconnecting on its own,
// honouring Retry-After), and sends commands with per-client sequence
// numbers, resending until they are acknowledged. It speaks only HTTP and
// never imports server-side packages.
package client

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	mrand "math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/pinnedd/pinnedd/statewire/wire"
)

// ErrRejected: the instance refused a request with a 4xx; resending it
// would not help.
var ErrRejected = errors.New("statewire: request rejected")

// Client talks to one instance, e.g. http://127.0.0.1:8080/threads/t1.
type Client struct {
	url  string
	id   string
	http *http.Client

	// sendMu serializes Send: the server refuses a seq that skips one it
	// has not admitted (409), so frames go out one at a time, in order.
	sendMu sync.Mutex
	seq    int64
}

// SilenceLimit is how long a stream may stay silent before the session
// takes it for dead and reconnects: three of the server's 15 s keepalive
// periods.
var SilenceLimit = 45 * time.Second

// New returns a client with a random client id.
func New(instanceURL string) *Client {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return &Client{url: strings.TrimRight(instanceURL, "/"), id: "go-" + hex.EncodeToString(b[:]), http: &http.Client{}}
}

// ID is the client id its frames carry.
func (c *Client) ID() string { return c.id }

// FramesResponse is the answer to POST /frames.
type FramesResponse struct {
	Acked      int64 `json:"acked"`
	Admitted   int   `json:"admitted"`
	Duplicates int   `json:"duplicates"`
}

// HTTPError is a non-2xx answer.
type HTTPError struct {
	Code       int
	Message    string
	RetryAfter time.Duration
	// Expected is, on a 409 for a seq gap, the next seq the server will
	// admit from this client.
	Expected int64
}

func (e *HTTPError) Error() string { return fmt.Sprintf("statewire: %d %s", e.Code, e.Message) }

// Unwrap makes a 4xx match ErrRejected.
func (e *HTTPError) Unwrap() error {
	if e.Code >= 400 && e.Code < 500 {
		return ErrRejected
	}
	return nil
}

// Send sends one command (type plus fields) with the next sequence number
// and resends it, same number, until it is acknowledged or rejected.
// Concurrent Sends go one at a time. A rejected frame was not admitted, so
// its number is used again by the next Send (a skipped number would be a
// gap the server refuses).
func (c *Client) Send(ctx context.Context, typ string, fields map[string]any) (seq int64, err error) {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	c.seq++
	seq = c.seq
	defer func() {
		if errors.Is(err, ErrRejected) {
			c.seq--
		}
	}()
	frame := map[string]any{}
	for k, v := range fields {
		frame[k] = v
	}
	frame["seq"], frame["type"] = seq, typ
	b, err := json.Marshal(map[string]any{"clientId": c.id, "frames": []any{frame}})
	if err != nil {
		return seq, fmt.Errorf("encode frame: %w", err)
	}
	for attempt := 0; ; attempt++ {
		resp, err := c.PostFrames(ctx, b)
		if err == nil && resp.Acked >= seq {
			return seq, nil
		}
		if errors.Is(err, ErrRejected) {
			return seq, err
		}
		if err := sleep(ctx, retryDelay(err, attempt)); err != nil {
			return seq, fmt.Errorf("send seq %d: %w", seq, err)
		}
	}
}

// PostFrames sends a raw POST /frames body once.
func (c *Client) PostFrames(ctx context.Context, body []byte) (FramesResponse, error) {
	var out FramesResponse
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url+"/frames", bytes.NewReader(body))
	if err != nil {
		return out, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return out, fmt.Errorf("post frames: %w", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return out, httpError(resp, b)
	}
	if err := json.Unmarshal(b, &out); err != nil {
		return out, fmt.Errorf("decode frames answer %q: %w", b, err)
	}
	return out, nil
}

func httpError(resp *http.Response, body []byte) *HTTPError {
	e := &HTTPError{Code: resp.StatusCode, Message: strings.TrimSpace(string(body))}
	var eb struct {
		Error    string
		Expected int64
	}
	if json.Unmarshal(body, &eb) == nil && eb.Error != "" {
		e.Message, e.Expected = eb.Error, eb.Expected
	}
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s >= 0 {
		e.RetryAfter = time.Duration(s) * time.Second
	}
	return e
}

// retryDelay honours Retry-After, else backs off exponentially with jitter
// from 100 ms to 2 s.
func retryDelay(err error, attempt int) time.Duration {
	var he *HTTPError
	if errors.As(err, &he) && he.RetryAfter > 0 {
		return he.RetryAfter
	}
	d := time.Duration(100*math.Pow(2, float64(min(attempt, 5)))) * time.Millisecond
	d = min(d, 2*time.Second)
	return d/2 + time.Duration(mrand.Int64N(int64(d/2)+1))
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Session is an attached stream: a local copy of the document, kept up to
// date across reconnects until Close or a fin without reconnect.
type Session struct {
	c      *Client
	cancel context.CancelFunc
	done   chan struct{}

	mu        sync.Mutex
	state     any
	epoch     string
	version   uint64
	attached  bool
	snapshots int
	fins      []wire.Frame
	ops       []wire.Frame
	changed   chan struct{}
	err       error
}

// Attach opens the stream in the background.
func (c *Client) Attach(ctx context.Context) *Session {
	ctx, cancel := context.WithCancel(ctx)
	s := &Session{c: c, cancel: cancel, done: make(chan struct{}), changed: make(chan struct{})}
	go s.loop(ctx)
	return s
}

// Close ends the session and waits for its goroutine.
func (s *Session) Close() {
	s.cancel()
	<-s.done
}

func (s *Session) loop(ctx context.Context) {
	defer close(s.done)
	for attempt := 0; ctx.Err() == nil; attempt++ {
		fin, err := s.connect(ctx)
		s.mu.Lock()
		s.attached = false
		s.bumpLocked()
		s.mu.Unlock()
		if fin != nil && (fin.Reconnect == nil || !*fin.Reconnect) {
			s.mu.Lock()
			s.err = fmt.Errorf("stream ended: fin %s without reconnect", fin.Code)
			s.mu.Unlock()
			return
		}
		if fin != nil || err == nil {
			attempt = 0
		}
		if sleep(ctx, retryDelay(err, attempt)) != nil {
			return
		}
	}
}

// connect runs one stream until it ends; it returns the fin if one came.
func (s *Session) connect(ctx context.Context) (*wire.Frame, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.c.url+"/stream",
		strings.NewReader(`{"clientId":"`+s.c.id+`"}`))
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req = req.WithContext(ctx)
	// A stream silent for SilenceLimit (no frame, not even a keepalive) is
	// dead somewhere on the way: cut it and reconnect.
	silent := time.AfterFunc(SilenceLimit, cancel)
	defer silent.Stop()
	resp, err := s.c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("open stream: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
		return nil, httpError(resp, b)
	}
	rd := bufio.NewReaderSize(resp.Body, 64<<10)
	first := true
	for {
		line, err := rd.ReadBytes('\n')
		if err != nil {
			return nil, fmt.Errorf("read stream: %w", err)
		}
		silent.Reset(SilenceLimit)
		var f wire.Frame
		if err := json.Unmarshal(line, &f); err != nil {
			return nil, fmt.Errorf("frame %q: %w", line, err)
		}
		if first && f.Type != wire.TypeSnapshot {
			return nil, fmt.Errorf("stream began with %q, not a snapshot", f.Type)
		}
		first = false
		switch f.Type {
		case wire.TypeSnapshot:
			var st any
			if err := json.Unmarshal(f.State, &st); err != nil {
				return nil, fmt.Errorf("snapshot: %w", err)
			}
			s.mu.Lock()
			s.state, s.epoch, s.version, s.attached = st, f.Epoch, f.Version, true
			s.snapshots++
			s.bumpLocked()
			s.mu.Unlock()
		case wire.TypeOps:
			if err := s.apply(f); err != nil {
				return nil, err
			}
		case wire.TypeFin:
			s.mu.Lock()
			s.fins = append(s.fins, f)
			s.mu.Unlock()
			return &f, nil
		}
	}
}

// apply applies an ops frame, or refuses it (and the stream) when it does
// not follow the copy's version: the copy is never left torn.
func (s *Session) apply(f wire.Frame) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f.Version != s.version+1 {
		return fmt.Errorf("ops version %d after %d", f.Version, s.version)
	}
	// Apply to a copy so a bad op leaves the last good state in place.
	st := deepCopy(s.state)
	for _, op := range f.Ops {
		var err error
		if st, err = wire.Apply(st, op); err != nil {
			return fmt.Errorf("ops version %d: %w", f.Version, err)
		}
	}
	s.state, s.version = st, f.Version
	s.ops = append(s.ops, f)
	s.bumpLocked()
	return nil
}

func deepCopy(v any) any {
	switch v := v.(type) {
	case map[string]any:
		m := make(map[string]any, len(v))
		for k, x := range v {
			m[k] = deepCopy(x)
		}
		return m
	case []any:
		a := make([]any, len(v))
		for i, x := range v {
			a[i] = deepCopy(x)
		}
		return a
	}
	return v
}

func (s *Session) bumpLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// State returns a copy of the document (nil before the first snapshot) and
// its version.
func (s *Session) State() (any, uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return deepCopy(s.state), s.version
}

// Decode decodes the document into v.
func (s *Session) Decode(v any) error {
	s.mu.Lock()
	b, err := json.Marshal(s.state)
	s.mu.Unlock()
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// Stats says what the session went through.
type Stats struct {
	Attached  bool
	Epoch     string
	Snapshots int
	Fins      []wire.Frame
	// Ops are the ops frames applied so far, in order.
	Ops []wire.Frame
}

// Stats returns the session's counters.
func (s *Session) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Stats{Attached: s.attached, Epoch: s.epoch, Snapshots: s.snapshots,
		Fins: append([]wire.Frame(nil), s.fins...), Ops: append([]wire.Frame(nil), s.ops...)}
}

// Wait blocks until cond holds for the session (checked on every change)
// or ctx ends.
func (s *Session) Wait(ctx context.Context, cond func(s *Session) bool) error {
	for {
		s.mu.Lock()
		ch := s.changed
		serr := s.err
		s.mu.Unlock()
		if cond(s) {
			return nil
		}
		if serr != nil {
			return serr
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the session: %w", ctx.Err())
		case <-ch:
		case <-s.done:
			if cond(s) {
				return nil
			}
			// Why it ended, if it said (set before done closes; the select
			// may have picked done over the change that carried it).
			s.mu.Lock()
			serr = s.err
			s.mu.Unlock()
			if serr != nil {
				return serr
			}
			return errors.New("session ended")
		}
	}
}
