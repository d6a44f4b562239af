//go:build linux

package relay

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Upstream connections: the pool per owner address, non-blocking connects, and closing.

// upstreamFor takes a pooled connection for key, or connects one (nil
// and why if it cannot).
func (l *Conns) upstreamFor(key poolKey) (*upstream, error) {
	if us := l.idle[key]; len(us) > 0 {
		// An emptied list stays, with its room, for the connection's
		// return; the sweep deletes lists left empty.
		u := us[len(us)-1]
		us[len(us)-1] = nil
		l.idle[key] = us[:len(us)-1]
		u.reused = true
		return u, nil
	}
	return l.dial(key)
}

// dial connects a new upstream connection for key (nil and why if it cannot); a
// TLS one starts its handshake (tls_linux.go).
func (l *Conns) dial(key poolKey) (*upstream, error) {
	family, sa, err := sockaddr(key.addr)
	if err != nil {
		return nil, err
	}
	fd, err := connect(family, sa)
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", key.addr, err)
	}
	u := &upstream{fd: fd, key: key, id: l.newIDLocked()}
	if key.tls != nil {
		if err := l.startHandshake(u); err != nil {
			_ = unix.Close(fd)
			return nil, fmt.Errorf("tls handshake with %s: %w", key.addr, err)
		}
		l.ups[u.id] = u
		return u, nil
	}
	if err := l.ctl(unix.EPOLL_CTL_ADD, fd, unix.EPOLLIN|unix.EPOLLOUT|unix.EPOLLRDHUP|unix.EPOLLET, u.id, sideU); err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("epoll: %w", err)
	}
	l.ups[u.id] = u
	return u, nil
}

// sockaddr is addr as the kernel takes it: a unix socket's path (any
// address with a '/', absolute or relative to the working directory, as
// net.Dial("unix") takes it), else an IP literal and a port.
func sockaddr(addr string) (family int, sa unix.Sockaddr, err error) {
	if strings.Contains(addr, "/") {
		return unix.AF_UNIX, &unix.SockaddrUnix{Name: addr}, nil
	}
	ip, port, ok := ipPort(addr)
	if !ok {
		return 0, nil, fmt.Errorf("%q is neither a unix socket path nor an IP literal and a port", addr)
	}
	if ip4 := ip.To4(); ip4 != nil {
		s := &unix.SockaddrInet4{Port: port}
		copy(s.Addr[:], ip4)
		return unix.AF_INET, s, nil
	}
	s := &unix.SockaddrInet6{Port: port}
	copy(s.Addr[:], ip.To16())
	return unix.AF_INET6, s, nil
}

// connect starts a non-blocking connection; the request is queued on it
// at once and goes out when it is established (EPOLLOUT), and a refused
// connection shows as a failed write or read. A unix listener whose
// backlog is full (EAGAIN) counts as unreachable.
func connect(family int, sa unix.Sockaddr) (int, error) {
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	if family != unix.AF_UNIX {
		_ = unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
	}
	if err := unix.Connect(fd, sa); err != nil && !errors.Is(err, unix.EINPROGRESS) {
		_ = unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// quiet reports whether u, pooled, has nothing to read and is still open.
func (u *upstream) quiet() bool {
	if u.tls != nil {
		return u.tls.quiet()
	}
	return quiet(u.fd)
}

// pool keeps u for the next request to its address.
func (l *Conns) pool(u *upstream) {
	if l.draining {
		l.closeUp(u)
		return
	}
	u.c, u.in, u.out, u.idleAt = nil, u.in[:0], nil, time.Now()
	if cap(u.in) > readBuf {
		u.in = nil
	}
	l.idle[u.key] = append(l.idle[u.key], u)
}

func (l *Conns) dropIdle(u *upstream) {
	us := l.idle[u.key]
	for i, x := range us {
		if x == u {
			l.idle[u.key] = append(us[:i], us[i+1:]...)
			break
		}
	}
	if len(l.idle[u.key]) == 0 {
		delete(l.idle, u.key)
	}
	l.closeUp(u)
}

func (l *Conns) closeUp(u *upstream) {
	if u.fd < 0 {
		return
	}
	if u.tls != nil && u.tls.abandon() {
		// Its handshake goroutine holds the descriptor, and closes it.
		u.fd = -1
		delete(l.ups, u.id)
		return
	}
	_ = unix.EpollCtl(l.epfd, unix.EPOLL_CTL_DEL, u.fd, nil)
	_ = unix.Close(u.fd)
	u.fd = -1
	delete(l.ups, u.id)
}

// quiet reports whether fd has nothing to read and is still open.
func quiet(fd int) bool {
	var b [1]byte
	for {
		_, _, err := unix.Recvfrom(fd, b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EAGAIN):
			return true
		}
		return false // bytes, EOF or an error
	}
}
