package clusterport

import "testing"

// A node the configuration just dropped is known as having left (its refused connections are
// routine) for departedGrace; a node that was never a member is not.
func TestMemberCacheKnowsWhoLeft(t *testing.T) {
	cfg := func(ids ...string) []Server {
		var c []Server
		for _, id := range ids {
			c = append(c, Server{ID: id, Addr: id + ":8300"})
		}
		return c
	}
	var c memberCache
	c.set(cfg("n1", "n2", "n3"))
	c.set(cfg("n1", "n2"))
	if !c.leftWithin("n3", departedGrace) {
		t.Fatal("n3, just removed, has not left")
	}
	if c.leftWithin("n3", 0) || c.leftWithin("stranger", departedGrace) || c.leftWithin("n1", departedGrace) {
		t.Fatal("left: past its grace, a stranger, or a member")
	}
	c.set(nil) // a node not yet joined reads no configuration: nobody left
	if c.leftWithin("n1", departedGrace) {
		t.Fatal("an empty configuration made n1 leave")
	}
}
