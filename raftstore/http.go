package raftstore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/pinnedd/pinnedd/clusterport"
	"github.com/pinnedd/pinnedd/internal/clustertls"
	"github.com/pinnedd/pinnedd/internal/httpx"
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
// only over the cluster port (ServePeers): Handler, for the public port, refuses them whatever
// token they carry, and keeps what an operator or a joining node asks.
func (s *Store) Handler(authorize func(*http.Request) error) http.Handler {
	mux := s.routes(s.stream == nil)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The CA certificate is public and its pin reveals nothing of the token: a joining
		// node reads both before it sends the token anywhere.
		open := r.Method == http.MethodGet && r.URL.Path == HandlerPrefix+"ca"
		if r.Header.Get(joinProofHeader) != "" {
			// A joining node's request, proved with the token instead of carrying it.
			if err := s.checkJoinProof(w, r); err != nil {
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
		if s.stream != nil && forwarded(r) {
			writeError(w, errPeerOnly(r))
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// routes are the RPCs; peer says whether node-to-node ones (apply, meta) are served.
func (s *Store) routes(peer bool) *http.ServeMux {
	mux := http.NewServeMux()
	nodeToNode := func(h http.HandlerFunc) http.HandlerFunc {
		if peer {
			return h
		}
		return func(w http.ResponseWriter, r *http.Request) { writeError(w, errPeerOnly(r)) }
	}
	mux.HandleFunc("POST "+HandlerPrefix+"apply", nodeToNode(s.handleApply))
	mux.HandleFunc("POST "+HandlerPrefix+"meta", nodeToNode(s.handleMeta))
	mux.HandleFunc("POST "+HandlerPrefix+"join", s.handleJoin)
	mux.HandleFunc("POST "+HandlerPrefix+"remove", s.handleRemove)
	mux.HandleFunc("GET "+HandlerPrefix+"members", s.handleMembers)
	mux.HandleFunc("POST "+HandlerPrefix+"certificate", s.handleCertificate)
	mux.HandleFunc("GET "+HandlerPrefix+"ca", s.handleCA)
	mux.HandleFunc("POST "+HandlerPrefix+"tls/rotate", s.handleRotate)
	mux.HandleFunc("GET "+HandlerPrefix+"tls", s.handleTLS)
	return mux
}

func (s *Store) handleRotate(w http.ResponseWriter, r *http.Request) {
	var req struct{}
	if !readJSON(w, r, &req) {
		return
	}
	var fp string
	var err error
	if forwarded(r) {
		err = s.localOnly(func() error {
			var lerr error
			fp, lerr = s.RotateCA(r.Context())
			return lerr
		})
	} else {
		fp, err = s.RotateCA(r.Context())
	}
	if err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]string{"ca": fp})
}

func (s *Store) handleTLS(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(s.TLS())
}

// RotateCAVia asks the member at memberURL to rotate the cluster CA (RotateCA) and answers the
// new CA's fingerprint.
func RotateCAVia(ctx context.Context, client *http.Client, memberURL, token string) (string, error) {
	var ans struct {
		CA string `json:"ca"`
	}
	err := callJSON(ctx, client, memberURL, bearer(token), "tls/rotate", struct{}{}, &ans, false)
	return ans.CA, err
}

// TLSVia is the cluster CAs and the certificate of the node at nodeURL (GET /_raft/tls).
func TLSVia(ctx context.Context, client *http.Client, nodeURL, token string) (TLSState, error) {
	var st TLSState
	err := callJSON(ctx, client, nodeURL, bearer(token), "tls", nil, &st, false)
	return st, err
}

// joinTokens are the tokens a join proof may be made with and the CA is pinned for: Token
// first, then the other JoinTokens.
func (s *Store) joinTokens() []string {
	out := []string{s.cfg.Token}
	for _, t := range s.cfg.JoinTokens {
		if t != "" && !slices.Contains(out, t) {
			out = append(out, t)
		}
	}
	return out
}

// checkJoinProof admits a join or certificate request by its join proof, made with one of
// this node's join tokens over the request's method, path and body (read here, and put back
// for the handler).
func (s *Store) checkJoinProof(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodPost || (r.URL.Path != HandlerPrefix+"join" && r.URL.Path != HandlerPrefix+"certificate") {
		return fmt.Errorf("%w: a join proof admits only a join or certificate request", ErrUnauthorized)
	}
	if s.cfg.Token == "" {
		return fmt.Errorf("%w: this node has no token to check a join proof with", ErrUnauthorized)
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxJSONBody))
	if err != nil {
		return fmt.Errorf("%w: reading the request: %w", ErrBadRequest, err)
	}
	proof, now := r.Header.Get(joinProofHeader), time.Now()
	for _, token := range s.joinTokens() {
		if err = clustertls.CheckJoinProof(token, proof, r.Method, r.URL.Path, body, now); err == nil {
			r.Body = io.NopCloser(bytes.NewReader(body))
			return nil
		}
	}
	return fmt.Errorf("%w: %w", ErrUnauthorized, err)
}

func errPeerOnly(r *http.Request) error {
	return fmt.Errorf("%w: %s is a node-to-node call: it is served only on the cluster port, over mutual TLS", ErrForbidden, r.URL.Path)
}

func forwarded(r *http.Request) bool { return r.Header.Get(forwardedHeader) != "" }

// localOnly runs fn if this node is the leader, for requests that were already forwarded.
func (s *Store) localOnly(fn func() error) error {
	if err := s.leads(); err != nil {
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
func (s *Store) handleApply(w http.ResponseWriter, r *http.Request) {
	cmd, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxCommandBytes))
	if err != nil {
		writeError(w, fmt.Errorf("%w: reading command: %w", ErrBadRequest, err))
		return
	}
	res, err := s.applyForwarded(r.Context(), cmd)
	if err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(res)
}

func (s *Store) handleJoin(w http.ResponseWriter, r *http.Request) {
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
		err = s.localOnly(func() error { return s.joinLocal(r.Context(), req) })
	} else {
		err = s.join(r.Context(), req)
	}
	writeResult(w, err)
}

func (s *Store) handleRemove(w http.ResponseWriter, r *http.Request) {
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
		err = s.localOnly(func() error { return s.removeLocal(r.Context(), req.ID) })
	} else {
		err = s.Remove(r.Context(), req.ID)
	}
	writeResult(w, err)
}

func (s *Store) handleMeta(w http.ResponseWriter, r *http.Request) {
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
		err = s.localOnly(func() error { return s.setMetaLocal(r.Context(), req.ID, req.APIAddr) })
	} else {
		err = s.setMeta(r.Context(), req.ID, req.APIAddr)
	}
	writeResult(w, err)
}

func (s *Store) handleMembers(w http.ResponseWriter, r *http.Request) {
	ms, err := s.Members(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(ms)
}

// errNoCAYet: this member has not received the cluster CA (it is joining itself).
var errNoCAYet = errors.New("this member has not received the cluster CA yet (is it a member? see `pinnedd members`); retry")

// issuer is the CA this node issues from: the one recorded in the log, else the one it created
// (a bootstrap node before its CA entry commits).
func (s *Store) issuer() (*clustertls.CA, error) {
	switch {
	case s.ident == nil:
		return nil, fmt.Errorf("%w: this cluster runs Raft without TLS (--insecure-cluster); start the joining node with --insecure-cluster too", ErrNoClusterCA)
	case s.cfg.TLS.own():
		return nil, fmt.Errorf("%w: this cluster uses its own PKI; give the joining node --tls-ca, --tls-cert and --tls-key", ErrNoClusterCA)
	}
	if ca := s.fsm.clusterCA(); ca != nil {
		return ca, nil
	}
	// The CA this node created, before the log recorded any: never one the
	// log superseded (a restart replays the log before it knows).
	if _, n := s.fsm.trusted(); s.localCA != nil && n == 0 && !s.existing {
		return s.localCA, nil
	}
	return nil, fmt.Errorf("%w: %w", ErrNoClusterCA, errNoCAYet)
}

// issuerWait is issuer, waiting (up to ctx, at most caWait) for a member that has not yet
// replicated the cluster CA, as a join through a member that is itself still joining waits for
// its leader.
func (s *Store) issuerWait(ctx context.Context) (*clustertls.CA, error) {
	ctx, cancel := context.WithTimeout(ctx, caWait)
	defer cancel()
	for {
		changed := s.changes()
		ca, err := s.issuer()
		if err == nil || !errors.Is(err, errNoCAYet) {
			return ca, err
		}
		t := time.NewTimer(100 * time.Millisecond)
		select {
		case <-changed:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, err
		}
		t.Stop()
	}
}

// caWait bounds how long a CA or certificate request waits for this member to receive the CA.
const caWait = 10 * time.Second

func (s *Store) handleCA(w http.ResponseWriter, r *http.Request) {
	ca, err := s.issuerWait(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	ans := clusterport.CAAnswer{CA: string(ca.CertPEM())}
	for _, token := range s.joinTokens() {
		pin, err := clustertls.Pin(token, ca.CertPEM())
		if err != nil {
			writeError(w, err)
			return
		}
		ans.Pins = append(ans.Pins, pin)
	}
	ans.Pin = ans.Pins[0]
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(ans)
}

// handleCertificate signs a certificate request. Only for an id that is not a current member
// (the leader decides, on its latest configuration), or for the member itself asking over its
// own certificate on the cluster port (a renewal): a token or join proof must never buy a
// certificate in a live member's name, which the cluster port would then take for that member.
// An issue or a refusal (403) is logged at WARN with who asked; a request a member passed on, at
// INFO.
func (s *Store) handleCertificate(w http.ResponseWriter, r *http.Request) {
	var req clusterport.CertRequest
	if !readJSON(w, r, &req) {
		return
	}
	if req.ID == "" || req.CSR == "" {
		writeError(w, fmt.Errorf("%w: certificate needs id and csr (a PEM CERTIFICATE REQUEST)", ErrBadRequest))
		return
	}
	peer := clusterport.NodeFrom(r.Context())
	// A member passing on another's request is not asking for itself.
	renewal := peer != "" && peer == req.ID && !forwarded(r)
	var ans clusterport.CertAnswer
	issue := func(ctx context.Context) (err error) {
		ans, err = s.issueLocal(ctx, req)
		return err
	}
	var err error
	switch {
	case renewal:
		// The cluster port checked the certificate and the membership.
		ans, err = s.sign(r.Context(), req)
	case forwarded(r):
		// A member passed it on to the leader (and logs who asked).
		err = s.localOnly(func() error { return issue(r.Context()) })
	default:
		if _, err = s.issuer(); err == nil || errors.Is(err, errNoCAYet) {
			err = s.onLeader(r.Context(), "certificate", issue,
				func(ctx context.Context, api string) error {
					return s.callJSON(ctx, api, "certificate", req, &ans, true)
				})
		}
	}
	log := s.log.With("member", req.ID, "remote", r.RemoteAddr, "auth", certAuth(r, peer))
	switch {
	case forwarded(r) && !renewal:
		log.Info("answered a certificate request a member forwarded", "err", err)
	case err == nil:
		log.Warn("issued a cluster certificate", "renewal", renewal)
	case errors.Is(err, ErrForbidden):
		log.Warn("refused a cluster certificate", "err", err)
	}
	if err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(ans)
}

// certAuth says how a certificate request was admitted, for the log.
func certAuth(r *http.Request, peer string) string {
	switch {
	case peer != "":
		return "cluster certificate of " + peer
	case r.Header.Get(joinProofHeader) != "":
		return "join proof"
	case r.Header.Get("Authorization") != "":
		return "bearer token"
	}
	return "none"
}

// issueLocal signs req on the leader if req.ID is not a member of the latest configuration.
func (s *Store) issueLocal(ctx context.Context, req clusterport.CertRequest) (clusterport.CertAnswer, error) {
	servers, err := s.configuration(ctx)
	if err != nil {
		return clusterport.CertAnswer{}, err
	}
	for _, srv := range servers {
		if string(srv.ID) == req.ID {
			return clusterport.CertAnswer{}, fmt.Errorf("%w: %q is a current member: a member's certificate is issued only to that member, over its own certificate (a renewal). A node rebuilt without its data dir must first be removed: `pinnedd remove %s`", ErrForbidden, req.ID, req.ID)
		}
	}
	return s.sign(ctx, req)
}

// sign signs req's certificate request with the cluster CA.
func (s *Store) sign(ctx context.Context, req clusterport.CertRequest) (clusterport.CertAnswer, error) {
	ca, err := s.issuerWait(ctx)
	if err != nil {
		return clusterport.CertAnswer{}, err
	}
	cert, err := ca.SignCSR([]byte(req.CSR), req.ID)
	if err != nil {
		return clusterport.CertAnswer{}, fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	return clusterport.CertAnswer{Cert: string(cert), CA: string(ca.CertPEM())}, nil
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

func writeError(w http.ResponseWriter, err error) {
	status, code := http.StatusInternalServerError, codeInternal
	switch {
	case errors.Is(err, ErrOutcomeUnknown):
		status, code = http.StatusServiceUnavailable, codeOutcomeUnknown
	case errors.Is(err, ErrClosed):
		status, code = http.StatusServiceUnavailable, codeClosed
	case errors.Is(err, ErrNotLeader):
		status, code = http.StatusServiceUnavailable, codeNotLeader
	case errors.Is(err, ErrNoLeader):
		status, code = http.StatusServiceUnavailable, codeNoLeader
	case errors.Is(err, ErrBadRequest):
		status, code = http.StatusBadRequest, codeBadRequest
	case errors.Is(err, ErrUnauthorized):
		status, code = http.StatusUnauthorized, codeUnauthorized
	case errors.Is(err, ErrForbidden):
		status, code = http.StatusForbidden, codeForbidden
	case errors.Is(err, ErrLastVoter):
		status, code = http.StatusConflict, codeLastVoter
	case errors.Is(err, ErrUnknownMember):
		status, code = http.StatusNotFound, codeUnknownMember
	case errors.Is(err, ErrNoClusterCA):
		status, code = http.StatusConflict, codeNoClusterCA
	case errors.Is(err, ErrStaleJoin):
		status, code = http.StatusConflict, codeStaleJoin
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

// call sends one RPC to the node at baseURL. forwarded marks it as sent by a raftstore node to
// the leader.
func (s *Store) call(ctx context.Context, baseURL, op string, body []byte, forwarded bool) ([]byte, error) {
	client, token := s.clientFor()
	return doRPC(ctx, client, baseURL, bearer(token), http.MethodPost, op, "application/octet-stream", body, forwarded)
}

func (s *Store) callJSON(ctx context.Context, baseURL, op string, in, out any, forwarded bool) error {
	client, token := s.clientFor()
	return callJSON(ctx, client, baseURL, bearer(token), op, in, out, forwarded)
}

// rpcAuth is how an RPC shows it may be made: the deployment token as a bearer token, or,
// with prove, a join proof made with it (clustertls.JoinProof), which keeps the token on this
// node. Zero: no authorization.
type rpcAuth struct {
	token string
	prove bool
}

func bearer(token string) rpcAuth { return rpcAuth{token: token} }

// joinProofHeader carries a join proof (certificate and join requests of a joining node).
const joinProofHeader = "X-Pinnedd-Join-Proof"

func (a rpcAuth) set(req *http.Request, path string, body []byte) error {
	switch {
	case a.token == "":
	case a.prove:
		proof, err := clustertls.JoinProof(a.token, req.Method, path, body, time.Now())
		if err != nil {
			return err
		}
		req.Header.Set(joinProofHeader, proof)
	default:
		req.Header.Set("Authorization", "Bearer "+a.token)
	}
	return nil
}

func callJSON(ctx context.Context, client *http.Client, baseURL string, auth rpcAuth, op string, in, out any, forwarded bool) error {
	method, ctype := http.MethodGet, ""
	var body []byte
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("raftstore: encoding %s request: %w", op, err)
		}
		method, ctype, body = http.MethodPost, "application/json", b
	}
	res, err := doRPC(ctx, client, baseURL, auth, method, op, ctype, body, forwarded)
	if err != nil {
		return err
	}
	if out != nil {
		if err := json.Unmarshal(res, out); err != nil {
			return fmt.Errorf("raftstore: decoding %s response from %s: %w", op, baseURL, err)
		}
	}
	return nil
}

func doRPC(ctx context.Context, client *http.Client, baseURL string, auth rpcAuth, method, op, ctype string, body []byte, forwarded bool) ([]byte, error) {
	if client == nil {
		client = http.DefaultClient
	}
	url := strings.TrimRight(baseURL, "/") + HandlerPrefix + op
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrBadRequest, op, err)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	if err := auth.set(req, HandlerPrefix+op, body); err != nil {
		return nil, fmt.Errorf("raftstore: %s: %w", op, err)
	}
	if forwarded {
		req.Header.Set(forwardedHeader, "1")
	}
	resp, err := client.Do(req)
	if err != nil {
		if httpx.NotSent(err) {
			// Never reached the node (no connection, no handshake): nothing was started there.
			return nil, fmt.Errorf("raftstore: %s via %s: %w: %w", op, baseURL, ErrNoLeader, err)
		}
		if cause := context.Cause(ctx); errors.Is(cause, ErrLeaderChanged) {
			err = fmt.Errorf("%w: %w", cause, err)
		}
		return nil, fmt.Errorf("raftstore: %s via %s: %w: %w", op, baseURL, ErrOutcomeUnknown, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("raftstore: %s via %s: reading response: %w: %w", op, baseURL, ErrOutcomeUnknown, err)
	}
	if resp.StatusCode/100 == 2 {
		return data, nil
	}
	return nil, remoteError(op, baseURL, resp.StatusCode, data)
}

// RemoteError is a node's non-2xx answer to an RPC: its status and message, and the sentinel
// its code maps to (errors.Is matches it), so a caller can show the node's own words.
type RemoteError struct {
	Op, URL string
	Status  int
	// Message is the node's {"error"} text, or the raw body when it sent no JSON error.
	Message  string
	sentinel error
}

func (e *RemoteError) Error() string {
	if e.sentinel != nil {
		return fmt.Sprintf("raftstore: %s via %s: %v (remote: %s)", e.Op, e.URL, e.sentinel, e.Message)
	}
	return fmt.Sprintf("raftstore: %s via %s: HTTP %d: %s", e.Op, e.URL, e.Status, e.Message)
}

func (e *RemoteError) Unwrap() error { return e.sentinel }

func remoteError(op, baseURL string, status int, data []byte) *RemoteError {
	e := &RemoteError{Op: op, URL: baseURL, Status: status, Message: string(bytes.TrimSpace(data))}
	var eb errorBody
	if json.Unmarshal(data, &eb) != nil || eb.Code == "" {
		if eb.Error != "" {
			e.Message = eb.Error
		}
		return e
	}
	e.Message = eb.Error
	switch eb.Code {
	case codeNotLeader, codeClosed:
		e.sentinel = ErrNotLeader // the remote started nothing
	case codeNoLeader:
		e.sentinel = ErrNoLeader
	case codeOutcomeUnknown:
		e.sentinel = ErrOutcomeUnknown
	case codeBadRequest:
		e.sentinel = ErrBadRequest
	case codeUnauthorized:
		e.sentinel = ErrUnauthorized
	case codeForbidden:
		e.sentinel = ErrForbidden
	case codeLastVoter:
		e.sentinel = ErrLastVoter
	case codeUnknownMember:
		e.sentinel = ErrUnknownMember
	case codeNoClusterCA:
		e.sentinel = ErrNoClusterCA
	case codeStaleJoin:
		e.sentinel = &staleJoinError{current: eb.Fence}
	}
	return e
}

// JoinVia asks the member at memberURL (its HTTP base URL, any member: a follower forwards to
// the leader) to add nodeID at raftAddr with API URL apiAddr. token, if not empty, makes the
// join proof (clustertls.JoinProof). Joining is idempotent, so a node restarted with --join may
// send it again. After a removal the leader refuses the first attempt as stale and names the
// membership fence, and JoinVia joins again with it (see Store.joinLocal).
func JoinVia(ctx context.Context, client *http.Client, memberURL, token, nodeID, raftAddr, apiAddr string) error {
	if nodeID == "" || raftAddr == "" {
		return fmt.Errorf("%w: join needs a node id and a raft address", ErrBadRequest)
	}
	return joinFenced(0, func(fence uint64) error {
		req := joinRequest{ID: nodeID, RaftAddr: raftAddr, APIAddr: apiAddr, Fence: fence}
		return callJSON(ctx, client, memberURL, rpcAuth{token: token, prove: true}, "join", req, nil, false)
	})
}

// RemoveVia asks the member at memberURL to remove nodeID from the group (forwarded to the
// leader if needed).
func RemoveVia(ctx context.Context, client *http.Client, memberURL, token, nodeID string) error {
	if nodeID == "" {
		return fmt.Errorf("%w: remove needs a node id", ErrBadRequest)
	}
	return callJSON(ctx, client, memberURL, bearer(token), "remove", removeRequest{ID: nodeID}, nil, false)
}

// MembersVia lists the group's members as the node at nodeURL sees them.
func MembersVia(ctx context.Context, client *http.Client, nodeURL, token string) ([]Member, error) {
	var ms []Member
	if err := callJSON(ctx, client, nodeURL, bearer(token), "members", nil, &ms, false); err != nil {
		return nil, err
	}
	return ms, nil
}
