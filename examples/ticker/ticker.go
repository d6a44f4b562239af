// Package ticker is a streaming host: each id is a clock that streams its
// ticks as server-sent events to every attached client.
//
//	curl -N localhost:8080/tickers/t1/stream    -> data: {"tick":1} ... every second
//	curl localhost:8080/tickers/t1/value        -> {"tick":N}
//
// The tick loop is a tracked task, so it stops when the instance is evicted.
package ticker

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/pinnedd/pinnedd/plugins/sdk"
)

// Namespace the ticker host is served under.
const Namespace = "/tickers"

// Host builds one ticker per id.
func Host() sdk.Host {
	return sdk.Host{
		DetachedTimeout: 30 * time.Second,
		New: func(inst *sdk.Instance) (http.Handler, error) {
			t := &ticker{inst: inst, subs: map[chan int64]struct{}{}}
			mux := http.NewServeMux()
			mux.HandleFunc("GET /stream", t.stream)
			mux.HandleFunc("POST /stream", t.stream)
			mux.HandleFunc("GET /value", t.value)
			return t.withMux(mux), nil
		},
	}
}

type ticker struct {
	inst *sdk.Instance
	mux  *http.ServeMux

	mu   sync.Mutex
	tick int64
	subs map[chan int64]struct{}
}

func (t *ticker) withMux(m *http.ServeMux) *ticker { t.mux = m; return t }

func (t *ticker) ServeHTTP(w http.ResponseWriter, r *http.Request) { t.mux.ServeHTTP(w, r) }

// Start implements sdk.Starter: the clock runs while the instance lives.
func (t *ticker) Start(context.Context) error {
	t.inst.Go("clock", func(ctx context.Context) {
		tk := time.NewTicker(time.Second)
		defer tk.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tk.C:
				// A winding-down ticker stops ticking so its instance can go
				// before the deadline (a drain, a hot swap).
				if t.inst.EvictionCheckpoint() != nil {
					return
				}
				t.mu.Lock()
				t.tick++
				for ch := range t.subs {
					select {
					case ch <- t.tick:
					default: // a slow reader skips ticks rather than stalling the clock
					}
				}
				t.mu.Unlock()
			}
		}
	})
	return nil
}

func (t *ticker) value(w http.ResponseWriter, _ *http.Request) {
	t.mu.Lock()
	v := t.tick
	t.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]int64{"tick": v})
}

func (t *ticker) stream(w http.ResponseWriter, r *http.Request) {
	n := int64(-1)
	if s := r.URL.Query().Get("n"); s != "" {
		n, _ = strconv.ParseInt(s, 10, 64)
	}
	ch := make(chan int64, 8)
	t.mu.Lock()
	t.subs[ch] = struct{}{}
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		delete(t.subs, ch)
		t.mu.Unlock()
	}()
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	for sent := int64(0); n < 0 || sent < n; sent++ {
		select {
		case <-r.Context().Done():
			return
		case <-t.inst.Context().Done():
			fmt.Fprint(w, "event: fin\ndata: {\"code\":\"evicted\",\"reconnect\":true}\n\n")
			_ = rc.Flush()
			return
		case v := <-ch:
			fmt.Fprintf(w, "data: {\"tick\":%d}\n\n", v)
			if err := rc.Flush(); err != nil {
				return
			}
		}
	}
}
