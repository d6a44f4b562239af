// Package counter is the smallest pinnedd host: one integer per id.
//
//	POST /counters/alice/increment -> {"value":1}
//	GET  /counters/alice/value     -> {"value":1}
//
// The value lives in a tray ("counter", "~"), written through to pinnedd's
// store. The handlers are written the obvious way, and the SDK's output
// gate makes them linearizable: an answer (an increment's, or a read's
// that saw a value still in flight) leaves only once the write it follows
// is stored, so an acknowledged increment survives kill -9 of the plugin
// or of pinnedd and a move to another node, and no read shows a value a
// crash then loses.
//
// It is built into pinnedd (for --dev) and also builds as a plugin binary of
// its own: go build ./examples/counter/cmd/counter.
package counter

import (
	"encoding/json"
	"net/http"
	"sync"

	"github.com/pinnedd/pinnedd/plugins/sdk"
)

// Namespace the counter host is served under.
const Namespace = "/counters"

// Host builds one counter per id.
func Host() sdk.Host {
	return sdk.Host{New: func(inst *sdk.Instance) (http.Handler, error) {
		c := &counter{inst: inst, tray: inst.Tray("counter", "~")}
		if _, err := c.tray.Get("value", &c.value); err != nil {
			return nil, err
		}
		mux := http.NewServeMux()
		mux.HandleFunc("POST /increment", c.increment)
		mux.HandleFunc("GET /value", c.get)
		return mux, nil
	}}
}

type counter struct {
	inst *sdk.Instance
	tray *sdk.Tray

	mu    sync.Mutex
	value int64
}

func (c *counter) increment(w http.ResponseWriter, _ *http.Request) {
	c.mu.Lock()
	// The write is queued under the lock, before any read can see the new
	// value: the gate holds whatever follows it.
	v := c.value + 1
	err := c.tray.Set("value", v)
	if err == nil {
		c.value = v
	}
	c.mu.Unlock()
	if err != nil {
		// Set refused the write, so nothing was stored: a fence (the retry
		// reaches the new owner) or an instance being reset after a failed
		// commit; either way nothing ran.
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusServiceUnavailable)
		_ = json.NewEncoder(w).Encode(map[string]string{"error": err.Error()})
		return
	}
	// The answer waits at the gate until the write is stored; if its
	// commit fails, the gate answers 504 (outcome unknown) instead.
	writeValue(w, v)
}

func (c *counter) get(w http.ResponseWriter, _ *http.Request) {
	c.mu.Lock()
	v := c.value
	c.mu.Unlock()
	writeValue(w, v)
}

func writeValue(w http.ResponseWriter, v int64) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]int64{"value": v})
}
