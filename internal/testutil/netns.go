package testutil

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Net is a private IPv4 network for one test: a bridge in the root network
// namespace and one network namespace per node, each joined to the bridge
// by a veth pair. The test process stays in the root namespace and reaches
// every node through the bridge. Everything is deleted in the test's
// cleanup, which runs after the cleanups of agents started later (those
// stop first).
//
// Cut isolates a node by pinning the neighbour entries of the addresses it
// must not reach to a MAC address nobody has: frames still leave, nobody
// takes them, and nothing is reported to the sender. Packets are dropped
// silently, as on a real partition, rather than refused.
type Net struct {
	t      testing.TB
	Name   string // the bridge; every other name starts with it
	HostIP string // the root namespace's address on the bridge (.254): the test's source address
	AuxIP  string // a second root address (.253) for services the test runs for the nodes

	prefix string // "10.a.b."
	nodes  []string

	mu   sync.Mutex
	cuts map[int][]neigh // node -> entries Cut pinned, for Heal
}

type neigh struct{ ns, ip string }

// bogusMAC is a locally administered unicast address no interface has.
const bogusMAC = "02:00:5e:00:de:ad"

// Names: "pnd" + the test process's pid in hex + "-" + 4 random hex digits
// (the bridge); + node number (a veth's root end); + "-n" + number (a
// namespace). At most 15 characters for links. The pid lets a later run
// remove what a killed test process left behind.
var netName = regexp.MustCompile(`^pnd([0-9a-f]+)-[0-9a-f]{4}`)

// NewNet creates the bridge and n namespaces with addresses prefix.1 ..
// prefix.n on a random 10.x.y.0/24 that no local interface uses. It fails
// the test (never skips) if namespaces cannot be made: the test needs root
// (CAP_NET_ADMIN, CAP_SYS_ADMIN) and iproute2.
func NewNet(t testing.TB, n int) *Net {
	t.Helper()
	if _, err := exec.LookPath("ip"); err != nil {
		t.Fatalf("network namespaces: iproute2's ip command not found (%v); this test needs root and iproute2", err)
	}
	sweepStaleNets(t)

	var rb [2]byte
	_, _ = rand.Read(rb[:])
	nw := &Net{t: t, Name: fmt.Sprintf("pnd%x-%s", os.Getpid(), hex.EncodeToString(rb[:])), cuts: map[int][]neigh{}}
	nw.prefix = freeSubnet(t)
	nw.HostIP, nw.AuxIP = nw.prefix+"254", nw.prefix+"253"
	for i := 1; i <= n; i++ {
		nw.nodes = append(nw.nodes, fmt.Sprintf("%s-n%d", nw.Name, i))
	}
	// Registered first so that a failure half way still removes what was made.
	t.Cleanup(nw.destroy)

	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("network namespaces unavailable: ip %s: %v: %s (this test needs root with CAP_NET_ADMIN/CAP_SYS_ADMIN)",
				strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
	}
	run("link", "add", nw.Name, "type", "bridge")
	run("addr", "add", nw.HostIP+"/24", "dev", nw.Name)
	run("addr", "add", nw.AuxIP+"/24", "dev", nw.Name)
	run("link", "set", nw.Name, "up")
	for i, ns := range nw.nodes {
		veth := fmt.Sprintf("%s%d", nw.Name, i+1)
		run("netns", "add", ns)
		run("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
		run("link", "set", veth, "master", nw.Name, "up")
		run("-n", ns, "addr", "add", nw.IP(i+1)+"/24", "dev", "eth0")
		run("-n", ns, "link", "set", "eth0", "up")
		run("-n", ns, "link", "set", "lo", "up")
	}
	// The bridge forwards once its ports leave the listening state; wait
	// until the root namespace reaches every node (a refused connection
	// is an answer).
	for i := range nw.nodes {
		addr := net.JoinHostPort(nw.IP(i+1), "9")
		err := Eventually(10*time.Second, func() bool {
			c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
			if err == nil {
				c.Close()
				return true
			}
			return strings.Contains(err.Error(), "connection refused")
		})
		if err != nil {
			t.Fatalf("network namespaces: %s not reachable over bridge %s: %v", nw.IP(i+1), nw.Name, err)
		}
	}
	return nw
}

// NS is node i's namespace (1-based).
func (nw *Net) NS(i int) string { return nw.nodes[i-1] }

// IP is node i's address (1-based).
func (nw *Net) IP(i int) string { return nw.prefix + strconv.Itoa(i) }

// Cut stops all traffic between node i and the other nodes, and from node
// i to the root namespace's address AuxIP (services the test runs for the
// nodes, such as a database forwarder). The root namespace's HostIP, the
// test's own address, still reaches node i and hears its answers.
func (nw *Net) Cut(i int) {
	nw.t.Helper()
	var pinned []neigh
	for j := 1; j <= len(nw.nodes); j++ {
		if j == i {
			continue
		}
		pinned = append(pinned, neigh{nw.NS(i), nw.IP(j)}, neigh{nw.NS(j), nw.IP(i)})
	}
	pinned = append(pinned, neigh{nw.NS(i), nw.AuxIP})
	nw.mu.Lock()
	nw.cuts[i] = append(nw.cuts[i], pinned...)
	nw.mu.Unlock()
	for _, n := range pinned {
		if out, err := exec.Command("ip", "-n", n.ns, "neigh", "replace", n.ip, "lladdr", bogusMAC, "dev", "eth0", "nud", "permanent").CombinedOutput(); err != nil {
			nw.t.Fatalf("cut node %d: ip -n %s neigh replace %s: %v: %s", i, n.ns, n.ip, err, out)
		}
	}
}

// Heal undoes Cut(i): the pinned entries go, the kernel resolves the
// addresses again and retransmissions get through.
func (nw *Net) Heal(i int) {
	nw.t.Helper()
	nw.mu.Lock()
	pinned := nw.cuts[i]
	delete(nw.cuts, i)
	nw.mu.Unlock()
	for _, n := range pinned {
		if out, err := exec.Command("ip", "-n", n.ns, "neigh", "del", n.ip, "dev", "eth0").CombinedOutput(); err != nil {
			nw.t.Fatalf("heal node %d: ip -n %s neigh del %s: %v: %s", i, n.ns, n.ip, err, out)
		}
	}
}

func (nw *Net) destroy() {
	var errs []string
	for i, ns := range nw.nodes {
		// Deleting a namespace takes its veth end, and so the pair, with it
		// once no process is left inside; delete the root end explicitly
		// too, in case one is.
		veth := fmt.Sprintf("%s%d", nw.Name, i+1)
		if linkExists(veth) {
			if out, err := exec.Command("ip", "link", "del", veth).CombinedOutput(); err != nil {
				errs = append(errs, fmt.Sprintf("ip link del %s: %v: %s", veth, err, out))
			}
		}
		if nsExists(ns) {
			if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
				errs = append(errs, fmt.Sprintf("ip netns del %s: %v: %s", ns, err, out))
			}
		}
	}
	if linkExists(nw.Name) {
		if out, err := exec.Command("ip", "link", "del", nw.Name).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Sprintf("ip link del %s: %v: %s", nw.Name, err, out))
		}
	}
	if len(errs) > 0 {
		nw.t.Errorf("removing test network %s: %s", nw.Name, strings.Join(errs, "; "))
	}
}

func linkExists(name string) bool {
	_, err := net.InterfaceByName(name)
	return err == nil
}

func nsExists(name string) bool {
	_, err := os.Stat("/run/netns/" + name)
	return err == nil
}

// sweepStaleNets removes namespaces and links of this naming scheme whose
// test process is gone (killed before its cleanup ran).
func sweepStaleNets(t testing.TB) {
	stale := func(name string) bool {
		m := netName.FindStringSubmatch(name)
		if m == nil {
			return false
		}
		pid, err := strconv.ParseInt(m[1], 16, 64)
		return err == nil && pid != int64(os.Getpid()) && !Alive(int(pid))
	}
	if entries, err := os.ReadDir("/run/netns"); err == nil {
		for _, e := range entries {
			if stale(e.Name()) {
				t.Logf("removing stale network namespace %s", e.Name())
				_ = exec.Command("ip", "netns", "del", e.Name()).Run()
			}
		}
	}
	if ifs, err := net.Interfaces(); err == nil {
		for _, ifc := range ifs {
			if stale(ifc.Name) {
				t.Logf("removing stale link %s", ifc.Name)
				_ = exec.Command("ip", "link", "del", ifc.Name).Run()
			}
		}
	}
}

// freeSubnet picks 10.a.b. (a in 64..127) that no local address or route
// of the root namespace falls in.
func freeSubnet(t testing.TB) string {
	t.Helper()
	var used []*net.IPNet
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				used = append(used, n)
			}
		}
	}
	if out, err := exec.Command("ip", "-j", "-4", "route", "show", "table", "all").Output(); err == nil {
		var routes []struct {
			Dst string `json:"dst"`
		}
		if json.Unmarshal(out, &routes) == nil {
			for _, r := range routes {
				if _, n, err := net.ParseCIDR(r.Dst); err == nil && r.Dst != "0.0.0.0/0" {
					used = append(used, n)
				}
			}
		}
	}
	for range 100 {
		a, _ := rand.Int(rand.Reader, big.NewInt(64))
		b, _ := rand.Int(rand.Reader, big.NewInt(256))
		_, cand, _ := net.ParseCIDR(fmt.Sprintf("10.%d.%d.0/24", 64+a.Int64(), b.Int64()))
		clash := false
		for _, u := range used {
			if u.Contains(cand.IP) || cand.Contains(u.IP) {
				clash = true
				break
			}
		}
		if !clash {
			return fmt.Sprintf("10.%d.%d.", 64+a.Int64(), b.Int64())
		}
	}
	t.Fatal("network namespaces: no free 10.x.y.0/24 subnet")
	return ""
}

// StartAgentIn is LaunchAgentIn followed by WaitReady.
func StartAgentIn(t testing.TB, ns string, env []string, args ...string) *Agent {
	t.Helper()
	a := LaunchAgentIn(t, ns, env, args...)
	if err := a.WaitReady(30 * time.Second); err != nil {
		t.Fatalf("pinnedd in %s not ready: %v\n%s", ns, err, a.Logs())
	}
	return a
}

// LaunchAgentIn is LaunchAgent inside network namespace ns: `ip netns exec
// ns pinnedd agent ...`. ip execs pinnedd in place, so the process is
// pinnedd itself (its pid is the one its plugins carry), stopped and checked
// in cleanup like any other agent. args must set --http-addr to an address
// of the namespace.
func LaunchAgentIn(t testing.TB, ns string, env []string, args ...string) *Agent {
	t.Helper()
	if !hasFlag(args, "--http-addr") {
		t.Fatal("LaunchAgentIn: args must set --http-addr (an address inside the namespace)")
	}
	full := append([]string{"netns", "exec", ns, Bin(t, "pinnedd")}, agentArgs(args)...)
	return launch(t, exec.Command("ip", full...), env, "pinnedd in "+ns)
}

// ForwardTCP listens on listen (host:port, port 0 for any) and pipes every
// connection to target; it returns the address it listens on. Nodes in a
// Net reach a service of the root namespace's loopback (Postgres) through
// it. The cleanup closes the listener and every piped connection.
func ForwardTCP(t testing.TB, listen, target string) string {
	t.Helper()
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		t.Fatalf("forwarder: listen %s: %v", listen, err)
	}
	var (
		mu     sync.Mutex
		conns  = map[net.Conn]struct{}{}
		closed bool
		wg     sync.WaitGroup
	)
	track := func(c net.Conn) bool {
		mu.Lock()
		defer mu.Unlock()
		if closed {
			c.Close()
			return false
		}
		conns[c] = struct{}{}
		return true
	}
	untrack := func(c net.Conn) {
		mu.Lock()
		delete(conns, c)
		mu.Unlock()
		c.Close()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			if !track(in) {
				continue
			}
			out, err := net.DialTimeout("tcp", target, 5*time.Second)
			if err != nil || !track(out) {
				untrack(in)
				if out != nil {
					untrack(out)
				}
				continue
			}
			wg.Add(2)
			pipe := func(dst, src net.Conn) {
				defer wg.Done()
				_, _ = io.Copy(dst, src)
				untrack(dst)
				untrack(src)
			}
			go pipe(out, in)
			go pipe(in, out)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		closed = true
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}
