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

// idleConns are net/http's client connections idle between requests
// (http.Server.ConnState); the kept-alive loop counts its own
// (relay.Conns.Idle).
type idleConns struct {
	mu   sync.Mutex
	idle map[net.Conn]struct{}
}

func (c *idleConns) track(conn net.Conn, st http.ConnState) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if st != http.StateIdle {
		delete(c.idle, conn)
		return
	}
	if c.idle == nil {
		c.idle = make(map[net.Conn]struct{})
	}
	c.idle[conn] = struct{}{}
}

func (c *idleConns) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.idle)
}

// awaitIdle waits, up to idleGrace from SetStopping (or ctx), until no
// client connection is idle: each has brought its request, had its answer
// and closed. It returns at once if SetStopping was not called.
func (f *FrontDoor) awaitIdle(ctx context.Context) {
	since := f.stoppedAt.Load()
	if since == 0 {
		return
	}
	until := time.Unix(0, since).Add(idleGrace)
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for f.idle.len()+f.keep.conns.Idle() > 0 && time.Now().Before(until) {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
