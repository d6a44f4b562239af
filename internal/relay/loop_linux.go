//go:build linux

package relay

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"runtime"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Supported reports whether this platform has a relay loop.
const Supported = true

// Tuning of the loop.
const (
	// readBuf is the loop's one read buffer, shared by every stream: a
	// stream keeps bytes of its own only while its client is slow.
	readBuf = 32 << 10
	// turnReads bounds the reads one stream gets per turn of the loop, so
	// a fast stream cannot starve the others.
	turnReads = 8
	maxEvents = 128
)

// Sides of a stream, in an epoll event's data (with the stream's id).
const (
	sideClient   = 0
	sideUpstream = 1
	sideWake     = 2
)

// Loop relays held streams. The zero value is not usable; call New. It
// holds no goroutine or descriptor until the first Add, and none after
// Close.
type Loop struct {
	log *slog.Logger

	life    // its mu guards everything below, and every stream's state
	nextID  uint32
	streams map[uint32]*stream

	live atomic.Int64
}

// life is what both loops share: the lock, the epoll instance and the
// eventfd that wakes it, started on first use and closed once, and how the
// loop waits (DESIGN.md says why, with the measurements):
//
//   - while traffic flows it waits in epoll_wait itself, as a raw syscall
//     that keeps its P (a held wait), for up to holdFor; one loop of the
//     process holds at a time (holder), none with GOMAXPROCS 1 or while
//     other goroutines wait for a P (othersRunnable);
//   - Go's poller watches epfd through parkfd only while the loop is
//     parked (armed), so held and blocking waits wake no other thread;
//   - with more than one P the loop's goroutine is locked to its thread
//     and an idle loop blocks in epoll_wait through the scheduler (block);
//     with one P it parks in Go's poller instead, holding no P.
type life struct {
	mu      sync.Mutex
	started bool
	closed  bool
	epfd    int
	wakefd  int
	done    chan struct{} // closed when the loop's goroutine has ended

	parkfd   int      // an epoll instance that watches epfd, except during held waits
	armed    bool     // parkfd watches epfd
	ep       *os.File // parkfd, in Go's poller; only the loop's goroutine uses it after start
	rc       syscall.RawConn
	deadline time.Time         // ep's read deadline, reset only once it has passed
	busy     bool              // the last wait returned events: hold the next ones
	yielded  time.Time         // when the loop last gave way to the scheduler (see yieldEvery)
	sched    [1]metrics.Sample // runnable goroutines, for othersRunnable (named at start)
	locked   bool              // the loop's goroutine is locked to its thread (see life)
}

// holdFor bounds a held wait (see life).
const holdFor = time.Millisecond

// yieldEvery: a loop that holds gives way to the scheduler this often, so
// sysmon never has to preempt it (after 10 ms, with a signal that can land
// mid-request); not more often, since each yield goes through the global
// run queue (DESIGN.md has the measurements).
const yieldEvery = 9 * time.Millisecond

var (
	holder    atomic.Bool  // the process's one held wait
	heldWaits atomic.Int64 // held waits so far, for tests
)

// startLocked starts the loop (run, on its own goroutine) unless it runs
// already; the wake-up eventfd is registered with wakeEvents as wakeSide.
func (e *life) startLocked(wakeEvents uint32, wakeSide int32, run func(epfd, wakefd int)) error {
	if e.closed {
		return ErrClosed
	}
	if e.started {
		return nil
	}
	epfd, wakefd, err := openEpoll(wakeEvents, wakeSide)
	if err != nil {
		return err
	}
	if err := unix.SetNonblock(epfd, true); err != nil {
		_, _ = unix.Close(epfd), unix.Close(wakefd)
		return fmt.Errorf("epoll nonblock: %w", err)
	}
	// The loop parks on parkfd, an epoll instance of its own in Go's
	// poller that watches epfd only while the loop is parked (see life).
	parkfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err == nil {
		err = unix.SetNonblock(parkfd, true)
		if err == nil {
			err = epollCtl(parkfd, unix.EPOLL_CTL_ADD, epfd, unix.EPOLLIN, 0, 0)
		}
		if err != nil {
			_ = unix.Close(parkfd)
		}
	}
	if err != nil {
		_, _ = unix.Close(epfd), unix.Close(wakefd)
		return fmt.Errorf("epoll to park on: %w", err)
	}
	e.ep = os.NewFile(uintptr(parkfd), "relay-epoll")
	if e.rc, err = e.ep.SyscallConn(); err != nil {
		_, _, _ = e.ep.Close(), unix.Close(epfd), unix.Close(wakefd)
		return fmt.Errorf("epoll in Go's poller: %w", err)
	}
	e.epfd, e.wakefd, e.parkfd, e.armed = epfd, wakefd, parkfd, true
	e.sched[0].Name = "/sched/goroutines/runnable:goroutines"
	e.started, e.done = true, make(chan struct{})
	go func() {
		// A goroutine that ends locked takes its thread with it.
		defer func() {
			if e.locked {
				runtime.UnlockOSThread()
			}
		}()
		run(epfd, wakefd)
	}()
	return nil
}

// wait returns the ready events, waiting for them up to timeout (0: not at
// all; < 0: as long as it takes), in a held wait or parked (see life).
// Run on the loop's goroutine only.
func (e *life) wait(events []unix.EpollEvent, timeout time.Duration) (int, error) {
	if timeout == 0 {
		n, err := epollNow(e.epfd, events)
		if errors.Is(err, unix.EINTR) {
			return 0, nil
		}
		return n, err
	}
	if e.busy {
		if now := time.Now(); now.Sub(e.yielded) >= yieldEvery {
			e.yielded = now
			runtime.Gosched()
		}
	}
	if e.busy && !e.othersRunnable() && holder.CompareAndSwap(false, true) {
		if err := e.disarm(); err != nil {
			holder.Store(false)
			return 0, err
		}
		msec := holdFor.Milliseconds()
		if timeout > 0 {
			msec = min(msec, max(timeout.Milliseconds(), 1))
		}
		n, err := epollHold(e.epfd, events, int(msec))
		holder.Store(false)
		heldWaits.Add(1)
		switch {
		case errors.Is(err, unix.EINTR):
			return 0, nil // signalled: the loop goes round, and may be preempted
		case n > 0 || err != nil:
			return n, err
		}
		e.busy = false // a whole held wait found nothing: idle
	}
	if !e.busy && e.lockThread() {
		return e.block(events, timeout)
	}
	n, err := e.park(events, timeout)
	e.busy = n > 0 && runtime.GOMAXPROCS(0) > 1
	return n, err
}

// lockThread locks the loop's goroutine to its thread while there is more
// than one P and unlocks it otherwise (GOMAXPROCS may change); it reports
// whether it is locked.
func (e *life) lockThread() bool {
	want := runtime.GOMAXPROCS(0) > 1
	switch {
	case want && !e.locked:
		runtime.LockOSThread()
	case !want && e.locked:
		runtime.UnlockOSThread()
	}
	e.locked = want
	return want
}

// disarm stops Go's poller watching epfd, before the loop waits on epfd
// itself: those waits' events wake no thread there.
func (e *life) disarm() error {
	if !e.armed {
		return nil
	}
	if err := epollCtl(e.parkfd, unix.EPOLL_CTL_MOD, e.epfd, 0, 0, 0); err != nil {
		return fmt.Errorf("epoll unwatch: %w", err)
	}
	e.armed = false
	return nil
}

// block waits for events as wait does, in epoll_wait through the
// scheduler's syscall path, on the thread the loop is locked to.
func (e *life) block(events []unix.EpollEvent, timeout time.Duration) (int, error) {
	if err := e.disarm(); err != nil {
		return 0, err
	}
	msec := -1
	if timeout > 0 {
		msec = int((timeout + time.Millisecond - 1) / time.Millisecond)
	}
	n, err := epollBlock(e.epfd, events, msec)
	if errors.Is(err, unix.EINTR) {
		n, err = 0, nil
	}
	e.busy = n > 0
	return n, err
}

// othersRunnable reports whether goroutines are waiting for a P: then the
// loop parks, and its P runs them, instead of holding it. (65 ns a read.)
func (e *life) othersRunnable() bool {
	metrics.Read(e.sched[:])
	return e.sched[0].Value.Kind() == metrics.KindUint64 && e.sched[0].Value.Uint64() > 0
}

// park waits for events as wait does, with the goroutine parked in Go's
// poller.
func (e *life) park(events []unix.EpollEvent, timeout time.Duration) (int, error) {
	if !e.armed {
		if err := epollCtl(e.parkfd, unix.EPOLL_CTL_MOD, e.epfd, unix.EPOLLIN, 0, 0); err != nil {
			return 0, fmt.Errorf("epoll watch: %w", err)
		}
		e.armed = true
	}
	want := time.Time{}
	if timeout > 0 {
		now := time.Now()
		want = e.deadline
		if !want.After(now) {
			want = now.Add(timeout)
		}
	}
	if !want.Equal(e.deadline) {
		if err := e.ep.SetReadDeadline(want); err != nil {
			return 0, err
		}
		e.deadline = want
	}
	var n int
	var werr error
	err := e.rc.Read(func(uintptr) bool {
		n, werr = epollNow(e.epfd, events)
		if errors.Is(werr, unix.EINTR) {
			n, werr = 0, nil
		}
		return n > 0 || werr != nil
	})
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return 0, nil
	case err != nil:
		return 0, err
	}
	return n, werr
}

// closeEpollLocked closes both epoll instances and the eventfd.
func (e *life) closeEpollLocked() {
	_, _, _ = unix.Close(e.wakefd), e.ep.Close(), unix.Close(e.epfd)
	e.epfd, e.wakefd, e.parkfd = -1, -1, -1
}

func (e *life) wakeLocked() error {
	one := []byte{1, 0, 0, 0, 0, 0, 0, 0}
	_, err := unix.Write(e.wakefd, one)
	return err
}

// close marks the loop closed, wakes it and waits until its goroutine
// (which ends everything it holds) is gone.
func (e *life) close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		if e.done != nil {
			<-e.done
		}
		return nil
	}
	e.closed = true
	if !e.started {
		e.mu.Unlock()
		return nil
	}
	err := e.wakeLocked()
	e.mu.Unlock()
	if err != nil {
		return fmt.Errorf("wake loop: %w", err)
	}
	<-e.done
	return nil
}

type stream struct {
	id      uint32
	cfd     int // client
	ufd     int // upstream
	pending []byte
	chunked bool
	sc      chunkScanner
	upReady bool // the upstream may have bytes: not yet read to EAGAIN
	ending  bool // the body is complete: close once pending is out
	queued  bool
	closed  bool
	done    func(Reason)
	release func() // the client's slot (see slot.go), called once cfd is closed
}

// New returns a loop; logger may be nil.
func New(logger *slog.Logger) *Loop {
	if logger == nil {
		logger = slog.Default()
	}
	return &Loop{log: logger, streams: map[uint32]*stream{}, life: life{epfd: -1, wakefd: -1}}
}

// Len is the number of streams being relayed.
func (l *Loop) Len() int { return int(l.live.Load()) }

// Add hands a stream to the loop. It takes both connections whatever it
// returns: on success they belong to the loop (their net.Conns are closed,
// the loop holds duplicates of their descriptors, out of Go's poller, and
// the client's slot under a connection cap, see slot.go, until it closes
// the client's); on error they are closed, the slot is given back and Done
// is not called.
func (l *Loop) Add(s Stream) error {
	cfd, release, err := takeClient(s.Client)
	if err != nil {
		_ = s.Upstream.Close()
		return fmt.Errorf("client connection: %w", err)
	}
	ufd, err := takeFD(s.Upstream)
	if err != nil {
		_ = unix.Close(cfd)
		release()
		return fmt.Errorf("upstream connection: %w", err)
	}
	refuse := func(err error) error {
		_, _ = unix.Close(cfd), unix.Close(ufd)
		release()
		return err
	}
	st := &stream{cfd: cfd, ufd: ufd, chunked: s.Chunked, done: s.Done, release: release}
	body := s.Body
	if st.chunked {
		end, err := st.sc.scan(body)
		if err != nil {
			return refuse(fmt.Errorf("upstream body: %w", err))
		}
		if end >= 0 {
			body, st.ending = body[:end], true
		}
	}
	// The head and the bytes already read go out first, from the loop,
	// when the client's socket reports writable.
	st.pending = append(append(make([]byte, 0, len(s.Head)+len(body)), s.Head...), body...)

	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.startLocked(); err != nil {
		return refuse(err)
	}
	// 0 names the wake-up descriptor; past 2^32 streams the ids wrap, and
	// one still held (a stream open for days) is skipped.
	for l.nextID++; l.nextID == 0 || l.streams[l.nextID] != nil; l.nextID++ {
	}
	st.id = l.nextID
	// Edge-triggered: the loop reads and writes until EAGAIN and remembers
	// what it could not finish, so no registration changes per stream.
	if err := l.ctl(unix.EPOLL_CTL_ADD, cfd, unix.EPOLLOUT|unix.EPOLLRDHUP|unix.EPOLLET, st.id, sideClient); err != nil {
		return refuse(fmt.Errorf("epoll add client: %w", err))
	}
	if err := l.ctl(unix.EPOLL_CTL_ADD, ufd, unix.EPOLLIN|unix.EPOLLRDHUP|unix.EPOLLET, st.id, sideUpstream); err != nil {
		_ = l.ctl(unix.EPOLL_CTL_DEL, cfd, 0, 0, 0)
		return refuse(fmt.Errorf("epoll add upstream: %w", err))
	}
	l.streams[st.id] = st
	l.live.Add(1)
	return nil
}

// takeFD duplicates c's descriptor and closes c: Go's poller lets go of
// its descriptor (deregistering it), and the duplicate keeps the socket,
// still non-blocking, open for the loop.
func takeFD(c net.Conn) (int, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		_ = c.Close()
		return -1, ErrNotSocket
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		_ = c.Close()
		return -1, err
	}
	fd, derr := -1, error(nil)
	if err := raw.Control(func(s uintptr) { fd, derr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		_ = c.Close()
		return -1, err
	}
	_ = c.Close()
	if derr != nil {
		return -1, fmt.Errorf("dup: %w", derr)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		_ = unix.Close(fd)
		return -1, fmt.Errorf("nonblock: %w", err)
	}
	return fd, nil
}

// takeClient is takeFD for a client connection, which takes the
// connection's slot along (detachSlot, before c is closed): the caller
// calls release once it closes fd. On error the slot is given back.
func takeClient(c net.Conn) (fd int, release func(), err error) {
	release = detachSlot(c)
	if fd, err = takeFD(c); err != nil {
		release()
		return -1, nil, err
	}
	return fd, release, nil
}

func (l *Loop) startLocked() error {
	return l.life.startLocked(unix.EPOLLIN, sideWake, func(epfd, _ int) { l.run(epfd) })
}

func (l *Loop) ctl(op, fd int, events uint32, id uint32, side int32) error {
	return epollCtl(l.epfd, op, fd, events, id, side)
}

// epollCtl registers fd with an event carrying id and side (both loops
// keep a registration's owner in the event's data).
func epollCtl(epfd, op, fd int, events uint32, id uint32, side int32) error {
	ev := unix.EpollEvent{Events: events, Fd: int32(id), Pad: side}
	return unix.EpollCtl(epfd, op, fd, &ev)
}

// openEpoll makes an epoll instance and the eventfd that wakes it,
// registered with wakeEvents as id 0 of wakeSide.
func openEpoll(wakeEvents uint32, wakeSide int32) (epfd, wakefd int, err error) {
	epfd, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return -1, -1, fmt.Errorf("epoll: %w", err)
	}
	wakefd, err = unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		_ = unix.Close(epfd)
		return -1, -1, fmt.Errorf("eventfd: %w", err)
	}
	if err := epollCtl(epfd, unix.EPOLL_CTL_ADD, wakefd, wakeEvents, 0, wakeSide); err != nil {
		_, _ = unix.Close(epfd), unix.Close(wakefd)
		return -1, -1, fmt.Errorf("epoll add wake: %w", err)
	}
	return epfd, wakefd, nil
}

// Close ends every stream (Done sees Shutdown) and stops the loop; it
// returns once the loop's goroutine and descriptors are gone.
func (l *Loop) Close() error { return l.close() }

// run is the loop: wait for readiness, move bytes, repeat.
func (l *Loop) run(epfd int) {
	defer close(l.done)
	events := make([]unix.EpollEvent, maxEvents)
	buf := make([]byte, readBuf)
	var runq, next []*stream
	var ended []func()
	for {
		timeout := time.Duration(-1)
		if len(runq) > 0 {
			timeout = 0 // streams cut off by their read budget go on
		}
		n, err := l.wait(events, timeout)
		if err != nil {
			l.log.Error("relay loop: epoll_wait failed; ending every stream", "err", err)
			l.mu.Lock()
			l.closed = true
			l.shutdownLocked(&ended)
			l.mu.Unlock()
			runEnded(ended)
			return
		}
		l.mu.Lock()
		for _, ev := range events[:max(n, 0)] {
			if ev.Pad == sideWake {
				l.shutdownLocked(&ended)
				l.mu.Unlock()
				runEnded(ended)
				return
			}
			s := l.streams[uint32(ev.Fd)]
			if s == nil { // ended earlier in this batch
				continue
			}
			if ev.Pad == sideClient && ev.Events&(unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
				l.end(s, ClientGone, &ended)
				continue
			}
			if ev.Pad == sideUpstream {
				// Readable, hung up or failed: a read tells which, after
				// whatever bytes are left.
				s.upReady = true
			}
			l.pump(s, buf, &next, &ended)
		}
		for _, s := range runq {
			s.queued = false
			if !s.closed {
				l.pump(s, buf, &next, &ended)
			}
		}
		runq, next = next, runq[:0]
		l.mu.Unlock()
		ended = runEnded(ended)
	}
}

// pump moves what it can of s: pending bytes to the client, then upstream
// bytes while the client takes them all. A client that cannot keep up
// stops the reading (its remainder waits in pending), so the upstream's
// socket fills and TCP slows the owner down.
func (l *Loop) pump(s *stream, buf []byte, runq *[]*stream, ended *[]func()) {
	if len(s.pending) > 0 {
		n, err := writeAll(s.cfd, s.pending)
		s.pending = s.pending[n:]
		if err != nil {
			l.end(s, ClientGone, ended)
			return
		}
		if len(s.pending) > 0 {
			return // EPOLLOUT brings us back
		}
		s.pending = nil
	}
	if s.ending {
		l.end(s, Complete, ended)
		return
	}
	for range turnReads {
		if !s.upReady {
			return
		}
		n, err := sysRead(s.ufd, buf)
		switch {
		case errors.Is(err, unix.EAGAIN):
			s.upReady = false
			return
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			l.end(s, UpstreamFailed, ended)
			return
		case n == 0:
			if s.chunked { // EOF before the last chunk: the client must not take it as whole
				l.end(s, UpstreamFailed, ended)
			} else {
				l.end(s, Complete, ended)
			}
			return
		}
		data := buf[:n]
		if s.chunked {
			end, err := s.sc.scan(data)
			if err != nil {
				l.end(s, UpstreamFailed, ended)
				return
			}
			if end >= 0 {
				data, s.ending = data[:end], true
			}
		}
		w, err := writeAll(s.cfd, data)
		if err != nil {
			l.end(s, ClientGone, ended)
			return
		}
		if w < len(data) {
			s.pending = append([]byte(nil), data[w:]...)
			return
		}
		if s.ending {
			l.end(s, Complete, ended)
			return
		}
	}
	if s.upReady && !s.queued {
		s.queued = true
		*runq = append(*runq, s)
	}
}

// writeAll writes p to the non-blocking fd until done or EAGAIN (not an
// error: the caller keeps the rest).
func writeAll(fd int, p []byte) (int, error) {
	w := 0
	for w < len(p) {
		n, err := sysWrite(fd, p[w:])
		if n > 0 {
			w += n
		}
		switch {
		case errors.Is(err, unix.EAGAIN):
			return w, nil
		case errors.Is(err, unix.EINTR):
		case err != nil:
			return w, err
		}
	}
	return w, nil
}

// end closes both sides of s: the client sees the end of the response, the
// upstream sees its client gone. Done runs after the lock is released.
func (l *Loop) end(s *stream, r Reason, ended *[]func()) {
	if s.closed {
		return
	}
	s.closed = true
	delete(l.streams, s.id)
	l.live.Add(-1)
	for _, fd := range []int{s.cfd, s.ufd} {
		// Explicitly, not by close: a descriptor duplicated into a child
		// between fork and exec would keep the registration alive.
		_ = unix.EpollCtl(l.epfd, unix.EPOLL_CTL_DEL, fd, nil)
		_ = unix.Close(fd)
	}
	s.pending = nil
	*ended = append(*ended, s.release)
	if s.done != nil {
		done := s.done
		*ended = append(*ended, func() { done(r) })
	}
}

func (l *Loop) shutdownLocked(ended *[]func()) {
	for _, s := range l.streams {
		l.end(s, Shutdown, ended)
	}
	l.closeEpollLocked()
}

func runEnded(ended []func()) []func() {
	for i, f := range ended {
		f()
		ended[i] = nil
	}
	return ended[:0]
}
