package clusterport

import (
	"maps"
	"sync"
	"sync/atomic"
	"time"
)

// departedGrace is how long a node that left the configuration is known as having just left.
const departedGrace = 30 * time.Second

// memberCache is the latest configuration's members (id -> cluster address) for the
// per-connection and per-request checks and PeerAddr: replaced on every committed
// configuration, and read again from the log on a miss, at most once a second.
type memberCache struct {
	log    Log // set by Attach; nil before
	cur    atomic.Pointer[map[string]string]
	mu     sync.Mutex
	readAt time.Time
	// hosts are the members' addresses' IPs, for admission to a handshake (handshakeSlots).
	hosts MemberHosts

	leftMu sync.Mutex
	left   map[string]time.Time // nodes a configuration dropped, and when (for departedGrace)
}

// lookup is id's address, re-reading the configuration on a miss (reread); none says the
// configuration read holds no server at all (a node waiting to be joined).
func (c *memberCache) lookup(id string) (addr string, ok, none bool) {
	if m := c.cur.Load(); m != nil {
		if addr, ok = (*m)[id]; ok {
			return addr, true, false
		}
	}
	m := c.reread()
	addr, ok = m[id]
	return addr, ok, m != nil && len(m) == 0
}

// reread reads the configuration from the log, unless that was done less than a second ago.
func (c *memberCache) reread() map[string]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if m := c.cur.Load(); m != nil && time.Since(c.readAt) < time.Second {
		return *m
	}
	c.readAt = time.Now()
	if c.log == nil {
		return nil
	}
	servers, err := c.log.Configuration()
	if err != nil {
		return nil
	}
	c.set(servers)
	return *c.cur.Load()
}

// set records servers as the members, and when a node the previous members held left.
func (c *memberCache) set(servers []Server) {
	m := make(map[string]string, len(servers))
	addrs := make([]string, 0, len(servers))
	for _, srv := range servers {
		m[srv.ID] = srv.Addr
		addrs = append(addrs, srv.Addr)
	}
	if prev := c.cur.Load(); prev != nil && maps.Equal(*prev, m) {
		return // the same members (a refused peer's check re-reads them): nothing left, nothing to resolve
	}
	c.hosts.Set(addrs)
	c.leftMu.Lock()
	defer c.leftMu.Unlock()
	now := time.Now()
	for id, at := range c.left {
		if now.Sub(at) > departedGrace {
			delete(c.left, id)
		}
	}
	if prev := c.cur.Swap(&m); prev != nil && len(m) > 0 {
		for id := range *prev {
			if _, still := m[id]; !still {
				if c.left == nil {
					c.left = map[string]time.Time{}
				}
				c.left[id] = now
			}
		}
	}
}

// leftWithin: a configuration dropped node less than d ago.
func (c *memberCache) leftWithin(node string, d time.Duration) bool {
	c.leftMu.Lock()
	defer c.leftMu.Unlock()
	at, ok := c.left[node]
	return ok && time.Since(at) < d
}
