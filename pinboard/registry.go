package pinboard

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/pinnedd/pinnedd/pinboard/directory"
	"github.com/pinnedd/pinnedd/plugins"
)

// Challenge is the fresh pair a worker sends with every registration and
// heartbeat: the registry fetches <advertiseUrl>/_pinned/challenge?challenge=
// and requires ChallengeValue, which only the sending process knows.
type Challenge struct {
	Challenge      string `json:"challenge"`
	ChallengeValue string `json:"challengeValue"`
}

// InstanceKey names an instance on the wire.
type InstanceKey struct {
	Env       string `json:"env,omitempty"`
	Namespace string `json:"namespace"`
	ID        string `json:"id"`
}

// RegisterRequest is a worker's registration (POST /registry/register).
type RegisterRequest struct {
	ClientID     string        `json:"clientId"`
	NodeID       string        `json:"nodeId,omitempty"`
	AdvertiseURL string        `json:"advertiseUrl"`
	Namespaces   []string      `json:"namespaces"`
	Headroom     int64         `json:"headroom"`
	LiveIDs      []InstanceKey `json:"liveIds,omitempty"`
	Draining     bool          `json:"draining,omitempty"` // draining by itself: place nothing new here
	Challenge
	routeFields // hostname-aware mode (hostnames.go)
}

// HeartbeatRequest renews a session (POST /registry/heartbeat).
type HeartbeatRequest struct {
	ClientID  string `json:"clientId"`
	SessionID string `json:"sessionId"`
	Headroom  int64  `json:"headroom"`
	Draining  bool   `json:"draining,omitempty"`
	Challenge
}

// Ack answers a registration or heartbeat. DrainDeadline is unix ms, set
// while an operator drain with a deadline is in force; Cordoned when the
// drain has none.
type Ack struct {
	ExpiresInMs   int64 `json:"expiresInMs"`
	Degraded      bool  `json:"degraded"`
	Draining      bool  `json:"draining"`
	Cordoned      bool  `json:"cordoned,omitempty"`
	DrainDeadline int64 `json:"drainDeadline,omitempty"`
}

// RegisterAck answers a registration. AttestationKey is the session's
// attestation key, WorkerKey(cluster secret, clientId, sessionId) in
// unpadded base64url: every request a front door forwards to this session
// is signed with it (REGISTRY.md, "Attestation").
type RegisterAck struct {
	Ack
	SessionID      string        `json:"sessionId"`
	AttestationKey string        `json:"attestationKey"`
	Duplicates     []InstanceKey `json:"duplicates,omitempty"`
}

// decodeAttestationKey reads RegisterAck.AttestationKey.
func decodeAttestationKey(s string) ([]byte, error) {
	k, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(k) != sha256.Size {
		return nil, fmt.Errorf("%w: the register answer's attestationKey is not 32 bytes of unpadded base64url", ErrBadAttestationKey)
	}
	return k, nil
}

// Registrar is where a worker registers: in-process for this node's own
// worker, or over HTTP for a remote one; both end in Registry.
type Registrar interface {
	Register(ctx context.Context, req RegisterRequest) (RegisterAck, error)
	Heartbeat(ctx context.Context, req HeartbeatRequest) (Ack, error)
	Deregister(ctx context.Context, clientID, sessionID string) error
}

// Registry turns worker registrations into directory commands: it checks
// the request, probes the worker's advertise URL, and fixes the time and
// the session id before the command is applied.
type Registry struct {
	dir    *Directory
	ttl    time.Duration
	client *http.Client
	// hostnameAware: registrations name routes (hostnames.go); set before
	// the registry serves.
	hostnameAware bool
}

// HostnameAware switches the registry to hostname-aware mode: workers
// register routes, and single mode's fields alone are refused.
func (r *Registry) HostnameAware() { r.hostnameAware = true }

// IsHostnameAware reports the mode.
func (r *Registry) IsHostnameAware() bool { return r.hostnameAware }

// NewRegistry serves registrations with lease TTL ttl.
func NewRegistry(dir *Directory, ttl time.Duration) *Registry {
	if ttl <= 0 {
		ttl = DefaultLeaseTTL
	}
	return &Registry{dir: dir, ttl: ttl, client: &http.Client{Timeout: 2 * time.Second}}
}

// VerifyWith makes the challenge probes verify an https advertise URL
// with roots (nil: the system roots).
func (r *Registry) VerifyWith(roots *x509.CertPool) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	r.client = &http.Client{Timeout: 2 * time.Second, Transport: tr}
}

// TTL is the lease TTL the registry grants.
func (r *Registry) TTL() time.Duration { return r.ttl }

// Registration failures the registry HTTP API maps to status codes.
var (
	// ErrRefused: the directory answered, and the answer was no.
	ErrRefused         = errors.New("refused by the directory")
	ErrBadRequest      = errors.New("bad request")
	ErrChallengeFailed = errors.New("challenge failed")
	ErrAdvertiseInUse  = errors.New("advertise URL held by another live worker")
	// ErrNoSecret: this node's replica has no cluster secret yet, so it
	// cannot derive the session's attestation key (answered 503).
	ErrNoSecret = errors.New("cluster secret not replicated to this node yet")
	// ErrBadAttestationKey: a register answer without a usable key.
	ErrBadAttestationKey = errors.New("bad attestation key")
	// ErrUnknownClient: no worker with this client id is registered.
	ErrUnknownClient = errors.New("unknown client id")
	// ErrNotYours: the placement to give back is another worker's, or
	// this worker's under another generation (answered 409).
	ErrNotYours = errors.New("placement not held under this generation")
)

// validClientID: 1-128 characters from A-Z a-z 0-9 - _ : @ ~. No '.' (it
// separates an attestation's fields) and nothing a header cannot carry.
func validClientID(id string) bool { return plugins.ValidName(id, "-_:@~") }

func validateRegister(req RegisterRequest) error {
	switch {
	case !validClientID(req.ClientID):
		return fmt.Errorf("%w: clientId must be 1-128 characters from A-Z a-z 0-9 - _ : @ ~", ErrBadRequest)
	case req.Challenge.Challenge == "" || req.ChallengeValue == "":
		return fmt.Errorf("%w: challenge and challengeValue are required", ErrBadRequest)
	case req.Headroom < 0:
		return fmt.Errorf("%w: headroom must not be negative", ErrBadRequest)
	case len(req.Namespaces) == 0 && len(req.Routes) == 0:
		return fmt.Errorf("%w: namespaces must not be empty", ErrBadRequest)
	}
	u, err := url.Parse(req.AdvertiseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("%w: advertiseUrl must be an absolute http(s) URL", ErrBadRequest)
	}
	for _, ns := range req.Namespaces {
		if err := plugins.ValidateNamespace(ns); err != nil {
			return fmt.Errorf("%w: %w", ErrBadRequest, err)
		}
	}
	for _, k := range req.LiveIDs {
		if err := errors.Join(plugins.ValidateNamespace(k.Namespace), plugins.ValidateID(k.ID)); err != nil {
			return fmt.Errorf("%w: liveIds holds an invalid key: %w", ErrBadRequest, err)
		}
	}
	return nil
}

// probe asks the advertise URL for the challenge's value: only the process
// that sent the pair knows it, so a URL shared by several processes fails.
func (r *Registry) probe(ctx context.Context, advertise string, c Challenge) bool {
	u := strings.TrimRight(advertise, "/") + "/_pinned/challenge?challenge=" + url.QueryEscape(c.Challenge)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return false
	}
	resp, err := r.client.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1024))
	return err == nil && resp.StatusCode == http.StatusOK &&
		subtle.ConstantTimeCompare(bytes.TrimSpace(body), []byte(c.ChallengeValue)) == 1
}

// Register implements Registrar.
func (r *Registry) Register(ctx context.Context, req RegisterRequest) (RegisterAck, error) {
	if err := validateRegister(req); err != nil {
		return RegisterAck{}, err
	}
	routes, err := req.routes(r.hostnameAware)
	if err != nil {
		return RegisterAck{}, err
	}
	// The key is derived from the cluster secret: without it nothing is
	// registered, rather than a session whose requests no key verifies.
	secret, err := r.awaitSecret(ctx)
	if err != nil {
		return RegisterAck{}, err
	}
	if !r.probe(ctx, req.AdvertiseURL, req.Challenge) {
		return RegisterAck{}, fmt.Errorf("%w: %s did not answer this worker's challenge", ErrChallengeFailed, req.AdvertiseURL)
	}
	live := make([]directory.Key, len(req.LiveIDs))
	for i, k := range req.LiveIDs {
		live[i] = directory.Key{Env: k.Env, Namespace: k.Namespace, ID: k.ID}
	}
	sid := newID()
	reg := directory.Register{
		ClientID: req.ClientID, SessionID: sid, NodeID: req.NodeID, AdvertiseURL: req.AdvertiseURL,
		Namespaces: req.Namespaces, Headroom: req.Headroom, TTLMs: r.ttl.Milliseconds(),
		Now: time.Now().UnixMilli(), LiveIDs: live, Draining: req.Draining,
	}
	var cmd directory.Command = reg
	if routes != nil {
		reg.Namespaces = nil // the routes name them
		cmd = directory.RegisterRoutes{Register: reg, Routes: routes}
	}
	res, err := r.dir.Do(ctx, cmd)
	if err != nil {
		return RegisterAck{}, err
	}
	switch res.Code {
	case directory.CodeOK:
	case directory.CodeBindingConflict:
		return RegisterAck{}, &RouteError{Err: ErrBindingConflict, Reason: res.Reason, Routes: specsOf(res.Superseded)}
	case directory.CodeDuplicateAdvertise:
		return RegisterAck{}, fmt.Errorf("%w (%s)", ErrAdvertiseInUse, res.Reason)
	case directory.CodeInvalid:
		return RegisterAck{}, fmt.Errorf("%w: %s", ErrBadRequest, res.Reason)
	default:
		return RegisterAck{}, fmt.Errorf("%w: %s %s", ErrRefused, res.Code, res.Reason)
	}
	ack := RegisterAck{Ack: ackOf(res), SessionID: sid,
		AttestationKey: base64.RawURLEncoding.EncodeToString(WorkerKey(secret, req.ClientID, sid))}
	for _, k := range res.Duplicates {
		ack.Duplicates = append(ack.Duplicates, InstanceKey{Env: k.Env, Namespace: k.Namespace, ID: k.ID})
	}
	return ack, nil
}

// secretWait bounds how long a registration waits for the cluster secret
// to reach this node's replica (the first leader creates it at once; a
// node that just joined catches up in moments).
const secretWait = 2 * time.Second

// awaitSecret returns the cluster secret once this node's replica has it.
func (r *Registry) awaitSecret(ctx context.Context) ([]byte, error) {
	deadline := time.Now().Add(secretWait)
	for {
		if s := r.dir.Machine().Secret(); len(s) != 0 {
			return s, nil
		}
		if time.Now().After(deadline) {
			return nil, ErrNoSecret
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Heartbeat implements Registrar. A failed probe still renews the lease but
// marks the worker degraded: new placements skip it until a probe passes.
func (r *Registry) Heartbeat(ctx context.Context, req HeartbeatRequest) (Ack, error) {
	if req.ClientID == "" || req.SessionID == "" || req.Headroom < 0 {
		return Ack{}, fmt.Errorf("%w: clientId and sessionId are required, headroom must not be negative", ErrBadRequest)
	}
	advertise := ""
	if w, ok := r.dir.Machine().Worker(req.ClientID); ok {
		advertise = w.AdvertiseURL
	}
	probeOK := advertise != "" && req.Challenge.Challenge != "" && r.probe(ctx, advertise, req.Challenge)
	res, err := r.dir.Do(ctx, directory.Heartbeat{
		ClientID: req.ClientID, SessionID: req.SessionID, Now: time.Now().UnixMilli(),
		TTLMs: r.ttl.Milliseconds(), Headroom: req.Headroom, ProbeOK: probeOK, Draining: req.Draining,
	})
	if err != nil {
		return Ack{}, err
	}
	switch res.Code {
	case directory.CodeOK:
		if len(res.Superseded) != 0 {
			// Renewed all the same: the worker's other routes serve on.
			return ackOf(res), &RouteError{Err: ErrSuperseded, Routes: specsOf(res.Superseded)}
		}
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

// GiveBack is a worker giving back one id it holds (an instance it
// evicted), without deregistering: the next request places the id anew.
// Giving back a placement that is gone already is no error (released
// false): a retry after an unknown outcome answers as the first try did.
type GiveBack struct {
	ClientID   string
	SessionID  string
	Key        InstanceKey
	Generation uint64
}

// GiveBackResult says what a GiveBack did. Held is the placement now in
// force when ErrNotYours is returned.
type GiveBackResult struct {
	Released bool
	Held     directory.Placement
}

// GiveBack removes the placement of req.Key iff this session of
// req.ClientID holds it under req.Generation; the directory checks the
// session and the generation in the same command that removes it.
func (r *Registry) GiveBack(ctx context.Context, req GiveBack) (GiveBackResult, error) {
	switch {
	case req.ClientID == "" || req.SessionID == "":
		return GiveBackResult{}, fmt.Errorf("%w: clientId and sessionId are required", ErrBadRequest)
	}
	if err := errors.Join(plugins.ValidateNamespace(req.Key.Namespace), plugins.ValidateID(req.Key.ID)); err != nil {
		return GiveBackResult{}, fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	switch {
	case req.Generation == 0:
		return GiveBackResult{}, fmt.Errorf("%w: generation must be the placement's generation (a positive integer, as the attestation carries it)", ErrBadRequest)
	}
	res, err := r.dir.Do(ctx, directory.GiveBack{
		Key:      directory.Key{Env: req.Key.Env, Namespace: req.Key.Namespace, ID: req.Key.ID},
		ClientID: req.ClientID, SessionID: req.SessionID, Generation: req.Generation,
	})
	if err != nil {
		return GiveBackResult{}, err
	}
	switch res.Code {
	case directory.CodeOK:
		return GiveBackResult{Released: true}, nil
	case directory.CodeNotFound:
		return GiveBackResult{}, nil
	case directory.CodeHeld:
		return GiveBackResult{Held: res.Placement}, ErrNotYours
	case directory.CodeUnknownWorker:
		return GiveBackResult{}, fmt.Errorf("%w %q", ErrUnknownClient, req.ClientID)
	case directory.CodeReregister:
		return GiveBackResult{}, ErrReregister
	default:
		return GiveBackResult{}, fmt.Errorf("%w: %s %s", ErrRefused, res.Code, res.Reason)
	}
}

func ackOf(res directory.Result) Ack {
	a := Ack{ExpiresInMs: res.ExpiresInMs, Degraded: res.Degraded, Draining: res.Draining}
	if res.Draining {
		a.Cordoned = res.Drain.Cordon
		a.DrainDeadline = res.Drain.Deadline
	}
	return a
}
