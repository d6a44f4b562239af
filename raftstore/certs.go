package raftstore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"

	"github.com/pinnedd/pinnedd/clusterport"
)

// The RPCs of the cluster's own CA (clusterport.Authority does the work): rotate it, report
// it, hand a joining node the CA and sign its certificate request (with the join proof
// checked); and the joining node's side.

func (rs *rpcServer) handleRotate(w http.ResponseWriter, r *http.Request) {
	var req struct{}
	if !readJSON(w, r, &req) {
		return
	}
	var fp string
	var err error
	if forwarded(r) {
		err = rs.localOnly(func() error {
			var lerr error
			fp, lerr = rs.s.ca.Rotate(r.Context())
			return lerr
		})
	} else {
		fp, err = rs.s.RotateCA(r.Context())
	}
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, map[string]string{"ca": fp})
}

// RotateCA makes a new cluster CA and records it, on the leader (a follower forwards): it
// issues from then on, and the CAs before it are retired once every member holds a
// certificate from it. It answers the new CA's fingerprint.
func (s *Store) RotateCA(ctx context.Context) (string, error) {
	var fp string
	err := s.fwd.onLeader(ctx, "tls/rotate",
		func(ctx context.Context) (err error) {
			fp, err = s.ca.Rotate(ctx)
			return err
		},
		func(ctx context.Context, api string) error {
			var ans struct {
				CA string `json:"ca"`
			}
			err := s.fwd.callJSON(ctx, api, "tls/rotate", struct{}{}, &ans, true)
			fp = ans.CA
			return err
		})
	return fp, err
}

func (rs *rpcServer) handleTLS(w http.ResponseWriter, _ *http.Request) { writeJSON(w, rs.s.ca.State()) }

func (rs *rpcServer) handleCA(w http.ResponseWriter, r *http.Request) {
	ans, err := rs.s.ca.CA(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, ans)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// joinTokens are the tokens a join proof may be made with and the CA is pinned for: Token
// first, then the other JoinTokens.
func joinTokens(cfg Config) []string {
	out := []string{cfg.Token}
	for _, t := range cfg.JoinTokens {
		if t != "" && !slices.Contains(out, t) {
			out = append(out, t)
		}
	}
	return out
}

// checkJoinProof admits a join or certificate request by its join proof, made with one of
// this node's join tokens over the request's method, path and body (read here, and put back
// for the handler).
func (rs *rpcServer) checkJoinProof(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodPost || (r.URL.Path != HandlerPrefix+"join" && r.URL.Path != HandlerPrefix+"certificate") {
		return fmt.Errorf("%w: a join proof admits only a join or certificate request", ErrUnauthorized)
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxJSONBody))
	if err != nil {
		return fmt.Errorf("%w: reading the request: %w", ErrBadRequest, err)
	}
	if err := rs.s.ca.CheckJoinProof(r.Header.Get(joinProofHeader), r.Method, r.URL.Path, body); err != nil {
		return fmt.Errorf("%w: %w", ErrUnauthorized, err)
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	return nil
}

// handleCertificate signs a certificate request. Only for an id that is not a current member
// (the leader decides, on its latest configuration), or for the member itself asking over its
// own certificate on the cluster port (a renewal): a token or join proof must never buy a
// certificate in a live member's name, which the cluster port would then take for that member.
// An issue or a refusal (403) is logged at WARN with who asked; a request a member passed on, at
// INFO.
func (rs *rpcServer) handleCertificate(w http.ResponseWriter, r *http.Request) {
	var req clusterport.CertRequest
	if !readJSON(w, r, &req) {
		return
	}
	peer := clusterport.NodeFrom(r.Context())
	// A member passing on another's request is not asking for itself.
	renewal := peer != "" && peer == req.ID && !forwarded(r)
	var ans clusterport.CertAnswer
	issue := func(ctx context.Context) (err error) {
		ans, err = rs.s.ca.Issue(ctx, req)
		return err
	}
	var err error
	switch {
	case renewal:
		// The cluster port checked the certificate and the membership.
		ans, err = rs.s.ca.Sign(r.Context(), req)
	case forwarded(r):
		// A member passed it on to the leader (and logs who asked).
		err = rs.localOnly(func() error { return issue(r.Context()) })
	default:
		if _, err = rs.s.ca.Issuer(); err == nil || errors.Is(err, clusterport.ErrNoCAYet) {
			err = rs.s.fwd.onLeader(r.Context(), "certificate", issue,
				func(ctx context.Context, api string) error {
					return rs.s.fwd.callJSON(ctx, api, "certificate", req, &ans, true)
				})
		}
	}
	log := rs.s.log.With("member", req.ID, "remote", r.RemoteAddr, "auth", certAuth(r, peer))
	switch {
	case forwarded(r) && !renewal:
		log.Info("answered a certificate request a member forwarded", "err", err)
	case err == nil:
		log.Warn("issued a cluster certificate", "renewal", renewal)
	case errors.Is(err, ErrForbidden), errors.Is(err, clusterport.ErrRefused):
		log.Warn("refused a cluster certificate", "err", err)
	}
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, ans)
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

// JoinCluster asks the member at memberURL (any member) to add this node, as JoinVia does, and
// first, when the transport runs the cluster's own CA and this node has no certificate yet,
// gets one (clusterport.FetchIdentity): it fetches the CA, checks its pin against Config.Token
// (so a CA substituted by someone in between is refused before the token is sent), sends a
// certificate request for a key it made, checks the certificate it gets, and stores all of it
// in <DataDir>/tls.
func (s *Store) JoinCluster(ctx context.Context, client *http.Client, memberURL string) error {
	if s.ca.NeedsCertificate() {
		if s.cfg.Token == "" {
			return fmt.Errorf("%w: joining with the cluster's own CA needs the deployment token (it pins the CA)", ErrInvalidConfig)
		}
		m := joinMember{client: client, url: memberURL, token: s.cfg.Token}
		if err := s.ca.FetchCertificate(ctx, m); err != nil {
			return fmt.Errorf("raftstore: %w", err)
		}
	}
	if err := JoinVia(ctx, client, memberURL, s.cfg.Token, s.cfg.NodeID, s.advertise, s.cfg.APIAddr); err != nil {
		return err
	}
	// A member again: a leave recorded before no longer holds.
	if err := os.Remove(s.members.leftPath()); err != nil && !errors.Is(err, os.ErrNotExist) {
		s.log.Warn("could not clear the record of an earlier leave", "err", err)
	}
	return nil
}

// joinMember is a member's side of the certificate exchange, over its
// public port: the token proves itself without leaving this node
// (JoinProof), as this request and the join may go in clear.
type joinMember struct {
	client     *http.Client
	url, token string
}

func (m joinMember) CA(ctx context.Context) (clusterport.CAAnswer, error) {
	var ca clusterport.CAAnswer
	err := callJSON(ctx, m.client, m.url, rpcAuth{}, "ca", nil, &ca, false)
	return ca, err
}

func (m joinMember) Certificate(ctx context.Context, req clusterport.CertRequest) (clusterport.CertAnswer, error) {
	var ans clusterport.CertAnswer
	err := callJSON(ctx, m.client, m.url, rpcAuth{token: m.token, prove: true}, "certificate", req, &ans, false)
	return ans, err
}

func (m joinMember) String() string { return m.url }

// CA is this node's part in the cluster's own CA: how the cluster port is secured, the CAs
// recorded, whether a key awaits sealing.
func (s *Store) CA() *clusterport.Authority { return s.ca }
