package statestore_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testutil"
	"github.com/pinnedd/pinnedd/statestore"
	"github.com/pinnedd/pinnedd/statestore/memstore"
)

// flaky is a store whose calls fail, or hang until their context ends, while told to.
type flaky struct {
	statestore.Store
	mu   sync.Mutex
	fail error
	hang bool
}

func (f *flaky) set(fail error, hang bool) {
	f.mu.Lock()
	f.fail, f.hang = fail, hang
	f.mu.Unlock()
}

func (f *flaky) check(ctx context.Context) error {
	f.mu.Lock()
	fail, hang := f.fail, f.hang
	f.mu.Unlock()
	if hang {
		<-ctx.Done()
		return ctx.Err()
	}
	return fail
}

func (f *flaky) Load(ctx context.Context, k statestore.InstanceKey, gen uint64) ([]statestore.Tray, error) {
	if err := f.check(ctx); err != nil {
		return nil, err
	}
	return f.Store.Load(ctx, k, gen)
}

func (f *flaky) Ping(ctx context.Context) error { return f.check(ctx) }

var inst = statestore.InstanceKey{Namespace: "counters", ID: "a"}

func TestBoundedDeadlineAndClassification(t *testing.T) {
	f := &flaky{Store: memstore.New()}
	s := statestore.Bounded(f, 50*time.Millisecond, nil)
	ctx := context.Background()

	f.set(nil, true)
	start := time.Now()
	_, err := s.Load(ctx, inst, 1)
	if !errors.Is(err, statestore.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("hanging load: %v, want ErrUnavailable wrapping DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("hanging load returned after %s, want about the 50ms bound", d)
	}
	if !strings.Contains(err.Error(), "load did not answer within 50ms") {
		t.Fatalf("error %q does not say what timed out", err)
	}

	f.set(errors.New("connection refused"), false)
	if _, err := s.Load(ctx, inst, 1); !errors.Is(err, statestore.ErrUnavailable) || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("failing load: %v, want ErrUnavailable with the cause", err)
	}

	// The store's verdicts and the caller's own cancellation are not outages.
	f.set(statestore.FencedError(inst, 1, 2), false)
	if _, err := s.Load(ctx, inst, 1); errors.Is(err, statestore.ErrUnavailable) || !errors.Is(err, statestore.ErrFenced) {
		t.Fatalf("fenced load: %v", err)
	}
	f.set(nil, true)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.Load(cctx, inst, 1); errors.Is(err, statestore.ErrUnavailable) || !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled load: %v, want the caller's context.Canceled", err)
	}

	f.set(nil, false)
	if _, err := s.Load(ctx, inst, 1); err != nil {
		t.Fatalf("healthy load: %v", err)
	}
}

// The monitor turns unhealthy only once failures span the grace, says so once, and recovers
// on the first success.
func TestMonitorGraceAndRecovery(t *testing.T) {
	var logs bytes.Buffer
	var changes []error
	now := time.Unix(1000, 0)
	m := statestore.NewTestMonitor(statestore.MonitorConfig{
		Grace:    5 * time.Second,
		Logger:   slog.New(slog.NewTextHandler(&logs, nil)),
		OnChange: func(err error) { changes = append(changes, err) },
	}, func() time.Time { return now })
	f := &flaky{Store: memstore.New()}
	s := statestore.Bounded(f, time.Second, m)
	ctx := context.Background()

	f.set(errors.New("connection refused"), false)
	for range 4 {
		_, _ = s.Load(ctx, inst, 1)
		if err := m.Err(); err != nil {
			t.Fatalf("unhealthy at %s of failures, before the grace: %v", now.Sub(time.Unix(1000, 0)), err)
		}
		now = now.Add(time.Second)
	}
	// A success in between resets the span: a blip does not add up.
	f.set(nil, false)
	_, _ = s.Load(ctx, inst, 1)
	f.set(errors.New("connection refused"), false)
	_, _ = s.Load(ctx, inst, 1)
	now = now.Add(4 * time.Second)
	if err := m.Err(); err != nil {
		t.Fatalf("unhealthy 4s after a success: %v", err)
	}
	now = now.Add(time.Second)
	_ = s.(statestore.Pinger).Ping(ctx) // a failing probe: still failing 5s on
	err := m.Err()
	if !errors.Is(err, statestore.ErrUnavailable) || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("after 5s of failures: %v, want ErrUnavailable with the cause", err)
	}
	_ = m.Err()
	f.set(nil, false)
	_ = s.(statestore.Pinger).Ping(ctx)
	if err := m.Err(); err != nil {
		t.Fatalf("after a passing probe: %v", err)
	}
	if len(changes) != 2 || changes[0] == nil || changes[1] != nil {
		t.Fatalf("changes %v, want one failure then one recovery", changes)
	}
	if n := strings.Count(logs.String(), "level=ERROR"); n != 1 {
		t.Fatalf("%d ERROR lines, want 1:\n%s", n, logs.String())
	}
	if n := strings.Count(logs.String(), "level=INFO msg=\"state store reachable again"); n != 1 {
		t.Fatalf("want one INFO on recovery:\n%s", logs.String())
	}
}

// Run probes on its own: a store that stops answering is unhealthy after the grace without any
// call through it.
func TestMonitorRunProbes(t *testing.T) {
	f := &flaky{Store: memstore.New()}
	f.set(errors.New("connection refused"), false)
	m := statestore.NewMonitor(statestore.MonitorConfig{Interval: 10 * time.Millisecond, Grace: 50 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); m.Run(ctx, f) }()
	defer func() { cancel(); <-done }()
	testutil.WaitFor(t, 5*time.Second, "a store failing every probe to turn unhealthy", func() bool { return m.Err() != nil })
	f.set(nil, false)
	testutil.WaitFor(t, 5*time.Second, "a store passing its probes to turn healthy", func() bool { return m.Err() == nil })
}

// The defaults and limits gremlins found untested: a zero timeout is
// CallTimeout (a call that succeeds goes through), a zero MonitorConfig
// runs, one failure is not yet unhealthy, and the instance and fence rules
// refuse a NUL in an id and generation 0 but take the largest generation.
func TestBoundedDefaultsAndValidationLimits(t *testing.T) {
	ctx := context.Background()
	inst := statestore.InstanceKey{Namespace: "/ns", ID: "a"}
	if _, err := statestore.Bounded(memstore.New(), 0, nil).Load(ctx, inst, 1); err != nil {
		t.Fatalf("Load through Bounded with the default timeout: %v", err)
	}
	m := statestore.NewMonitor(statestore.MonitorConfig{})
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); m.Run(rctx, statestore.Bounded(memstore.New(), 0, nil).(statestore.Pinger)) }()
	cancel()
	<-done
	s := statestore.Bounded(&flaky{Store: memstore.New(), fail: errors.New("down")}, time.Second, m)
	if _, err := s.Load(ctx, inst, 1); !errors.Is(err, statestore.ErrUnavailable) {
		t.Fatalf("a failing Load: %v, want ErrUnavailable", err)
	}
	if err := m.Err(); err != nil {
		t.Fatalf("one failure already unhealthy: %v", err)
	}
	if err := statestore.ValidateInstance(statestore.InstanceKey{Namespace: "/ns", ID: "a\x00b"}); !errors.Is(err, statestore.ErrInvalid) {
		t.Fatalf("an id with a NUL: %v, want ErrInvalid", err)
	}
	if err := statestore.ValidateFence(inst, 0); !errors.Is(err, statestore.ErrInvalid) {
		t.Fatalf("generation 0: %v, want ErrInvalid", err)
	}
	if err := statestore.ValidateFence(inst, statestore.MaxGeneration); err != nil {
		t.Fatalf("the largest generation: %v", err)
	}
}
