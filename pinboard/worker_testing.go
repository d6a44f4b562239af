package pinboard

import "time"

// SetRegisteredForTesting makes w act as registered: clientID (if not
// empty) under sessionID (if not empty), its lease good until expiresAt
// (if not zero), with no registry involved. It exists for the tests of
// the parts that route by the worker's lease and session (package
// frontdoor); nothing in pinnedd calls it.
func (w *Worker) SetRegisteredForTesting(clientID, sessionID string, expiresAt time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if clientID != "" {
		w.clientID = clientID
	}
	if sessionID != "" {
		w.sessionID = sessionID
	}
	if !expiresAt.IsZero() {
		w.expiresAt = expiresAt
	}
}
