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
	"time"

	"github.com/pinnedd/pinnedd/clusterport"
	"github.com/pinnedd/pinnedd/internal/clustertls"
)

// The member's side of the cluster's own CA: the RPCs that rotate it, report it, hand a
// joining node the CA and sign its certificate request (with the join proof checked), and the
// issuing CA the leader signs with.

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
