package e2e

import (
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testutil"
)

// A stranger on the fleet's network (no certificate, not a member's address)
// holds more idle connections to every node's cluster port than there are
// handshake slots for strangers, reconnecting as they close. The leader is killed: the
// survivors elect a new one in their usual time.
func TestElectionWhileAStrangerHoldsTheClusterPorts(t *testing.T) {
	t.Parallel()
	nw := testutil.NewNet(t, 3)
	nodes := netnsFleet(t, nw, "--local-state")

	// The hold: holdPerNode connections a node from the test's own address, each
	// reopened 100 ms after it is closed.
	const holdPerNode = 130
	stop := make(chan struct{})
	var wg sync.WaitGroup
	defer func() { close(stop); wg.Wait() }()
	d := &net.Dialer{Timeout: time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(nw.HostIP)}}
	var dialed atomic.Int64
	for _, n := range nodes {
		for range holdPerNode {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					if c, err := d.Dial("tcp", n.raft); err == nil {
						dialed.Add(1)
						go func() { <-stop; c.Close() }()
						_, _ = c.Read(make([]byte, 1)) // until the node closes it
						c.Close()
					}
					select {
					case <-stop:
						return
					case <-time.After(100 * time.Millisecond):
					}
				}
			}()
		}
	}
	testutil.WaitFor(t, 10*time.Second, "the hold in place", func() bool { return dialed.Load() >= 3*holdPerNode })

	var leader *node
	testutil.WaitFor(t, 10*time.Second, "a leader", func() bool {
		h := health(t, nodes[0])
		for _, n := range nodes {
			if h != nil && h["leader"] == n.id {
				leader = n
			}
		}
		return leader != nil
	})
	leader.a.Signal(syscall.SIGKILL)
	if _, err := leader.a.Wait(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	for _, n := range nodes {
		if n == leader {
			continue
		}
		// Elections take a second or two at --raft-timeout 300ms; the hold
		// lasts far longer than this bound.
		testutil.WaitFor(t, 10*time.Second, n.id+" sees a new leader while the stranger holds", func() bool {
			h := health(t, n)
			return h != nil && h["leader"] != "" && h["leader"] != leader.id
		})
	}
	t.Logf("new leader %s after the old one's death, under the hold", time.Since(killed).Round(10*time.Millisecond))
}
