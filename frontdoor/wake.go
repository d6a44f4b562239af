package frontdoor

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/pinnedd/pinnedd/pinboard"
	"github.com/pinnedd/pinnedd/pinboard/directory"
)

// wakePrefix is the owner-side route that activates an instance without a
// client request (its marked durable work then resumes).
const wakePrefix = "/_pinned/wake"

// Wake makes sure key runs somewhere when it is unplaced or its owner's
// lease lapsed: it claims a live worker for it (the resolver) and
// activates it there (the owner side here, or the owner's wake route). The
// leader's background scanner calls it for instances with marked durable
// work, so interrupted work resumes without any client. It reports whether
// it activated anything.
func (f *FrontDoor) Wake(ctx context.Context, key directory.Key) (bool, error) {
	p, owner, needed, err := f.res.placeToWake(ctx, key)
	if err != nil || !needed {
		return false, err
	}
	if p.Owner == f.res.self.ID() {
		return true, f.owner.wakeLocal(ctx, p)
	}
	if err := wakeOn(ctx, f.transport, f.dir.Machine().Secret(), f.res.self.ID(), p, owner); err != nil {
		return false, err
	}
	return true, nil
}

// wakeOn asks owner's node to activate p's instance (POST
// /_pinned/wake/<ns>/<id>, attested by caller).
func wakeOn(ctx context.Context, peer peerTransport, secret []byte, caller string, p directory.Placement, owner directory.Worker) error {
	path := ownerPath(wakePrefix, p.Key)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, peer.Base(owner)+path, nil)
	if err != nil {
		return err
	}
	req.Header.Set(pinboard.AttestationHeader, pinboard.SignFor(secret, owner.SessionID, pinboard.Attestation{Target: owner.ClientID, Caller: caller, Generation: p.Generation, At: time.Now()}, http.MethodPost, path))
	resp, err := peer.client.Do(req)
	if err != nil {
		return fmt.Errorf("wake %s on %s: %w", p.Key, owner.AdvertiseURL, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("wake %s on %s: %s", p.Key, owner.AdvertiseURL, resp.Status)
	}
	return nil
}
