package httpx

import (
	"context"
	"net"
	"net/http"
	"sync"
	"time"
)

// ConnStates tracks an http.Server's connections by state (its ConnState
// hook: Track). A graceful stop needs it because net/http's Shutdown drops,
// unanswered, a request it reads after Shutdown began: a connection
// accepted just before, whose first request is still on its way, must bring
// it first (AwaitFirstRequests).
type ConnStates struct {
	mu sync.Mutex
	m  map[net.Conn]http.ConnState
}

// Track is the http.Server.ConnState hook.
func (c *ConnStates) Track(conn net.Conn, st http.ConnState) {
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

// Count is how many connections are in state st.
func (c *ConnStates) Count(st http.ConnState) int {
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

// CloseIdle closes the idle connections match accepts and returns how
// many. One that turns active meanwhile may be closed under its request.
func (c *ConnStates) CloseIdle(match func(net.Conn) bool) int {
	c.mu.Lock()
	var idle []net.Conn
	for conn, st := range c.m {
		if st == http.StateIdle && match(conn) {
			idle = append(idle, conn)
		}
	}
	c.mu.Unlock()
	for _, conn := range idle {
		_ = conn.Close()
	}
	return len(idle)
}

// FirstRequestGrace bounds how long AwaitFirstRequests waits: a client that
// connected and sent nothing in this long is one Shutdown may close unasked.
const FirstRequestGrace = time.Second

// AwaitFirstRequests waits, up to FirstRequestGrace (or ctx), until no
// connection is still to bring its first request. Call it once the server
// accepts no more connections, before its Shutdown.
func (c *ConnStates) AwaitFirstRequests(ctx context.Context) {
	PollUntil(ctx, time.Now().Add(FirstRequestGrace), func() bool { return c.Count(http.StateNew) == 0 })
}

// PollUntil checks done every 10 ms until it holds, until passes, or ctx
// ends. Only shutdowns wait this way.
func PollUntil(ctx context.Context, until time.Time, done func() bool) {
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
