package relay

import "net"

// A client connection may hold a slot under a connection cap (the front
// door's per-IP and total caps) from its accept until its Close. Closing
// the net.Conn of a socket the loops take would give the slot back while
// the connection lives on, so the loops take the slot with the socket: a
// connection that answers Detach hands its slot over, and the loop calls
// the release it got exactly once, when it closes the client's descriptor
// (or, giving the connection back to net/http, hands the release on to
// the net.Conn it gives back, whose Close calls it).

// detacher is a connection that hands over the slot it holds: from Detach
// on, its Close no longer gives the slot back; the release does, once.
type detacher interface {
	Detach() (release func())
}

// detachSlot takes the slot of c, or of the connection under it (through
// Unwrap, or NetConn as a tls.Conn has), and returns its release; a
// connection that holds none gets one that does nothing. Call it before
// closing c.
func detachSlot(c net.Conn) (release func()) {
	for c != nil {
		if d, ok := c.(detacher); ok {
			if rel := d.Detach(); rel != nil {
				return rel
			}
			break
		}
		switch u := c.(type) {
		case interface{ Unwrap() net.Conn }:
			c = u.Unwrap()
		case interface{ NetConn() net.Conn }:
			c = u.NetConn()
		default:
			c = nil
		}
	}
	return func() {}
}
