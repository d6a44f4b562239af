package sdk

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"sync/atomic"
)

// gate is the output gate of one response (see the package doc, "Output
// gates"). Every output the handler produces (the status and headers, body
// bytes, a flush) is tagged with the number of state writes queued when it
// was produced; it leaves the plugin once that many writes are durable.
// An output produced with nothing in flight leaves at once, so a response
// that depends on nothing in flight costs two atomic loads per write.
// Outputs keep their order: once one is held, every later one queues
// behind it. If a commit fails first, the held outputs are discarded and
// replaced by the answer the status contract gives for the failure.
type gate struct {
	w   http.ResponseWriter
	st  *state
	ctx context.Context // the request's: a client that leaves stops the wait

	unconfirmed atomic.Bool // AllowUnconfirmed

	code    int  // the status the handler chose; 0 until then
	started bool // w.WriteHeader was called: the status left
	held    bool // outputs wait in buf for target writes to be durable
	target  uint64
	buf     []byte
	// failed is set once held outputs were discarded: every later output
	// fails with it. cut says the status had left already, so the response
	// cannot be replaced, only cut short.
	failed   error
	cut      bool
	hijacked bool
}

type gateKey struct{}

// AllowUnconfirmed lets the response to r leave before the state writes
// queued ahead of it are durable: what the instance writes to the
// response from this call on passes the output gate at once. It may then
// reveal a write that a crash, a failed commit or a fence loses, so a
// client may see a value that was never stored (a read-uncommitted
// answer). Use it for an answer that reveals only what the handler
// already waited to be durable (an acknowledgement after Append or
// Durable returned nil, a refusal), or where a value that may vanish is
// acceptable and the wait is not (a progress indication); never for a
// read a client acts on. Outputs held before the call still wait. On a
// request that did not come through the SDK it does nothing.
func AllowUnconfirmed(r *http.Request) {
	if g, _ := r.Context().Value(gateKey{}).(*gate); g != nil {
		g.unconfirmed.Store(true)
	}
}

func newGate(w http.ResponseWriter, r *http.Request, st *state) (*gate, *http.Request) {
	g := &gate{w: w, st: st}
	r = r.WithContext(context.WithValue(r.Context(), gateKey{}, g))
	g.ctx = r.Context()
	return g, r
}

// admit reports whether an output produced now may leave at once; if not,
// it records what the output waits for.
func (g *gate) admit() bool {
	if g.unconfirmed.Load() {
		return !g.held // behind held outputs, in order, waiting for no more
	}
	t := g.st.enq.Load()
	if !g.held && g.st.done.Load() >= t {
		return true
	}
	g.held = true
	g.target = max(g.target, t)
	return false
}

func (g *gate) Header() http.Header { return g.w.Header() }

// WriteHeader records the status; it leaves with the first body bytes, a
// flush or the end of the handler, as net/http sends it.
func (g *gate) WriteHeader(code int) {
	if g.code != 0 || g.failed != nil || g.hijacked {
		return
	}
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		// Informational: advisory, so it goes only if nothing waits (and
		// makes nothing after it wait).
		if !g.held && (g.unconfirmed.Load() || g.st.done.Load() >= g.st.enq.Load()) {
			g.w.WriteHeader(code)
		}
		return
	}
	g.code = code
}

func (g *gate) Write(p []byte) (int, error) {
	if g.failed != nil {
		return 0, g.failed
	}
	if g.code == 0 {
		g.code = http.StatusOK
	}
	if g.admit() {
		g.start()
		return g.w.Write(p)
	}
	g.buf = append(g.buf, p...)
	return len(p), nil
}

func (g *gate) start() {
	if g.code == 0 {
		g.code = http.StatusOK
	}
	if !g.started {
		g.started = true
		g.w.WriteHeader(g.code)
	}
}

// release waits for what the held outputs wait for, then writes them out,
// or discards them if a commit failed first.
func (g *gate) release() error {
	if !g.held {
		return nil
	}
	if err := g.st.durableUpTo(g.ctx, g.target); err != nil {
		g.fail(err)
		return g.failed
	}
	g.held = false
	if g.code != 0 { // a hijack with no status of its own sends none
		g.start()
	}
	buf := g.buf
	g.buf = nil
	if len(buf) == 0 {
		return nil
	}
	_, err := g.w.Write(buf)
	return err
}

// fail discards the held outputs and answers per the status contract: a
// fence is a 503 with Retry-After (the new owner runs the retry), a failed
// commit a 504 whose outcome is unknown (it may have been stored). A
// response whose status already left can only be cut short.
func (g *gate) fail(err error) {
	g.held, g.buf = false, nil
	if g.ctx.Err() != nil {
		g.failed, g.cut = err, true // the client left: nobody to tell
		return
	}
	g.failed = errors.Join(errHeld, err)
	if g.started {
		g.cut = true
		return
	}
	g.started = true
	h := g.w.Header()
	clear(h)
	h.Set("Content-Type", "application/json")
	body := map[string]string{"error": err.Error()}
	code := http.StatusGatewayTimeout
	if errors.Is(err, ErrFenced) {
		code = http.StatusServiceUnavailable
		h.Set("Retry-After", "1")
	} else {
		body["outcome"] = "unknown"
	}
	g.w.WriteHeader(code)
	_ = json.NewEncoder(g.w).Encode(body)
}

// errHeld marks the error of a write to a response whose held outputs
// were discarded.
var errHeld = errors.New("response discarded by the output gate: a state write it followed was not stored")

// FlushError sends what the handler wrote so far, once the writes queued
// before it are durable: a flushed chunk of a stream waits like any other
// output, and the handler with it. http.ResponseController finds it first.
func (g *gate) FlushError() error {
	if _, err := g.Write(nil); err != nil {
		return err
	}
	if err := g.release(); err != nil {
		return err
	}
	return http.NewResponseController(g.w).Flush()
}

// Flush is FlushError for an http.Flusher.
func (g *gate) Flush() { _ = g.FlushError() }

// Hijack waits for the held outputs like a flush, then hands over the
// connection: what is written to it afterwards passes no gate.
func (g *gate) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if g.failed != nil {
		return nil, nil, g.failed
	}
	g.admit() // what the connection carries from now on is an output too
	if err := g.release(); err != nil {
		return nil, nil, err
	}
	if g.code != 0 {
		g.start() // a status written before (an upgrade's 101): net/http sends it as it hijacks
	}
	c, rw, err := http.NewResponseController(g.w).Hijack()
	if err == nil {
		g.hijacked = true
	}
	return c, rw, err
}

// Unwrap lets http.ResponseController reach deadlines and full duplex
// underneath (Flush and Hijack stop at the gate).
func (g *gate) Unwrap() http.ResponseWriter { return g.w }

// finish runs when the handler returned: the end of the response is an
// output too (a handler that wrote nothing answers 200), and what is held
// is released or discarded before net/http ends the response.
func (g *gate) finish() {
	if g.hijacked || g.failed != nil {
		return
	}
	// The end of the response (a bare status included) waits like any output.
	g.admit()
	if g.release() == nil {
		g.start()
	}
}
