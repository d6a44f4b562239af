package pinboard

import (
	"context"
	"fmt"
	"time"

	"github.com/pinnedd/pinnedd/pinboard/directory"
)

// RegisterRequest is a worker's registration (POST /registry/register).
type RegisterRequest struct {
	ClientID     string          `json:"clientId"`
	NodeID       string          `json:"nodeId,omitempty"`
	AdvertiseURL string          `json:"advertiseUrl"`
	Namespaces   []string        `json:"namespaces"`
	Headroom     int64           `json:"headroom"`
	TTLMs        int64           `json:"-"`
	LiveIDs      []directory.Key `json:"liveIds,omitempty"`
}

// HeartbeatRequest renews a session (POST /registry/heartbeat).
type HeartbeatRequest struct {
	ClientID  string `json:"clientId"`
	SessionID string `json:"sessionId"`
	Headroom  int64  `json:"headroom"`
	TTLMs     int64  `json:"-"`
}

// Ack answers a registration or heartbeat.
type Ack struct {
	ExpiresInMs int64           `json:"expiresInMs"`
	Degraded    bool            `json:"degraded,omitempty"`
	Draining    bool            `json:"draining,omitempty"`
	Drain       directory.Drain `json:"-"`
}

// RegisterAck answers a registration.
type RegisterAck struct {
	Ack
	SessionID  string          `json:"sessionId"`
	Duplicates []directory.Key `json:"duplicates,omitempty"`
}

// Registrar is where a worker registers: in-process for this node's own
// worker, or over HTTP for a remote one; both end in Registry.
type Registrar interface {
	Register(ctx context.Context, req RegisterRequest) (RegisterAck, error)
	Heartbeat(ctx context.Context, req HeartbeatRequest) (Ack, error)
	Deregister(ctx context.Context, clientID, sessionID string) error
}

// Registry turns worker registrations into directory commands, fixing the
// time and the session id before they are applied.
type Registry struct {
	dir *Directory
	ttl time.Duration
}

// NewRegistry serves registrations with lease TTL ttl.
func NewRegistry(dir *Directory, ttl time.Duration) *Registry {
	if ttl <= 0 {
		ttl = DefaultLeaseTTL
	}
	return &Registry{dir: dir, ttl: ttl}
}

// Register implements Registrar.
func (r *Registry) Register(ctx context.Context, req RegisterRequest) (RegisterAck, error) {
	sid := newID()
	res, err := r.dir.Do(ctx, directory.Register{
		ClientID: req.ClientID, SessionID: sid, NodeID: req.NodeID, AdvertiseURL: req.AdvertiseURL,
		Namespaces: req.Namespaces, Headroom: req.Headroom, TTLMs: r.ttl.Milliseconds(),
		Now: time.Now().UnixMilli(), LiveIDs: req.LiveIDs,
	})
	if err != nil {
		return RegisterAck{}, err
	}
	if res.Code != directory.CodeOK {
		return RegisterAck{}, fmt.Errorf("%w: %s %s", ErrRefused, res.Code, res.Reason)
	}
	return RegisterAck{Ack: ackOf(res), SessionID: sid, Duplicates: res.Duplicates}, nil
}

// Heartbeat implements Registrar.
func (r *Registry) Heartbeat(ctx context.Context, req HeartbeatRequest) (Ack, error) {
	res, err := r.dir.Do(ctx, directory.Heartbeat{
		ClientID: req.ClientID, SessionID: req.SessionID, Now: time.Now().UnixMilli(),
		TTLMs: r.ttl.Milliseconds(), Headroom: req.Headroom, ProbeOK: true,
	})
	if err != nil {
		return Ack{}, err
	}
	switch res.Code {
	case directory.CodeOK:
		return ackOf(res), nil
	case directory.CodeReregister:
		return Ack{}, ErrReregister
	default:
		return Ack{}, fmt.Errorf("%w: %s %s", ErrRefused, res.Code, res.Reason)
	}
}

// Deregister implements Registrar.
func (r *Registry) Deregister(ctx context.Context, clientID, sessionID string) error {
	_, err := r.dir.Do(ctx, directory.Deregister{ClientID: clientID, SessionID: sessionID})
	return err
}

func ackOf(res directory.Result) Ack {
	return Ack{ExpiresInMs: res.ExpiresInMs, Degraded: res.Degraded, Draining: res.Draining, Drain: res.Drain}
}
