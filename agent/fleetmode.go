package agent

import (
	"context"
	"time"

	"github.com/pinnedd/pinnedd/pinboard/directory"
)

// fleetModeEvery is how often a node looks for workers registered in the
// other mode.
const fleetModeEvery = 10 * time.Second

// watchFleetMode logs an ERROR, once per worker, for each live worker of
// the fleet registered in the other mode (--hostname-aware on one node and
// not on another). Such a fleet runs, but each front door routes only
// through its own mode's records: requests answer 503 for what the other
// kind of node serves. The directory does not record the fleet's mode, so
// this is where an operator hears of it.
func (a *Agent) watchFleetMode(ctx context.Context) {
	warned := map[string]bool{}
	t := time.NewTicker(fleetModeEvery)
	defer t.Stop()
	for {
		now := time.Now().UnixMilli()
		for _, w := range a.dir.Machine().Workers() {
			if warned[w.ClientID] || !w.Live(now) || !otherMode(w, a.cfg.HostnameAware) {
				continue
			}
			warned[w.ClientID] = true
			a.log.Error("a worker of this fleet runs in the other mode: every node of a fleet must run alike (--hostname-aware on all or none); requests reach only the workers of each front door's own mode",
				"hostname_aware", a.cfg.HostnameAware, "worker_node", w.NodeID, "worker", w.ClientID)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// otherMode: w registered as the other mode's workers do (routes in
// hostname-aware mode, namespaces in single mode).
func otherMode(w directory.Worker, hostnameAware bool) bool {
	if hostnameAware {
		return len(w.Namespaces) > 0
	}
	return len(w.Routes) > 0
}
