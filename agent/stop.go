package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/pinnedd/pinnedd/internal/sdnotify"
)

// deadlineGrace is how long past the drain deadline a stop waits for the
// last evictions before stopping everything.
const deadlineGrace = 3 * time.Second

// step is one step of Stop: it runs when its condition holds, with a
// context that ends at its bound (none when 0: the step is immediate, or
// bounded inside its part). It logs its own warnings; an error it returns
// becomes the node's.
type step struct {
	name  string
	when  bool
	bound time.Duration
	run   func(context.Context) error
}

// Stop shuts the node down in the order of the list below, which reads top
// to bottom. A step whose part was never built is skipped, so Stop also
// cleans up after a New that failed half way. It returns e.Err, or a
// failed leave; a second call returns the first's result.
func (a *Agent) Stop(e Ending) error {
	a.stopOnce.Do(func() { a.stopErr = a.stop(e) })
	return a.stopErr
}

func (a *Agent) stop(e Ending) error {
	drain := a.started && a.sup != nil && e.Err == nil // a failed node does not drain
	raftWrites := !e.StorageFault                      // none can commit after a storage fault
	drainBy := time.Now().Add(e.DrainDeadline)
	stopGrace := a.cfg.StopGrace
	if stopGrace <= 0 {
		stopGrace = 10 * time.Second // the supervisor's default
	}
	if a.started {
		a.log.Info("shutting down")
	}
	steps := []step{
		{"tell systemd the node is stopping", a.started, 0, func(context.Context) error {
			_ = sdnotify.Stopping()
			return nil
		}},
		// SIGTERM drains: no new activations, idle instances go at once,
		// the rest when their work is done or at the deadline.
		{"refuse new activations", drain, 0, func(context.Context) error {
			a.api.Drain(drainBy, false)
			return nil
		}},
		{"drain instances", drain, time.Until(drainBy) + deadlineGrace, func(ctx context.Context) error {
			if err := a.sup.WaitDrained(ctx); err != nil {
				a.log.Warn("drain deadline passed with instances left; stopping them", "err", err)
			} else {
				a.log.Info("drained")
			}
			return nil
		}},
		{"refuse new requests", a.fd != nil, 0, func(context.Context) error {
			a.fd.SetStopping()
			return nil
		}},
		// Evicting releases the instances' placements.
		{"stop instances and plugins", a.sup != nil, stopGrace + 5*time.Second, func(ctx context.Context) error {
			a.sup.Stop(ctx)
			return nil
		}},
		{"stop background work", a.bgCancel != nil, 10 * time.Second, func(ctx context.Context) error {
			a.bgCancel()
			done := make(chan struct{})
			go func() { a.bg.Wait(); close(done) }()
			select {
			case <-done:
			case <-ctx.Done():
				a.log.Warn("background work did not stop in time; going on", "err", ctx.Err())
			}
			return nil
		}},
		{"deregister the worker", a.started && a.worker != nil && raftWrites, 5 * time.Second, func(ctx context.Context) error {
			if err := a.worker.Deregister(ctx); err != nil {
				a.log.Warn("deregister failed", "err", err)
			}
			return nil
		}},
		// Leadership is handed over first when this node leads.
		{"leave Raft", e.Leave && raftWrites, 30 * time.Second, func(ctx context.Context) error {
			if err := a.store.Leave(ctx); err != nil {
				a.log.Error("leaving the Raft cluster failed; it still counts this node as a member (pinnedd remove "+a.cfg.NodeID+" from another node)", "err", err)
				return fmt.Errorf("leave: %w", err)
			}
			return nil
		}},
		{"stop the front door", a.ln != nil, 5 * time.Second, func(ctx context.Context) error {
			if a.fd != nil {
				if err := a.fd.Shutdown(ctx); err != nil {
					a.log.Warn("requests still under way at the shutdown deadline; cut them off", "err", err)
				}
			}
			_ = a.ln.Close() // Serve closed it, unless it never ran
			return nil
		}},
		{"close the directory", a.dir != nil, 0, func(context.Context) error {
			a.dir.Close()
			return nil
		}},
		// Close hands leadership over first when this node leads.
		{"close Raft", a.store != nil, 10 * time.Second, func(ctx context.Context) error {
			if err := a.store.Close(ctx); err != nil {
				a.log.Warn("close raft", "err", err)
			}
			return nil
		}},
		{"close the state store", a.states != nil, 0, func(context.Context) error {
			if err := a.states.Close(); err != nil {
				a.log.Warn("close state store", "err", err)
			}
			return nil
		}},
		{"release the data dir", a.lock != nil, 0, func(context.Context) error {
			_ = a.lock.Release()
			return nil
		}},
		{"remove the dev data dir", a.devDir != "", 0, func(context.Context) error {
			if err := os.RemoveAll(a.devDir); err != nil {
				a.log.Warn("remove the dev data dir", "dir", a.devDir, "err", err)
			}
			return nil
		}},
		{"remove the dev copy of pinnedd's binary", a.devBin != nil, 0, func(context.Context) error {
			if err := a.devBin.remove(); err != nil {
				a.log.Warn("remove the dev copy of pinnedd's binary", "dir", a.devBin.dir, "err", err)
			}
			return nil
		}},
	}
	errs := []error{e.Err}
	for _, s := range steps {
		if s.when {
			errs = append(errs, a.runStep(s))
		}
	}
	if a.started {
		a.log.Info("stopped")
	}
	return errors.Join(errs...)
}

// runStep runs s within its bound, logging it at debug.
func (a *Agent) runStep(s step) error {
	ctx, cancel := context.Background(), context.CancelFunc(func() {})
	if s.bound > 0 {
		ctx, cancel = context.WithTimeout(ctx, s.bound)
	}
	defer cancel()
	a.log.Debug("shutdown step", "step", s.name, "bound", s.bound)
	start := time.Now()
	err := s.run(ctx)
	a.log.Debug("shutdown step done", "step", s.name, "took", time.Since(start).Round(time.Millisecond))
	return err
}
