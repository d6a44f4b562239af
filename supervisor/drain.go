package supervisor

import (
	"context"
	"errors"
	"time"

	"github.com/pinnedd/pinnedd/plugins/proto"
)

// Drain sources. Each applies independently; the earliest deadline wins,
// and revoking one leaves the others in force.
const (
	DrainLocal    = "local"    // SIGTERM, `pinnedd drain` on this node
	DrainOperator = "operator" // POST /registry/drain, riding heartbeat acks
)

// ErrDraining refuses a new activation on a draining node.
var ErrDraining = errors.New("node is draining")

// deadlineGrace is what tracked work gets after its wind-down deadline.
const deadlineGrace = time.Second

type drainSpec struct {
	deadline time.Time // zero with cordon
	cordon   bool
}

// SetDrain sets (or, with a zero deadline and no cordon, revokes) one
// source's drain. While any is in force the node takes no new activations,
// idle instances go at once, and the rest at the earliest deadline (never,
// for cordons only).
func (s *Supervisor) SetDrain(source string, deadline time.Time, cordon bool) {
	s.mu.Lock()
	if deadline.IsZero() && !cordon {
		delete(s.drains, source)
	} else {
		s.drains[source] = drainSpec{deadline: deadline, cordon: cordon}
	}
	acts := s.recomputeLocked()
	s.mu.Unlock()
	s.run(acts)
	s.noteDrained()
}

// DrainingBy reports whether source has a drain in force.
func (s *Supervisor) DrainingBy(source string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.drains[source]
	return ok
}

// Draining reports whether the node drains, and the deadline in force
// (zero when only cordoned).
func (s *Supervisor) Draining() (bool, time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.drainingLocked(), s.nodeDeadlineLocked()
}

func (s *Supervisor) drainingLocked() bool { return len(s.drains) > 0 }

func (s *Supervisor) nodeDeadlineLocked() time.Time {
	var d time.Time
	for _, sp := range s.drains {
		if !sp.cordon && (d.IsZero() || sp.deadline.Before(d)) {
			d = sp.deadline
		}
	}
	return d
}

// WaitDrained blocks until the node drains and has no instance left.
func (s *Supervisor) WaitDrained(ctx context.Context) error {
	for {
		s.mu.Lock()
		done := s.drainingLocked() && len(s.instances) == 0
		ch := s.drainedCh
		s.mu.Unlock()
		if done {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// noteDrained wakes WaitDrained callers after a change.
func (s *Supervisor) noteDrained() {
	s.mu.Lock()
	close(s.drainedCh)
	s.drainedCh = make(chan struct{})
	s.mu.Unlock()
}

// WindDown sets an operator's deadline for one instance (k.ID) or for
// every live instance of k.Namespace in k.Env (k.ID ""), or revokes it
// (zero deadline). It returns how many live instances it touched.
func (s *Supervisor) WindDown(k Key, deadline time.Time) int {
	s.mu.Lock()
	n := 0
	for ik, in := range s.instances {
		if ik.Env != k.Env || ik.Namespace != k.Namespace || (k.ID != "" && ik.ID != k.ID) {
			continue
		}
		in.windDown = deadline
		n++
	}
	acts := s.recomputeLocked()
	s.mu.Unlock()
	s.run(acts)
	return n
}

// windingLocked: the instance is on its way out (drain, wind-down, swap).
func (s *Supervisor) windingLocked(in *instance) bool {
	return !in.deadline.IsZero() || s.drainingLocked() || in.inc.retired.Load()
}

// windReason is the eviction reason a winding instance goes with.
func (s *Supervisor) windReason(in *instance) proto.Reason {
	switch {
	case in.inc.retired.Load():
		return proto.Reason_REASON_SWAP
	case s.drainingLocked():
		return proto.Reason_REASON_DRAIN
	default:
		return proto.Reason_REASON_OPERATOR
	}
}

// recomputeLocked brings every instance's deadline in line with the drains,
// its own wind-down and its incarnation's retirement, and returns what must
// happen outside the lock: plugins told of new deadlines, idle instances
// evicted.
func (s *Supervisor) recomputeLocked() []func() {
	var acts []func()
	node := s.nodeDeadlineLocked()
	for _, in := range s.instances {
		eff := earliest(in.windDown, node)
		if in.inc.retired.Load() {
			eff = earliest(eff, in.inc.retireBy)
		}
		if !eff.Equal(in.deadline) {
			in.deadline = eff
			if in.timer != nil {
				in.timer.Stop()
				in.timer = nil
			}
			if !eff.IsZero() {
				in := in
				in.timer = time.AfterFunc(time.Until(eff), func() {
					s.mu.Lock()
					reason := s.windReason(in)
					s.mu.Unlock()
					s.evictWith(context.Background(), in, reason, deadlineGrace, false)
				})
			}
		}
		if !in.sent.Equal(in.deadline) {
			in.sent = in.deadline
			in, at := in, in.deadline
			acts = append(acts, func() { s.tellWindDown(in, at) })
		}
		if s.windingLocked(in) && in.conns == in.streams && !in.evicting {
			in := in
			reason := s.windReason(in)
			acts = append(acts, func() { s.evictWith(context.Background(), in, reason, s.cfg.StopGrace, true) })
		}
	}
	return acts
}

func (s *Supervisor) run(acts []func()) {
	for _, a := range acts {
		go a()
	}
}

// tellWindDown passes an instance's deadline to its plugin (zero revokes):
// the SDK marks it for EvictionCheckpoint and asks to go once its tracked
// work is done.
func (s *Supervisor) tellWindDown(in *instance, at time.Time) {
	<-in.ready
	if in.err != nil {
		return
	}
	var ms int64
	if !at.IsZero() {
		ms = at.UnixMilli()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := in.inc.conn.Control.WindDown(ctx, &proto.WindDownRequest{Namespace: in.key.Namespace, Id: in.key.ID, DeadlineUnixMs: ms}); err != nil && in.inc.alive() {
		s.cfg.Logger.Warn("wind-down notice failed", "instance", in.key.String(), "err", err)
	}
}

func earliest(a, b time.Time) time.Time {
	switch {
	case a.IsZero():
		return b
	case b.IsZero() || a.Before(b):
		return a
	}
	return b
}
