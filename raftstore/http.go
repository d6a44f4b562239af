package raftstore

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/pinnedd/pinnedd/clusterport"
)

// HandlerPrefix is the path prefix Handler serves; mount it as mux.Handle(HandlerPrefix, h).
const HandlerPrefix = "/_raft/"

// forwardedHeader marks a request a raftstore node sent to the node it believes is the
// leader. The receiver then acts only locally (never forwards again), so a stale view of the
// leader costs one ErrNotLeader round trip instead of a forwarding loop.
const forwardedHeader = "X-Raftstore-Forwarded"

const maxJSONBody = 64 << 10

type joinRequest struct {
	ID       string `json:"id"`
	RaftAddr string `json:"raft_addr"`
	APIAddr  string `json:"api_addr,omitempty"`
	// Fence is the membership fence the join was made against (Store.joinLocal); a join proof
	// covers it with the rest of the body.
	Fence uint64 `json:"fence,omitempty"`
}

type removeRequest struct {
	ID string `json:"id"`
}

type metaRequest struct {
	ID      string `json:"id"`
	APIAddr string `json:"api_addr"`
}

type errorBody struct {
	Error string `json:"error"`
	Code  string `json:"code"`
	// Fence, with code stale_join, is the cluster's membership fence for the next attempt.
	Fence uint64 `json:"fence,omitempty"`
}

// Error codes on the wire. A client maps them back to sentinels.
const (
	codeNotLeader      = "not_leader"
	codeNoLeader       = "no_leader"
	codeOutcomeUnknown = "outcome_unknown"
	codeClosed         = "closed"
	codeBadRequest     = "bad_request"
	codeUnauthorized   = "unauthorized"
	codeForbidden      = "forbidden"
	codeLastVoter      = "last_voter"
	codeUnknownMember  = "unknown_member"
	codeNoClusterCA    = "no_cluster_ca"
	codeStaleJoin      = "stale_join"
	codeInternal       = "internal"
)

// Handler serves the forwarding and membership RPCs under HandlerPrefix:
//
//	POST /_raft/apply    a command a follower forwarded, raw bytes -> 200 raw result bytes
//	POST /_raft/join     {"id","raft_addr","api_addr","fence"} -> 204; 409 stale_join {"fence"}
//	POST /_raft/remove   {"id"} -> 204
//	POST /_raft/meta     {"id","api_addr"} -> 204 (raftstore-internal)
//	GET  /_raft/members  -> 200 [Member...]
//	GET  /_raft/ca       -> 200 {"ca","pin"}: the cluster CA and its pin (no authorization: both are public)
//	POST /_raft/certificate {"id","csr"} -> 200 {"cert","ca"}: a joining node's certificate (403
//	                     for a current member's id, unless it asks over its own certificate)
//	POST /_raft/tls/rotate {} -> 200 {"ca"}: a new cluster CA (RotateCA), its fingerprint
//	GET  /_raft/tls      -> 200 TLSState: the CAs trusted, the issuer, this node's certificate
//
// Errors are JSON {"error","code"} with a 4xx/5xx status; code not_leader, no_leader or closed
// means nothing was started, outcome_unknown that it may have been. apply, and any request a
// follower marked as forwarded, is handled on this node only (apply by the ForwardedFunc, if
// set); any other request may be forwarded once to the leader. authorize decides every
// request (e.g. check the bearer token): nil admits it, an error wrapping ErrForbidden is a 403
// (a known caller without the right), any other a 401; a nil authorize admits all, which only
// suits tests and closed networks.
//
// With mutual TLS, node-to-node calls (apply, meta, and whatever a follower forwards) travel
// only over the cluster port (PeerHandler): Handler, for the public port, refuses them whatever
// token they carry, and keeps what an operator or a joining node asks.
func (s *Store) Handler(authorize func(*http.Request) error) http.Handler {
	mux := s.rpc.routes(s.cfg.Cluster == nil)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The CA certificate is public and its pin reveals nothing of the token: a joining
		// node reads both before it sends the token anywhere.
		open := r.Method == http.MethodGet && r.URL.Path == HandlerPrefix+"ca"
		if r.Header.Get(joinProofHeader) != "" {
			// A joining node's request, proved with the token instead of carrying it.
			if err := s.rpc.checkJoinProof(w, r); err != nil {
				writeError(w, err)
				return
			}
			open = true
		}
		if !open && authorize != nil {
			if err := authorize(r); err != nil {
				if !errors.Is(err, ErrForbidden) {
					err = fmt.Errorf("%w: %w", ErrUnauthorized, err)
				}
				writeError(w, err)
				return
			}
		}
		if s.cfg.Cluster != nil && forwarded(r) {
			writeError(w, errPeerOnly(r))
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// rpcServer serves the store's RPCs (Handler, PeerHandler), as a Consul endpoint serves its
// server's: on the store's public operations and the leader-side steps they forward to.
type rpcServer struct{ s *Store }

// routes are the RPCs; peer says whether node-to-node ones (apply, meta) are served.
func (rs *rpcServer) routes(peer bool) *http.ServeMux {
	mux := http.NewServeMux()
	nodeToNode := func(h http.HandlerFunc) http.HandlerFunc {
		if peer {
			return h
		}
		return func(w http.ResponseWriter, r *http.Request) { writeError(w, errPeerOnly(r)) }
	}
	mux.HandleFunc("POST "+HandlerPrefix+"apply", nodeToNode(rs.handleApply))
	mux.HandleFunc("POST "+HandlerPrefix+"meta", nodeToNode(rs.handleMeta))
	mux.HandleFunc("POST "+HandlerPrefix+"join", rs.handleJoin)
	mux.HandleFunc("POST "+HandlerPrefix+"remove", rs.handleRemove)
	mux.HandleFunc("GET "+HandlerPrefix+"members", rs.handleMembers)
	mux.HandleFunc("POST "+HandlerPrefix+"certificate", rs.handleCertificate)
	mux.HandleFunc("GET "+HandlerPrefix+"ca", rs.handleCA)
	mux.HandleFunc("POST "+HandlerPrefix+"tls/rotate", rs.handleRotate)
	mux.HandleFunc("GET "+HandlerPrefix+"tls", rs.handleTLS)
	return mux
}

func errPeerOnly(r *http.Request) error {
	return fmt.Errorf("%w: %s is a node-to-node call: it is served only on the cluster port, over mutual TLS", ErrForbidden, r.URL.Path)
}

func forwarded(r *http.Request) bool { return r.Header.Get(forwardedHeader) != "" }

// localOnly runs fn if this node is the leader, for requests that were already forwarded.
func (rs *rpcServer) localOnly(fn func() error) error {
	if err := rs.s.leads(); err != nil {
		return err
	}
	return fn()
}

// leads is nil if this node is the leader and open, else ErrClosed or ErrNotLeader.
func (s *Store) leads() error {
	if s.closed.Load() {
		return ErrClosed
	}
	if !s.IsLeader() {
		return ErrNotLeader
	}
	return nil
}

// handleApply takes a command a follower's Apply forwarded: only followers send it, so it is
// handled on this node only, whether or not it is marked.
func (rs *rpcServer) handleApply(w http.ResponseWriter, r *http.Request) {
	cmd, err := io.ReadAll(http.MaxBytesReader(w, r.Body, rs.s.cfg.MaxCommandBytes))
	if err != nil {
		writeError(w, fmt.Errorf("%w: reading command: %w", ErrBadRequest, err))
		return
	}
	res, err := rs.applyForwarded(r.Context(), cmd)
	if err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(res)
}

func (rs *rpcServer) handleJoin(w http.ResponseWriter, r *http.Request) {
	var req joinRequest
	if !readJSON(w, r, &req) {
		return
	}
	if req.ID == "" || req.RaftAddr == "" {
		writeError(w, fmt.Errorf("%w: join needs id and raft_addr", ErrBadRequest))
		return
	}
	var err error
	if forwarded(r) {
		err = rs.localOnly(func() error { return rs.s.members.joinLocal(r.Context(), req) })
	} else {
		err = rs.s.members.join(r.Context(), req)
	}
	writeResult(w, err)
}

func (rs *rpcServer) handleRemove(w http.ResponseWriter, r *http.Request) {
	var req removeRequest
	if !readJSON(w, r, &req) {
		return
	}
	if req.ID == "" {
		writeError(w, fmt.Errorf("%w: remove needs id", ErrBadRequest))
		return
	}
	var err error
	if forwarded(r) {
		err = rs.localOnly(func() error { return rs.s.members.removeLocal(r.Context(), req.ID) })
	} else {
		err = rs.s.Remove(r.Context(), req.ID)
	}
	writeResult(w, err)
}

func (rs *rpcServer) handleMeta(w http.ResponseWriter, r *http.Request) {
	var req metaRequest
	if !readJSON(w, r, &req) {
		return
	}
	if req.ID == "" || req.APIAddr == "" {
		writeError(w, fmt.Errorf("%w: meta needs id and api_addr", ErrBadRequest))
		return
	}
	var err error
	if forwarded(r) {
		err = rs.localOnly(func() error { return rs.s.members.setMetaLocal(r.Context(), req.ID, req.APIAddr) })
	} else {
		err = rs.s.members.setMeta(r.Context(), req.ID, req.APIAddr)
	}
	writeResult(w, err)
}

func (rs *rpcServer) handleMembers(w http.ResponseWriter, r *http.Request) {
	ms, err := rs.s.Members(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(ms)
}

func readJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxJSONBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		writeError(w, fmt.Errorf("%w: %w", ErrBadRequest, err))
		return false
	}
	return true
}

func writeResult(w http.ResponseWriter, err error) {
	if err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// wireErrors is the one mapping between the sentinels and the RPCs' error codes, both ways:
// writeError answers the first entry an error matches (or also matches) with its status and
// code, and a client makes the code back into the entry's sentinel (remoteError).
var wireErrors = []struct {
	err, also error // what the server matches
	status    int
	code      string
	back      error // what a client makes of the code; nil: err
}{
	{err: ErrOutcomeUnknown, status: http.StatusServiceUnavailable, code: codeOutcomeUnknown},
	// A closed node started nothing: as a follower would, the caller tries the leader again.
	{err: ErrClosed, status: http.StatusServiceUnavailable, code: codeClosed, back: ErrNotLeader},
	{err: ErrNotLeader, status: http.StatusServiceUnavailable, code: codeNotLeader},
	{err: ErrNoLeader, status: http.StatusServiceUnavailable, code: codeNoLeader},
	{err: ErrBadRequest, also: clusterport.ErrInvalid, status: http.StatusBadRequest, code: codeBadRequest},
	{err: ErrUnauthorized, status: http.StatusUnauthorized, code: codeUnauthorized},
	{err: ErrForbidden, also: clusterport.ErrRefused, status: http.StatusForbidden, code: codeForbidden},
	{err: ErrLastVoter, status: http.StatusConflict, code: codeLastVoter},
	{err: ErrUnknownMember, status: http.StatusNotFound, code: codeUnknownMember},
	{err: ErrNoClusterCA, status: http.StatusConflict, code: codeNoClusterCA},
	{err: ErrStaleJoin, status: http.StatusConflict, code: codeStaleJoin}, // with the fence (errorBody.Fence)
}

func writeError(w http.ResponseWriter, err error) {
	status, code := http.StatusInternalServerError, codeInternal
	for _, e := range wireErrors {
		if errors.Is(err, e.err) || e.also != nil && errors.Is(err, e.also) {
			status, code = e.status, e.code
			break
		}
	}
	body := errorBody{Error: err.Error(), Code: code}
	if stale := (*staleJoinError)(nil); errors.As(err, &stale) {
		body.Fence = stale.current
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}

// joinProofHeader carries a join proof (certificate and join requests of a joining node).
const joinProofHeader = "X-Pinnedd-Join-Proof"

// PeerHandler serves raftstore's RPCs on the cluster port (clusterport.Cluster.Serve, which
// checks the caller's membership), node-to-node ones included, under HandlerPrefix.
func (s *Store) PeerHandler() http.Handler { return s.rpc.routes(true) }
