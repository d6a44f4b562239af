package clusterport

import (
	"crypto/tls"
	"net"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testutil"
)

// A stranger that holds connections open to the cluster port, sending nothing, can take only
// its own address's few handshake slots, each for the strangers' short deadline: a member's
// connection (from a member's address) and another address's are handshaken at once all the
// while.
func TestStrangersCannotStarveMembersHandshakes(t *testing.T) {
	ca := testutil.NewCA(t, "cluster")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	const memberIP, attackerIP, otherIP = "127.0.0.2", "127.0.0.3", "127.0.0.4"
	st := New(ln, ln.Addr(), testutil.Identity(t, ca, "server"), Options{Admit: func(string) error { return nil },
		MemberHost: func(ip string) bool { return ip == memberIP }, Logger: testLogger()})
	defer st.Close()
	go func() {
		for {
			c, err := st.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	from := func(ip string) *net.Dialer {
		return &net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	}

	// The attacker opens 200 connections and says nothing.
	var held []net.Conn
	for range 200 {
		c, err := from(attackerIP).Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	defer func() {
		for _, c := range held {
			_ = c.Close()
		}
	}()
	// While it holds them, a member and another address are handshaken at once.
	for _, ip := range []string{memberIP, otherIP} {
		id := testutil.Identity(t, ca, "n-"+ip)
		d := &tls.Dialer{NetDialer: from(ip), Config: id.ClientConfig(ALPNRaft)}
		c, err := d.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatalf("a handshake from %s while a stranger holds 200 idle connections: %v", ip, err)
		}
		_ = c.Close()
	}
	// All but the attacker's share were closed at once; its share within the strangers'
	// deadline.
	closed := 0
	for _, c := range held {
		_ = c.SetReadDeadline(time.Now().Add(strangerHandshakeTimeout + 5*time.Second))
		if _, err := c.Read(make([]byte, 1)); err != nil && !isTimeout(err) {
			closed++
		}
	}
	if closed != len(held) {
		t.Fatalf("%d of the attacker's %d idle connections still open past the strangers' deadline", len(held)-closed, len(held))
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}
