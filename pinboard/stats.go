package pinboard

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/pinnedd/pinnedd/internal/httpx"
)

// StatsPath is the worker-side stats route; it answers attested callers
// (another node's front door) only.
const StatsPath = "/_pinned/stats"

// ownerStats serves GET /_pinned/stats to an attested caller.
func (a *API) ownerStats(w http.ResponseWriter, r *http.Request) {
	if a.worker() == nil || a.cfg.WorkerStats == nil {
		httpx.WriteError(w, http.StatusNotFound, "this node hosts no instances", 0)
		return
	}
	if _, ok := a.cfg.Gate.Admit(w, r, StatsPath); !ok {
		return
	}
	st := a.cfg.WorkerStats(r.Context())
	ws := a.worker().Status()
	st["clientId"] = ws.ClientID
	st["draining"] = ws.Draining
	st["leaseFlaps"] = ws.LeaseFlaps
	st["reregistrations"] = ws.Reregistations
	st["lease"] = ws.Lease
	httpx.WriteJSON(w, http.StatusOK, st)
}

// registryStats serves GET /registry/stats: every registered worker's
// /_pinned/stats, gathered in parallel, so an operator can see which node
// holds an id and how each is doing. A worker that does not answer is
// listed with its error.
func (a *API) registryStats(w http.ResponseWriter, r *http.Request) {
	m := a.cfg.Dir.Machine()
	secret := m.Secret()
	gen := max(m.AppliedIndex(), 1)
	ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
	defer cancel()
	workers := m.Workers()
	out := make([]map[string]any, 0, len(workers))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, wk := range workers {
		if !wk.Registered() {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			entry := map[string]any{}
			err := a.fetchStats(ctx, secret, gen, wk.ClientID, wk.SessionID, a.cfg.Peers.Base(wk), &entry)
			if err != nil {
				entry = map[string]any{"error": err.Error()}
			}
			entry["clientId"], entry["advertiseUrl"], entry["nodeId"] = wk.ClientID, wk.AdvertiseURL, wk.NodeID
			mu.Lock()
			out = append(out, entry)
			mu.Unlock()
		}()
	}
	wg.Wait()
	// Stable order for people and diffs.
	slices.SortFunc(out, func(a, b map[string]any) int {
		return strings.Compare(a["clientId"].(string), b["clientId"].(string))
	})
	httpx.WriteJSON(w, http.StatusOK, map[string]any{"workers": out})
}

func (a *API) fetchStats(ctx context.Context, secret []byte, gen uint64, target, session, base string, into *map[string]any) error {
	if len(secret) == 0 {
		return fmt.Errorf("no cluster secret yet")
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+StatsPath, nil)
	if err != nil {
		return err
	}
	req.Header.Set(AttestationHeader, SignFor(secret, session, Attestation{Target: target, Caller: a.cfg.Self.ID(), Generation: gen, At: time.Now()}, http.MethodGet, StatsPath))
	resp, err := a.cfg.Peers.Client().Do(req)
	if err != nil {
		return fmt.Errorf("unreachable: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("answered %s", resp.Status)
	}
	return json.Unmarshal(body, into)
}
