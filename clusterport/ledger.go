package clusterport

import (
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/pinnedd/pinnedd/internal/clustertls"
)

// CAOp is a change to the cluster CAs the log records; its value is the log entry's op, so it
// is part of the log's format and never changes.
type CAOp string

const (
	// OpCA records the cluster CA if none is recorded (the first one stays), or records a
	// recorded CA again with its key sealed.
	OpCA CAOp = "ca"
	// OpCARotate adds a CA that issues from then on; the ones before stay trusted until retired.
	OpCARotate CAOp = "ca-rotate"
	// OpCARetire retires a CA that does not issue, and drops its key.
	OpCARetire CAOp = "ca-retire"
)

// CARecord is one cluster CA as the log recorded it: its key sealed under the deployment token,
// or in clear (by an older node or one without a token). Its JSON is part of the snapshot format.
type CARecord struct {
	Cert    string `json:"cert"`
	Key     string `json:"key"`
	Retired bool   `json:"retired,omitempty"`
}

// Ledger is the cluster CAs the replicated log records, as this node's replica applied them,
// oldest first: the last one not retired issues (when this node can open its key), every one
// not retired is trusted. The log's state machine applies entries to it and carries its records
// in snapshots; everything else reads it.
type Ledger struct {
	sealer   *clustertls.Sealer
	validity time.Duration // of the certificates the issuer signs
	log      *slog.Logger
	unusable func() // a recorded CA does not open or parse here

	mu     sync.RWMutex
	cas    []CARecord
	ca     *clustertls.CA // the issuer opened, once opened (Issuer)
	opened bool
}

// NewLedger is an empty ledger. sealer opens sealed keys (nil: this node has no token);
// validity is what the certificates the issuer signs hold (0: the default).
func NewLedger(sealer *clustertls.Sealer, validity time.Duration, log *slog.Logger) *Ledger {
	return &Ledger{sealer: sealer, validity: validity, log: log, unusable: func() {}}
}

// CountUnusable has fn count each time a recorded CA does not open or parse here. Set it
// before the log applies anything.
func (l *Ledger) CountUnusable(fn func()) { l.unusable = fn }

// Apply applies one committed CA entry and reports whether it changed what is recorded. "ca"
// records the cluster CA only if none is: a second bootstrap's CA (a mistake) cannot replace
// the one every certificate chains to. Any op but a retirement that carries a recorded CA with
// a newly sealed key replaces the key (sealed again, under the leader's current token). What
// was recorded stays, for snapshots, even where this node cannot open or use it: that is
// logged, and this node issues no certificate.
func (l *Ledger) Apply(op CAOp, certPEM, keyPEM string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	at := slices.IndexFunc(l.cas, func(r CARecord) bool { return r.Cert == certPEM })
	switch {
	case op == OpCA && len(l.cas) == 0, op == OpCARotate && at < 0 && len(l.cas) > 0:
		l.cas = append(l.cas, CARecord{Cert: certPEM, Key: keyPEM})
	case op != OpCARetire && at >= 0 && !l.cas[at].Retired && clustertls.IsSealed([]byte(keyPEM)) && keyPEM != l.cas[at].Key:
		l.cas[at].Key = keyPEM
	case op == OpCARetire && at >= 0 && at != l.issuerLocked() && !l.cas[at].Retired:
		// Its key goes with it: nothing signs with a retired CA, and the
		// snapshots after this no longer hold it for anyone to open.
		l.cas[at].Retired, l.cas[at].Key = true, ""
	default:
		return false
	}
	l.ca, l.opened = nil, false
	return true
}

// Records are the CAs recorded, for a snapshot, and the issuer among them (-1: none).
func (l *Ledger) Records() ([]CARecord, int) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return slices.Clone(l.cas), l.issuerLocked()
}

// Restore replaces the records with a snapshot's.
func (l *Ledger) Restore(recs []CARecord) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cas = recs
	l.ca, l.opened = nil, false // opened when asked for (Issuer)
}

// issuerLocked is the index of the CA that issues (the last one not retired), or -1.
func (l *Ledger) issuerLocked() int {
	for i := len(l.cas) - 1; i >= 0; i-- {
		if !l.cas[i].Retired {
			return i
		}
	}
	return -1
}

// Issuer is the issuing CA with its key opened, or nil: none recorded, or this node cannot open
// it. It is opened when first asked for after a change, not as each change applies: a log
// replayed from before a token rotation holds records this node no longer opens, replaced by
// entries further on.
func (l *Ledger) Issuer() *clustertls.CA {
	l.mu.RLock()
	ca, opened := l.ca, l.opened
	l.mu.RUnlock()
	if opened {
		return ca
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.opened {
		l.ca, l.opened = l.openLocked(), true
	}
	return l.ca
}

// openLocked is the issuing CA with its key opened, or nil (logged) if this node cannot.
func (l *Ledger) openLocked() *clustertls.CA {
	i := l.issuerLocked()
	if i < 0 {
		return nil
	}
	rec := l.cas[i]
	key := []byte(rec.Key)
	if clustertls.IsSealed(key) {
		if l.sealer == nil {
			l.log.Error("the cluster CA's key is sealed with the deployment token, and this node has none: it issues no certificates")
			return nil
		}
		var err error
		if key, err = l.sealer.Open(clustertls.LabelCAKey, key); err != nil {
			l.unusable()
			l.log.Error("the cluster CA's key does not open with this node's deployment token: it issues no certificates", "err", err)
			return nil
		}
	}
	ca, err := clustertls.ParseCA([]byte(rec.Cert), key)
	if err != nil {
		l.unusable()
		l.log.Error("the cluster CA recorded in the log is unusable here", "err", err)
		return nil
	}
	ca.NodeValidity = l.validity
	return ca
}

// KeyToSeal is a CA whose key this node would seal (again): recorded in clear, or sealed under
// a token being rotated out (not its first); nil if there is none, or this node has no sealer.
func (l *Ledger) KeyToSeal() *CARecord {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.sealer == nil {
		return nil
	}
	for _, r := range l.cas {
		if r.Retired {
			continue // its key is gone
		}
		if !clustertls.IsSealed([]byte(r.Key)) {
			return &r
		}
		if _, stale, err := l.sealer.OpenStale(clustertls.LabelCAKey, []byte(r.Key)); err == nil && stale {
			return &r
		}
	}
	return nil
}

// Retirable are the certificates (as recorded) of the CAs trusted that do not issue.
func (l *Ledger) Retirable() []string {
	l.mu.RLock()
	defer l.mu.RUnlock()
	var out []string
	for i, r := range l.cas {
		if !r.Retired && i != l.issuerLocked() {
			out = append(out, r.Cert)
		}
	}
	return out
}

// Trusted is the bundle of the CAs trusted, the issuer first (nil before any is recorded), and
// how many there are.
func (l *Ledger) Trusted() ([]byte, int) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	var b []byte
	n := 0
	for i := len(l.cas) - 1; i >= 0; i-- {
		if !l.cas[i].Retired {
			b = append(b, l.cas[i].Cert...)
			n++
		}
	}
	return b, n
}
