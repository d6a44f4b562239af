package frontdoor

import (
	"context"
	"net/http"
	"time"

	"github.com/pinnedd/pinnedd/internal/httpx"
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

// awaitIdle waits, up to idleGrace from SetStopping (or ctx), until no
// client connection is idle (net/http's, or the kept-alive loop's:
// relay.Conns.Idle): each has brought its request, had its answer and
// closed. It returns at once if SetStopping was not called.
func (f *FrontDoor) awaitIdle(ctx context.Context) {
	since := f.stoppedAt.Load()
	if since == 0 {
		return
	}
	httpx.PollUntil(ctx, time.Unix(0, since).Add(idleGrace), func() bool {
		return f.conns.Count(http.StateIdle)+f.keep.conns.Idle() == 0
	})
}
