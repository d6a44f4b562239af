package raftstore

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/pinnedd/pinnedd/clusterport"
	"github.com/pinnedd/pinnedd/internal/clustertls"
	"github.com/pinnedd/pinnedd/internal/httpx"
)

// The client side of raftstore's RPCs: a call to a member's /_raft/ route (bearer token, join
// proof, or the cluster port's certificate), its errors, and the operator's calls (JoinVia,
// RemoveVia, MembersVia, RotateCAVia, TLSVia).

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
func TLSVia(ctx context.Context, client *http.Client, nodeURL, token string) (clusterport.TLSState, error) {
	var st clusterport.TLSState
	err := callJSON(ctx, client, nodeURL, bearer(token), "tls", nil, &st, false)
	return st, err
}

// rpcAuth is how an RPC shows it may be made: the deployment token as a bearer token, or,
// with prove, a join proof made with it (clustertls.JoinProof), which keeps the token on this
// node. Zero: no authorization.
type rpcAuth struct {
	token string
	prove bool
}

func bearer(token string) rpcAuth { return rpcAuth{token: token} }

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

// callJSON sends in as JSON (nil: a GET) and decodes the answer into out (nil: none).
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
	if eb.Code == codeStaleJoin {
		e.sentinel = &staleJoinError{current: eb.Fence}
		return e
	}
	for _, we := range wireErrors {
		if we.code == eb.Code {
			e.sentinel = cmp.Or(we.back, we.err)
			break
		}
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
