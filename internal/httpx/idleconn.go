package httpx

import (
	"net"
	"sync/atomic"
	"time"
)

// IdleConn is c, closed once neither its reads nor its writes have moved a byte for idle: the
// bound of an upgraded (101) connection, whose two copies would otherwise wait on a silent
// peer for ever, as a kept-alive connection's idle timeout bounds it between requests. Each
// read and write that moves bytes costs a clock read; a timer looks again when the time could
// be up. idle <= 0: c as it is.
func IdleConn(c net.Conn, idle time.Duration) net.Conn {
	if idle <= 0 {
		return c
	}
	ic := &idleConn{Conn: c, idle: idle}
	ic.touch()
	ic.timer = time.AfterFunc(idle, ic.check)
	return ic
}

type idleConn struct {
	net.Conn
	idle  time.Duration
	last  atomic.Int64 // unix ns of the last byte moved
	timer *time.Timer
}

func (c *idleConn) touch() { c.last.Store(time.Now().UnixNano()) }

func (c *idleConn) check() {
	quiet := time.Since(time.Unix(0, c.last.Load()))
	if quiet >= c.idle {
		_ = c.Conn.Close()
		return
	}
	c.timer.Reset(c.idle - quiet)
}

func (c *idleConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.touch()
	}
	return n, err
}

func (c *idleConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if n > 0 {
		c.touch()
	}
	return n, err
}

func (c *idleConn) Close() error {
	c.timer.Stop()
	return c.Conn.Close()
}

// NetConn is the connection this one bounds.
func (c *idleConn) NetConn() net.Conn { return c.Conn }
