package pinboard

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/pinnedd/pinnedd/internal/httpx"
	"github.com/pinnedd/pinnedd/pinboard/directory"
)

// wakePrefix is the owner-side route that activates an instance without a
// client request (its marked durable work then resumes).
const wakePrefix = "/_pinned/wake"

// Wake makes sure key runs somewhere when it is unplaced or its owner's
// lease lapsed: it claims a live worker for it and activates it there. The
// leader's background scanner calls it for instances with marked durable
// work, so interrupted work resumes without any client. It reports whether
// it activated anything.
func (f *FrontDoor) Wake(ctx context.Context, key directory.Key) (bool, error) {
	now := time.Now().UnixMilli()
	if _, owner, ok := f.cfg.Dir.Machine().Owner(key); ok && owner.Live(now) {
		return false, nil // placed on a live worker: its owner resumes it
	}
	p, owner, err := f.claimFor(ctx, &route{key: key}, "", nil, "")
	if err != nil {
		return false, err
	}
	if p.Owner == f.selfID() {
		return true, f.wakeLocal(ctx, p)
	}
	secret := f.cfg.Dir.Machine().Secret()
	path := wakePrefix + key.Namespace + "/" + key.ID
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(owner.AdvertiseURL, "/")+path, nil)
	if err != nil {
		return false, err
	}
	req.Header.Set(AttestationHeader, SignFor(secret, owner.SessionID, Attestation{Target: owner.ClientID, Caller: f.selfID(), Generation: p.Generation, At: time.Now()}, http.MethodPost, path))
	resp, err := f.client.Do(req)
	if err != nil {
		return false, fmt.Errorf("wake %s on %s: %w", key, owner.AdvertiseURL, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		return false, fmt.Errorf("wake %s on %s: %s", key, owner.AdvertiseURL, resp.Status)
	}
	return true, nil
}

func (f *FrontDoor) wakeLocal(ctx context.Context, p directory.Placement) error {
	if f.cfg.Worker == nil || f.cfg.Worker.Lease(time.Now()) != LeaseHealthy {
		return fmt.Errorf("wake %s: this worker's lease is not healthy", p.Key)
	}
	if f.cfg.Local == nil {
		return fmt.Errorf("wake %s: this node hosts no instances", p.Key)
	}
	return f.cfg.Local.Wake(ctx, p.Key.Namespace, p.Key.ID, p.Generation)
}

// wakeOwned serves POST /_pinned/wake/<ns>/<id> to an attested caller, for
// a placement this node's replica shows under the attested generation.
func (f *FrontDoor) wakeOwned(w http.ResponseWriter, r *http.Request) {
	ns, id, _, err := parseInstancePath(strings.TrimPrefix(r.URL.EscapedPath(), wakePrefix))
	if err != nil {
		httpx.WriteError(w, http.StatusBadRequest, "invalid instance path: "+err.Error(), 0)
		return
	}
	if f.cfg.Worker == nil {
		f.notOwner(w)
		return
	}
	att, ok := f.attested(w, r, r.URL.EscapedPath())
	if !ok {
		return
	}
	key := directory.Key{Namespace: ns, ID: id}
	p, ok := f.awaitPlacement(r.Context(), key, att.Generation)
	if !ok {
		f.notOwner(w)
		return
	}
	if err := f.wakeLocal(r.Context(), p); err != nil {
		httpx.WriteError(w, http.StatusServiceUnavailable, err.Error(), time.Second)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// awaitPlacement waits (briefly) until this node's replica shows key
// placed under generation or a newer one, and reports the placement if it
// is ours under exactly that generation. The forwarder resolved it through
// the leader, so our replica may be a few entries behind.
func (f *FrontDoor) awaitPlacement(ctx context.Context, key directory.Key, generation uint64) (directory.Placement, bool) {
	m := f.cfg.Dir.Machine()
	deadline := time.Now().Add(3 * time.Second)
	for {
		p, found := m.Placement(key)
		if found && p.Generation >= generation {
			if p.Owner != f.selfID() || p.Generation != generation {
				return directory.Placement{}, false
			}
			return p, true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return directory.Placement{}, false
		}
		time.Sleep(5 * time.Millisecond)
	}
}
