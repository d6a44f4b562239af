// Package counter is the smallest pinnedd host: one integer per id.
//
//	POST /counters/alice/increment -> {"value":1}
//	GET  /counters/alice/value     -> {"value":1}
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
		c := &counter{}
		mux := http.NewServeMux()
		mux.HandleFunc("POST /increment", c.increment)
		mux.HandleFunc("GET /value", c.get)
		return mux, nil
	}}
}

type counter struct {
	mu    sync.Mutex
	value int64
}

func (c *counter) increment(w http.ResponseWriter, _ *http.Request) {
	c.mu.Lock()
	c.value++
	v := c.value
	c.mu.Unlock()
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
