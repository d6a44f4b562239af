package pinboard

import (
	"context"
	"net"
	"net/http"
	"sync"
	"time"
)

// idleGrace is how long from SetStopping a stopping front door keeps its
// idle kept-alive client connections open before Shutdown closes them. A
// connection closed while idle may have a request on its way, which the
// client then sees cut off and cannot tell from one that ran; kept open,
// that request is answered (503 + Retry-After + Connection: close, as
// every answer of a stopping node) and the connection ends after it. A
// client told to retry after a second (Retry-After: 1) comes back well
// within the grace; only one idle through all of it is closed unasked.
const idleGrace = 2 * time.Second

// newGrace bounds how long Shutdown, once it stopped accepting, waits for
// the connections accepted just before to bring their first request:
// net/http drops unanswered a request it reads after its Shutdown began.
// A client that connected and sent nothing in this long is one Shutdown
// may close unasked.
const newGrace = time.Second

// connStates are net/http's client connections by state
// (http.Server.ConnState); the kept-alive loop counts its own
// (relay.Conns.Idle).
type connStates struct {
	mu sync.Mutex
	m  map[net.Conn]http.ConnState
}

func (c *connStates) track(conn net.Conn, st http.ConnState) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if st == http.StateClosed || st == http.StateHijacked {
		delete(c.m, conn)
		return
	}
	if c.m == nil {
		c.m = make(map[net.Conn]http.ConnState)
	}
	c.m[conn] = st
}

// count is how many connections are in state st.
func (c *connStates) count(st http.ConnState) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, s := range c.m {
		if s == st {
			n++
		}
	}
	return n
}

// pollUntil checks done every 10 ms until it holds, until passes, or ctx
// ends. Only shutdown waits this way.
func pollUntil(ctx context.Context, until time.Time, done func() bool) {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for !done() && time.Now().Before(until) {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// awaitIdle waits, up to idleGrace from SetStopping (or ctx), until no
// client connection is idle: each has brought its request, had its answer
// and closed. It returns at once if SetStopping was not called.
func (f *FrontDoor) awaitIdle(ctx context.Context) {
	since := f.stoppedAt.Load()
	if since == 0 {
		return
	}
	pollUntil(ctx, time.Unix(0, since).Add(idleGrace), func() bool {
		return f.conns.count(http.StateIdle)+f.keep.conns.Idle() == 0
	})
}

// awaitFirstRequests waits, up to newGrace (or ctx), until net/http holds
// no connection that has not brought its first request: one accepted
// before the listener closed, whose request would otherwise reach
// net/http after its Shutdown began and be dropped unanswered.
func (f *FrontDoor) awaitFirstRequests(ctx context.Context) {
	pollUntil(ctx, time.Now().Add(newGrace), func() bool { return f.conns.count(http.StateNew) == 0 })
}
