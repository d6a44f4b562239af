package statewire

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/pinnedd/pinnedd/plugins/sdk"
)

// ErrNoServer: a command tray's work reached a process that has no live
// Statewire server for its instance; it stays queued for the next one.
var ErrNoServer = errors.New("statewire: no server for this instance")

// serverKey finds an instance's Server from a tray run (sdk.Instance.Attach).
type serverKey struct{}

// Trays returns the tray handlers a Statewire host must list in
// sdk.Host.Trays.
func Trays() map[string]sdk.TrayHandler {
	return map[string]sdk.TrayHandler{CommandTray: handleCommands}
}

// Command is one admitted client command.
type Command struct {
	ClientID string
	Seq      int64
	Type     string
	// Frame is the whole frame as the client sent it.
	Frame json.RawMessage
}

// RunContext is what a RunFunc sees of its batch.
type RunContext struct {
	// ClientID whose command pool the batch came from.
	ClientID string
	// Commands are the batch's run commands, in admission order.
	Commands []Command
	// Resume: the batch was declared applied before the process that ran
	// it stopped; this is a redelivery.
	Resume bool

	run  *sdk.Run
	stop chan struct{}
	once sync.Once
}

// Applied declares the batch durably applied (it returns once that is
// stored): from here on a crash redelivers it with Resume set.
func (rc *RunContext) Applied(ctx context.Context) error {
	if err := rc.run.Applied(ctx); err != nil {
		return fmt.Errorf("mark applied: %w", err)
	}
	return nil
}

// StopRequested is closed once a cancel command asked the run to stop.
func (rc *RunContext) StopRequested() <-chan struct{} { return rc.stop }

// Stopping reports whether a stop was requested.
func (rc *RunContext) Stopping() bool {
	select {
	case <-rc.stop:
		return true
	default:
		return false
	}
}

func (rc *RunContext) requestStop() { rc.once.Do(func() { close(rc.stop) }) }

// runManager runs one batch at a time per instance and knows the runs in
// progress or waiting for their turn, so an admitted cancel can stop its
// own client's.
type runManager struct {
	slot chan struct{} // holds a token while a run is in progress
	mu   sync.Mutex
	runs map[*RunContext]struct{}
	// cancelled is each client's highest admitted cancel seq: a run of
	// commands admitted before it is stopped, even if it registers after
	// the cancel (its tray's handler had not started yet).
	cancelled map[string]int64
}

func (m *runManager) init() {
	m.slot = make(chan struct{}, 1)
	m.runs = map[*RunContext]struct{}{}
	m.cancelled = map[string]int64{}
}

// requestStop stops the runs of clientID's commands admitted before seq: a
// client cancels only what it started, never another client's run.
func (m *runManager) requestStop(clientID string, seq int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cancelled[clientID] = max(m.cancelled[clientID], seq)
	for rc := range m.runs {
		m.stopIfCancelledLocked(rc)
	}
}

// forget drops clientID's cancel mark with its dedup mark: a client that
// starts over from seq 1 must not find its new runs cancelled.
func (m *runManager) forget(clientID string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.cancelled, clientID)
}

func (m *runManager) stopIfCancelledLocked(rc *RunContext) {
	if len(rc.Commands) > 0 && rc.Commands[0].Seq < m.cancelled[rc.ClientID] {
		rc.requestStop()
	}
}

// handleCommands is the command tray's handler: it hands run commands to
// the instance's RunFunc and settles the rest.
func handleCommands(ctx context.Context, run *sdk.Run) error {
	if len(run.Items) == 0 {
		return nil
	}
	cmds := make([]storedCommand, 0, len(run.Items))
	for _, it := range run.Items {
		var c storedCommand
		if err := json.Unmarshal(it.Payload, &c); err != nil {
			// Only this package admits items, so this is a bug or a
			// tampered store: leave the batch queued and say so.
			return fmt.Errorf("command tray item %d: %w", it.Seq, err)
		}
		cmds = append(cmds, c)
	}
	// The run belongs to one activation; its server is attached to it, so
	// a stopping activation never runs a successor's work.
	s, _ := run.Instance.Attached(serverKey{}).(*Server)
	if s == nil {
		return ErrNoServer
	}
	rc := &RunContext{ClientID: cmds[0].ClientID, Resume: run.Resume, run: run, stop: make(chan struct{})}
	for _, c := range cmds {
		switch {
		case c.Type == CancelCommand:
			// A cancel queued behind the batch's run commands stops them.
			if len(rc.Commands) > 0 {
				rc.requestStop()
			}
		case s.cfg.Commands[c.Type].Run:
			rc.Commands = append(rc.Commands, Command{ClientID: c.ClientID, Seq: c.Seq, Type: c.Type, Frame: c.Frame})
		}
	}
	if len(rc.Commands) > 0 {
		if err := s.runs.do(ctx, s.cfg.Run, rc); err != nil {
			return err
		}
	}
	// Keep the dedup mark past the items' removal (the admission's own
	// write may have been lost with the process that made it).
	high := cmds[len(cmds)-1].Seq
	var stored int64
	if _, err := run.Tray.Get(admittedField, &stored); err != nil || stored < high {
		if err := run.Tray.Set(admittedField, high); err != nil {
			return fmt.Errorf("record admitted seq: %w", err)
		}
		if err := run.Tray.Set(admittedAtField, time.Now().UnixMilli()); err != nil {
			return fmt.Errorf("record admission time: %w", err)
		}
	}
	return nil
}

// do runs rc once the slot is free. It is known to cancels from before it
// waits: a cancel admitted while another client's run holds the slot still
// stops it.
func (m *runManager) do(ctx context.Context, fn RunFunc, rc *RunContext) error {
	m.mu.Lock()
	m.runs[rc] = struct{}{}
	m.stopIfCancelledLocked(rc)
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		delete(m.runs, rc)
		m.mu.Unlock()
	}()
	select {
	case m.slot <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-m.slot }()
	return fn(ctx, rc)
}
