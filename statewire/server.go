// Package statewire owns the server side of the Statewire protocol for
// pinnedd host authors (see PROTOCOL.md): an instance's JSON state document
// streamed to any number of clients as a snapshot and then ops, client
// commands durably admitted into per-client trays and deduplicated by
// sequence number, and a run manager that executes admitted commands with
// the SDK's redelivery semantics (Run.Applied, Resume after a crash, a
// cancel command to stop).
//
// It is built only on plugins/sdk and must never reach around it: all
// durability goes through trays and Instance.Durable.
//
//	sdk.Host{
//		New: func(inst *sdk.Instance) (http.Handler, error) {
//			return statewire.New(inst, statewire.Config{Initial: ..., Commands: ..., Run: ...})
//		},
//		Trays: statewire.Trays(),
//	}
package statewire

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"strconv"
	"sync"
	"time"

	"github.com/pinnedd/pinnedd/plugins/sdk"
	"github.com/pinnedd/pinnedd/statewire/wire"
)

// CommandTray is the tray namespace of the client command pools: one tray
// per client id, whose work items are that client's admitted commands.
const CommandTray = "client_commands"

// CancelCommand is the built-in command that stops the sending client's
// run: the one in progress or queued for a batch of its own commands.
const CancelCommand = "cancel"

// MaxSeq is the largest sequence number: 2^53-1, the largest integer a
// JSON number carries exactly in every language (JavaScript's
// Number.MAX_SAFE_INTEGER).
const MaxSeq = 1<<53 - 1

// Defaults.
const (
	DefaultKeepAlive    = 15 * time.Second
	DefaultStreamBuffer = 1024
	DefaultMaxBody      = 256 << 10
	MaxFrames           = 64 // frames in one POST /frames
	// DefaultDedupWindow is how long an instance remembers a client's
	// high-water mark after its last admission (Config.DedupWindow).
	DefaultDedupWindow = 7 * 24 * time.Hour
)

// admittedField is the client tray's field holding the highest sequence
// number admitted and run; pending items hold the ones above it.
// admittedAtField holds when (Unix ms) the client last had a frame
// admitted: the start of its dedup window.
const (
	admittedField   = "admitted"
	admittedAtField = "admittedAt"
)

var clientIDPattern = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,64}$`)

// CommandSpec describes one client command type.
type CommandSpec struct {
	// Validate checks a frame (the whole JSON object) before admission; an
	// error answers 400 and admits nothing.
	Validate func(frame json.RawMessage) error
	// Run delivers the command to Config.Run. Commands without it are
	// admitted and settle without effect beyond Validate (and, for
	// cancel, stopping the run in progress).
	Run bool
}

// RunFunc executes a batch of admitted run commands. Returning nil settles
// the batch; an error (or the instance stopping) leaves it to be
// redelivered on the next activation.
type RunFunc func(ctx context.Context, rc *RunContext) error

// Config configures a Server.
type Config struct {
	// Initial is the document before anything happened; any JSON-encodable
	// value whose top level is an object.
	Initial any
	// Commands by type; "cancel" is built in.
	Commands map[string]CommandSpec
	// Run executes run commands, one batch at a time per instance.
	Run RunFunc
	// KeepAlive is the interval of keepalive frames on an idle stream.
	KeepAlive time.Duration
	// StreamBuffer bounds the frames queued for one stream; a stream that
	// falls further behind ends with fin "lagging" and reconnects.
	StreamBuffer int
	// MaxBody bounds a POST /frames body, in bytes.
	MaxBody int64
	// Admit, if set, sees the frames of a request that are about to be
	// admitted (not duplicates), in order, before anything is stored; an
	// error refuses the whole request with 409 and its message, and admits
	// nothing. It is for rules that depend on the instance rather than on
	// the frame alone (Validate): the chat refuses a message id already
	// taken. Calls are serialized per instance. A request refused later
	// (the store failed) was seen by Admit all the same, and its client
	// resends the same frames.
	Admit func(cmds []Command) error
	// DedupWindow is how long the instance keeps a client's dedup mark
	// after the client's last admitted frame, once none of its commands is
	// pending (DefaultDedupWindow when 0). Then the client's tray is
	// deleted, so client ids that come and go leave no state for ever; a
	// client that comes back after it starts again from seq 1 (see
	// PROTOCOL.md, "Dedup window").
	DedupWindow time.Duration
}

// Server serves one instance's Statewire routes:
//
//	POST /stream  snapshot, then ops (NDJSON), until fin
//	POST /frames  client commands, acknowledged once durable
//	GET  /state   the current snapshot as one JSON object
type Server struct {
	inst *sdk.Instance
	cfg  Config
	doc  *Doc
	log  *slog.Logger
	mux  *http.ServeMux

	clientsMu sync.Mutex
	clients   map[string]*clientPool

	admitMu sync.Mutex // serializes Config.Admit

	runs runManager
}

// clientPool is the admission state of one client: its lock serializes
// the client's POST /frames, high is the highest admitted seq (-1: not
// read from the tray yet). unsure is the last seq of an append whose wait
// ended first (the client left): the SDK keeps such a write queued and may
// still store it, so nothing is appended again until a Durable says it
// was. (A failed commit resets the instance, and its pools with it.)
type clientPool struct {
	mu     sync.Mutex
	high   int64
	unsure int64
	gone   bool // dropped from Server.clients: lock the client's current pool instead
}

// New builds the server for inst and registers it so the command tray's
// handler (Trays) finds it.
func New(inst *sdk.Instance, cfg Config) (*Server, error) {
	if cfg.KeepAlive <= 0 {
		cfg.KeepAlive = DefaultKeepAlive
	}
	if cfg.KeepAlive > DefaultKeepAlive {
		// Clients give up on a stream silent for three default periods.
		return nil, fmt.Errorf("statewire: KeepAlive %v over %v: clients would take the stream for dead", cfg.KeepAlive, DefaultKeepAlive)
	}
	if cfg.StreamBuffer <= 0 {
		cfg.StreamBuffer = DefaultStreamBuffer
	}
	if cfg.MaxBody <= 0 {
		cfg.MaxBody = DefaultMaxBody
	}
	if cfg.DedupWindow <= 0 {
		cfg.DedupWindow = DefaultDedupWindow
	}
	for typ, spec := range cfg.Commands {
		if typ == CancelCommand {
			return nil, fmt.Errorf("statewire: %q is built in", CancelCommand)
		}
		if spec.Run && cfg.Run == nil {
			return nil, fmt.Errorf("statewire: command %q runs but Config.Run is nil", typ)
		}
	}
	doc, err := newDoc(cfg.Initial, cfg.StreamBuffer)
	if err != nil {
		return nil, err
	}
	if _, ok := doc.root.(map[string]any); !ok {
		return nil, errors.New("statewire: the initial document must be a JSON object")
	}
	s := &Server{inst: inst, cfg: cfg, doc: doc, log: inst.Logger(), clients: map[string]*clientPool{}}
	s.runs.init()
	s.mux = http.NewServeMux()
	s.mux.HandleFunc("POST /stream", s.serveStream)
	s.mux.HandleFunc("POST /frames", s.serveFrames)
	s.mux.HandleFunc("GET /state", s.serveState)
	inst.Attach(serverKey{}, s)
	go s.forgetIdleClients()
	return s, nil
}

// forgetIdleClients deletes, now and then while the instance lives, the
// trays of clients whose dedup window has passed: a long-lived instance
// forgets the clients that left, and one activated again forgets those
// that left while it slept.
func (s *Server) forgetIdleClients() {
	every := min(s.cfg.DedupWindow/2, time.Hour)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		s.forgetClients(time.Now())
		select {
		case <-s.inst.Context().Done():
			return
		case <-t.C:
		}
	}
}

// forgetClients deletes the tray of each client with nothing pending whose
// last admission is older than the dedup window. It holds the client's
// pool lock, so no admission of that client runs meanwhile, and the next
// one reads the (now forgotten) mark from the tray again. A tray without a
// time (written before there was one) gets now: its window starts here.
func (s *Server) forgetClients(now time.Time) {
	for _, k := range s.inst.Trays(CommandTray) {
		p := s.lockPool(k.ID)
		tray := s.inst.Tray(CommandTray, k.ID)
		var at int64
		switch ok, _ := tray.Get(admittedAtField, &at); {
		case p.unsure > 0 || len(tray.Items()) > 0:
		case !ok:
			_ = tray.Set(admittedAtField, now.UnixMilli())
		case now.Sub(time.UnixMilli(at)) >= s.cfg.DedupWindow:
			for _, name := range tray.Fields() {
				tray.Delete(name)
			}
			p.high = -1
			s.runs.forget(k.ID)
		}
		p.mu.Unlock()
		s.dropPool(k.ID, p)
	}
}

// dropPool forgets p, the in-memory admission state of clientID, unless it
// is in use: its mark is in the tray (or forgotten with it).
func (s *Server) dropPool(clientID string, p *clientPool) {
	s.clientsMu.Lock()
	defer s.clientsMu.Unlock()
	if p.mu.TryLock() {
		if s.clients[clientID] == p && p.unsure == 0 {
			delete(s.clients, clientID)
			p.gone = true
		}
		p.mu.Unlock()
	}
}

// Doc is the instance's state document.
func (s *Server) Doc() *Doc { return s.doc }

// Instance is the instance the server belongs to.
func (s *Server) Instance() *sdk.Instance { return s.inst }

// ServeHTTP serves the Statewire routes.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSONError(w, code, map[string]any{"error": msg})
}

// writeJSONError writes an error body; a 503 always says when to retry.
func writeJSONError(w http.ResponseWriter, code int, body map[string]any) {
	w.Header().Set("Content-Type", "application/json")
	if code == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(body)
}

func (s *Server) serveState(w http.ResponseWriter, _ *http.Request) {
	state, version, err := s.doc.Snapshot()
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(wire.Frame{Type: wire.TypeSnapshot, Epoch: s.doc.epoch, Version: version, State: state})
}

// serveStream answers with the snapshot and then every update, flushed
// frame by frame, until the client leaves, the instance stops or the
// stream falls behind.
func (s *Server) serveStream(w http.ResponseWriter, r *http.Request) {
	// The body is optional ({"clientId": ...}, for logs); read whole before
	// answering so a client is not answered mid-upload, and held to the
	// same rule as frames: an unknown field is refused, not ignored.
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 4096))
	if err != nil {
		writeError(w, http.StatusBadRequest, "stream body: at most 4096 bytes, {\"clientId\": \"...\"} or empty")
		return
	}
	if len(bytes.TrimSpace(body)) > 0 {
		var req struct {
			ClientID string `json:"clientId"`
		}
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		err := dec.Decode(&req)
		if err == nil && dec.More() {
			err = errors.New("trailing data after the JSON object")
		}
		if err != nil {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("stream body must be empty or {\"clientId\": \"...\"}: %v", err))
			return
		}
		if req.ClientID != "" && !clientIDPattern.MatchString(req.ClientID) {
			writeError(w, http.StatusBadRequest, "clientId must be 1-64 characters of A-Z a-z 0-9 . _ : -")
			return
		}
	}
	snap, sub, err := s.doc.subscribe()
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	defer s.doc.unsubscribe(sub)
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	if _, err := w.Write(snap); err != nil {
		return
	}
	if rc.Flush() != nil {
		return
	}
	keep := time.NewTicker(s.cfg.KeepAlive)
	defer keep.Stop()
	fin := func(code string, reconnect bool) {
		b, _ := json.Marshal(wire.Frame{Type: wire.TypeFin, Code: code, Reconnect: &reconnect})
		_, _ = w.Write(append(b, '\n'))
		_ = rc.Flush()
	}
	for {
		select {
		case b := <-sub.frames:
			_, err := w.Write(b)
			// Coalesce whatever else is queued into one flush.
			for more := true; more && err == nil; {
				select {
				case b := <-sub.frames:
					_, err = w.Write(b)
				default:
					more = false
				}
			}
			if err != nil || rc.Flush() != nil {
				return
			}
			keep.Reset(s.cfg.KeepAlive)
		case <-keep.C:
			if _, err := w.Write([]byte(`{"type":"keepalive"}` + "\n")); err != nil || rc.Flush() != nil {
				return
			}
		case <-sub.lagged:
			s.log.Warn("statewire stream fell behind; ended", "buffer", s.cfg.StreamBuffer)
			fin(wire.FinLagging, true)
			return
		case <-s.inst.Context().Done():
			fin(wire.FinEvicted, true)
			return
		case <-r.Context().Done():
			return
		}
	}
}

// framesRequest is the body of POST /frames.
type framesRequest struct {
	ClientID string            `json:"clientId"`
	Frames   []json.RawMessage `json:"frames"`
}

// frameHead is what admission reads of each frame.
type frameHead struct {
	Seq  json.RawMessage `json:"seq"`
	Type *string         `json:"type"`
}

// storedCommand is the payload of a command tray item.
type storedCommand struct {
	Namespace string          `json:"ns"`
	ID        string          `json:"id"`
	ClientID  string          `json:"clientId"`
	Seq       int64           `json:"seq"`
	Type      string          `json:"type"`
	Frame     json.RawMessage `json:"frame"`
}

// FramesResponse is the answer to POST /frames.
type FramesResponse struct {
	// Acked is the highest sequence number of this client now durably
	// admitted: every frame up to it may be forgotten by the client.
	Acked int64 `json:"acked"`
	// Admitted counts the frames admitted by this request; Duplicates the
	// ones already admitted before (acknowledged again, not re-applied).
	Admitted   int `json:"admitted"`
	Duplicates int `json:"duplicates"`
}

// serveFrames validates the whole request first (any bad frame: 4xx and
// nothing admitted), then appends the new frames to the client's tray and
// answers only once they are durable.
func (s *Server) serveFrames(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("body over %d bytes", s.cfg.MaxBody))
			return
		}
		writeError(w, http.StatusBadRequest, "read body: "+err.Error())
		return
	}
	req, cmds, err := s.parseFrames(body)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	resp, err := s.admit(r.Context(), req.ClientID, cmds)
	if err == nil || errors.Is(err, sdk.ErrStateUnavailable) || errors.Is(err, sdk.ErrFenced) {
		// An acknowledgement reveals only seqs already durable (the mark
		// moves once their append is), and a refusal for the store's sake
		// reveals nothing: neither waits at the output gate for the
		// bookkeeping writes queued since (the admitted mark, a run's).
		sdk.AllowUnconfirmed(r)
	}
	var gap *SeqGapError
	if errors.As(err, &gap) {
		writeJSONError(w, http.StatusConflict, map[string]any{"error": err.Error(), "expected": gap.Expected})
		return
	}
	if errors.Is(err, errRefused) {
		writeError(w, http.StatusConflict, err.Error())
		return
	}
	if errors.Is(err, sdk.ErrInvalidWrite) {
		// A frame the store can never take (over statestore.MaxValueLen
		// once stored): the client must change it, not retry it.
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("frames not admitted: %v", err))
		return
	}
	if err != nil {
		s.log.Warn("statewire frames not admitted", "client", req.ClientID, "err", err)
		writeError(w, http.StatusServiceUnavailable, "not admitted: "+err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(resp)
}

func (s *Server) parseFrames(body []byte) (framesRequest, []storedCommand, error) {
	var req framesRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return req, nil, fmt.Errorf("malformed body: %w", err)
	}
	if dec.More() {
		return req, nil, errors.New("malformed body: trailing data after the JSON object")
	}
	if req.ClientID == "" {
		return req, nil, errors.New("missing clientId")
	}
	if !clientIDPattern.MatchString(req.ClientID) {
		return req, nil, errors.New("clientId must be 1-64 characters of A-Z a-z 0-9 . _ : -")
	}
	if len(req.Frames) == 0 {
		return req, nil, errors.New("no frames")
	}
	if len(req.Frames) > MaxFrames {
		return req, nil, fmt.Errorf("%d frames, at most %d per request", len(req.Frames), MaxFrames)
	}
	cmds := make([]storedCommand, 0, len(req.Frames))
	prev := int64(0)
	for i, raw := range req.Frames {
		var head frameHead
		if err := json.Unmarshal(raw, &head); err != nil {
			return req, nil, fmt.Errorf("frame %d: %w", i, err)
		}
		// A bare JSON integer: not "1", not 1.0, not 1e3.
		seq, err := strconv.ParseInt(string(head.Seq), 10, 64)
		if err != nil || seq <= 0 || seq > MaxSeq {
			return req, nil, fmt.Errorf("frame %d: seq must be an integer from 1 to %d", i, int64(MaxSeq))
		}
		if seq <= prev {
			return req, nil, fmt.Errorf("frame %d: seq %d after %d; seqs must increase", i, seq, prev)
		}
		prev = seq
		if head.Type == nil || *head.Type == "" {
			return req, nil, fmt.Errorf("frame %d: missing type", i)
		}
		typ := *head.Type
		if typ != CancelCommand {
			spec, ok := s.cfg.Commands[typ]
			if !ok {
				return req, nil, fmt.Errorf("frame %d: unknown command type %q", i, typ)
			}
			if spec.Validate != nil {
				if err := spec.Validate(raw); err != nil {
					return req, nil, fmt.Errorf("frame %d (%s): %w", i, typ, err)
				}
			}
		}
		cmds = append(cmds, storedCommand{
			Namespace: s.inst.Namespace(), ID: s.inst.ID(), ClientID: req.ClientID,
			Seq: seq, Type: typ, Frame: raw,
		})
	}
	return req, cmds, nil
}

// lockPool returns clientID's pool, locked: the one in Server.clients, so
// that all admissions of a client queue on one lock.
func (s *Server) lockPool(clientID string) *clientPool {
	for {
		p := s.pool(clientID)
		p.mu.Lock()
		if !p.gone {
			return p
		}
		p.mu.Unlock()
	}
}

func (s *Server) pool(clientID string) *clientPool {
	s.clientsMu.Lock()
	defer s.clientsMu.Unlock()
	p := s.clients[clientID]
	if p == nil {
		p = &clientPool{high: -1}
		s.clients[clientID] = p
	}
	return p
}

// SeqGapError refuses a frame whose seq skips over one never admitted:
// acknowledging it would move the high-water mark past the missing seq,
// whose frame would then be taken for a duplicate and dropped.
type SeqGapError struct {
	Frame    int   // index in the request
	Seq      int64 // what the frame carried
	Expected int64 // the next seq the client must send
}

func (e *SeqGapError) Error() string {
	return fmt.Sprintf("frame %d: seq %d skips %d, the next seq this client must send; nothing admitted (send the frames in order)",
		e.Frame, e.Seq, e.Expected)
}

// errRefused marks a refusal by Config.Admit.
var errRefused = errors.New("refused")

// admit appends the commands above the client's high-water mark to its
// tray, durably, and only then acts on admitted cancels. The new commands
// must continue the mark without a gap.
func (s *Server) admit(ctx context.Context, clientID string, cmds []storedCommand) (FramesResponse, error) {
	p := s.lockPool(clientID)
	defer p.mu.Unlock()
	tray := s.inst.Tray(CommandTray, clientID)
	if p.high < 0 {
		p.high = highWater(tray)
	}
	if p.unsure > 0 {
		// Appending the resent frames again would store them twice once
		// the earlier write lands: wait for it instead.
		if err := s.inst.Durable(ctx); err != nil {
			return FramesResponse{}, fmt.Errorf("an earlier admission is still being stored: %w", err)
		}
		p.high = max(p.high, p.unsure)
		p.unsure = 0
	}
	var fresh []any
	var freshCmds []Command
	var resp FramesResponse
	var cancel int64 // the last cancel's seq
	next := p.high + 1
	for i, c := range cmds {
		if c.Seq <= p.high {
			resp.Duplicates++
			continue
		}
		if c.Seq != next {
			return FramesResponse{Acked: p.high}, &SeqGapError{Frame: i, Seq: c.Seq, Expected: next}
		}
		next++
		fresh = append(fresh, c)
		freshCmds = append(freshCmds, c.command())
		if c.Type == CancelCommand {
			cancel = c.Seq
		}
	}
	if len(fresh) > 0 && s.cfg.Admit != nil {
		s.admitMu.Lock()
		err := s.cfg.Admit(freshCmds)
		s.admitMu.Unlock()
		if err != nil {
			return FramesResponse{Acked: p.high}, fmt.Errorf("%w: %w", errRefused, err)
		}
	}
	if len(fresh) > 0 {
		if _, err := tray.Append(ctx, fresh...); err != nil {
			if !errors.Is(err, sdk.ErrInvalidWrite) && !errors.Is(err, sdk.ErrFenced) {
				p.unsure = cmds[len(cmds)-1].Seq // queued, outcome unknown
			}
			return resp, fmt.Errorf("append to %s:%s: %w", CommandTray, clientID, err)
		}
		p.high = cmds[len(cmds)-1].Seq
		// The items carry their seqs until they settle; the field keeps the
		// mark after that. Queued behind the items, so never ahead of them.
		// Recording it can fail (a commit failed since the items', and the
		// instance resets): the items are durable all the same, and the
		// next activation counts them as admitted (highWater), so the
		// admission stands and the answer says so.
		if err := tray.Set(admittedField, p.high); err == nil {
			_ = tray.Set(admittedAtField, time.Now().UnixMilli())
		}
		resp.Admitted = len(fresh)
	}
	if cancel > 0 {
		s.runs.requestStop(clientID, cancel)
	}
	resp.Acked = p.high
	return resp, nil
}

func (c storedCommand) command() Command {
	return Command{ClientID: c.ClientID, Seq: c.Seq, Type: c.Type, Frame: c.Frame}
}

// Pending returns the admitted commands of every client that have not
// settled yet (queued, or in a run), in tray order: what a host's Admit
// rule must count besides the document after a restart.
func (s *Server) Pending() []Command {
	var out []Command
	for _, k := range s.inst.Trays(CommandTray) {
		for _, it := range s.inst.Tray(k.NS, k.ID).Items() {
			var c storedCommand
			if json.Unmarshal(it.Payload, &c) == nil {
				out = append(out, c.command())
			}
		}
	}
	return out
}

// highWater is the highest seq a client's tray has admitted: its field, or
// a pending item above it (admitted, field write lost in a crash).
func highWater(tray *sdk.Tray) int64 {
	var high int64
	_, _ = tray.Get(admittedField, &high)
	for _, it := range tray.Items() {
		var c storedCommand
		if json.Unmarshal(it.Payload, &c) == nil && c.Seq > high {
			high = c.Seq
		}
	}
	return high
}
