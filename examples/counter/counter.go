// Package counter is the smallest pinnedd host: one integer per id.
//
//	POST /counters/alice/increment -> {"value":1}
//	GET  /counters/alice/value     -> {"value":1}
//
// The value lives in a tray ("counter", "~"), written through to pinnedd's
// store before each answer: an acknowledged increment survives kill -9 of
// the plugin or of pinnedd, and a move to another node.
//
// It is built into pinnedd (for --dev) and also builds as a plugin binary of
// its own: go build ./examples/counter/cmd/counter.
package counter

import (
	"encoding/json"
	"errors"
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

func (c *counter) increment(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	c.value++
	v := c.value
	err := c.tray.Set("value", v) // queued in order under the lock
	c.mu.Unlock()
	if err == nil {
		err = c.inst.Durable(r.Context()) // acknowledge only what is stored
	}
	if err != nil {
		// A fenced write was refused: nothing is stored. Any other failure
		// leaves the write queued, so it may yet be stored: say so.
		code, body := http.StatusServiceUnavailable, map[string]string{"error": err.Error()}
		if !errors.Is(err, sdk.ErrFenced) && !errors.Is(err, sdk.ErrInvalidWrite) {
			code, body["outcome"] = http.StatusGatewayTimeout, "unknown"
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(body)
		return
	}
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
