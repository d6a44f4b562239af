package clusterport

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Inbound handshakes on the cluster port. Nothing about a connection is known before its TLS
// handshake but its source address, so that is what admission goes by: connections from a
// current member's address take slots from a pool of their own, sized for a peer's whole
// forwarding pool at once; every other source shares a small pool in which each address may
// hold only a few handshakes, with a shorter deadline. A stranger holding connections open
// (or trickling bytes) can then fill only its own share, never delay a member's reconnect or an
// election.
const (
	// maxMemberHandshakes: the forwarder keeps up to 512 idle connections per peer, so a burst
	// of forwarded requests to one owner may open that many at once.
	maxMemberHandshakes = 1024
	// maxOtherHandshakes and maxSourceHandshakes bound the rest: all of them, and one address.
	maxOtherHandshakes  = 64
	maxSourceHandshakes = 4
	// strangerHandshakeTimeout bounds a handshake (and the first byte of an ALPN-less one) from
	// an address no member has; a member's gets handshakeTimeout.
	strangerHandshakeTimeout = 2 * time.Second
)

// handshakeSlots admits inbound connections to a handshake by source address.
type handshakeSlots struct {
	isMember func(ip string) bool

	mu        sync.Mutex
	members   int
	others    int
	perSource map[string]int
}

func newHandshakeSlots(isMember func(ip string) bool) *handshakeSlots {
	return &handshakeSlots{isMember: isMember, perSource: map[string]int{}}
}

// take admits a handshake from ip, or reports it refused (ok false). release gives the slot
// back; member says which pool it came from.
func (h *handshakeSlots) take(ip string) (release func(), member, ok bool) {
	member = h.isMember != nil && h.isMember(ip)
	h.mu.Lock()
	defer h.mu.Unlock()
	if member {
		if h.members >= maxMemberHandshakes {
			return nil, true, false
		}
		h.members++
		return func() { h.mu.Lock(); h.members--; h.mu.Unlock() }, true, true
	}
	if h.others >= maxOtherHandshakes || h.perSource[ip] >= maxSourceHandshakes {
		return nil, false, false
	}
	h.others++
	h.perSource[ip]++
	return func() {
		h.mu.Lock()
		h.others--
		if h.perSource[ip]--; h.perSource[ip] == 0 {
			delete(h.perSource, ip)
		}
		h.mu.Unlock()
	}, false, true
}

// MemberHosts is the set of IP addresses current members' Raft addresses name (a name is
// resolved, off the caller's path): what handshakeSlots counts as a member's source.
type MemberHosts struct {
	ips atomic.Pointer[map[string]bool]
	gen atomic.Uint64 // the latest set's; an older resolution does not overwrite a newer one
}

// set takes the members' Raft addresses: IP literals at once, names once resolved.
func (m *MemberHosts) Set(addrs []string) {
	gen := m.gen.Add(1)
	ips := map[string]bool{}
	var names []string
	for _, a := range addrs {
		host, _, err := net.SplitHostPort(a)
		if err != nil {
			continue
		}
		if ip := net.ParseIP(host); ip != nil {
			ips[ip.String()] = true
		} else {
			names = append(names, host)
		}
	}
	if len(names) == 0 {
		m.ips.Store(&ips)
		return
	}
	// Until the names are resolved again, what they resolved to before
	// still counts: a member named by host must not drop to the strangers'
	// pool for a lookup's time.
	now := map[string]bool{}
	if prev := m.ips.Load(); prev != nil {
		for ip := range *prev {
			now[ip] = true
		}
	}
	for ip := range ips {
		now[ip] = true
	}
	m.ips.Store(&now)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		all := map[string]bool{}
		for ip := range ips {
			all[ip] = true
		}
		for _, n := range names {
			found, _ := net.DefaultResolver.LookupHost(ctx, n)
			for _, f := range found {
				if ip := net.ParseIP(f); ip != nil {
					all[ip.String()] = true
				}
			}
		}
		if m.gen.Load() == gen {
			m.ips.Store(&all)
		}
	}()
}

// has reports whether ip is a member's address.
func (m *MemberHosts) Has(ip string) bool {
	p := m.ips.Load()
	return p != nil && (*p)[ip]
}

// sourceIP is the IP of a connection's remote address ("" if it has none).
func sourceIP(addr net.Addr) string {
	if tcp, ok := addr.(*net.TCPAddr); ok {
		return tcp.IP.String()
	}
	host, _, err := net.SplitHostPort(addr.String())
	if err != nil {
		return ""
	}
	return host
}
