//go:build !linux

package relay

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"time"
)

// Conns is a stand-in where there is no event loop: Adopt refuses, and
// connections stay with net/http.
type Conns struct{}

// NewConns returns a loop that takes no connections.
func NewConns(*slog.Logger, Router, func(net.Conn), time.Duration) *Conns { return &Conns{} }

// SetClientLimits does nothing.
func (l *Conns) SetClientLimits(ClientLimits) {}

// Len is always 0.
func (l *Conns) Len() int { return 0 }

// Served is always 0.
func (l *Conns) Served() int64 { return 0 }

// HandedBack is always 0.
func (l *Conns) HandedBack() int64 { return 0 }

// Adopt returns ErrUnsupported; the connection is not touched.
func (l *Conns) Adopt(net.Conn, []byte) error { return ErrUnsupported }

// Drain does nothing.
func (l *Conns) Drain() {}

// Idle is always 0 here.
func (l *Conns) Idle() int { return 0 }

// Shutdown does nothing.
func (l *Conns) Shutdown(context.Context) error { return nil }

// Close does nothing.
func (l *Conns) Close() error { return nil }

// Ticket names an exchange; there are none here.
type Ticket struct{}

// Abort does nothing.
func (Ticket) Abort() {}

// ServerTLS is tls.Server: there is no loop to adopt the connection.
func ServerTLS(raw net.Conn, cfg *tls.Config) (*tls.Conn, error) { return tls.Server(raw, cfg), nil }
