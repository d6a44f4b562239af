// Package frontdoor is pinnedd's data plane: everything a request passes
// through on its way to an instance. The router (router.go) takes every
// request a node's HTTP port receives; the resolver says where its
// instance is, or claims a placement for it through the directory; the
// forwarder carries it to the owner on another node, attested; the owner
// side admits what reaches this node's worker and opens the instance in
// the supervisor; around them sit the connection limits, the access log
// and the kept-alive adoption.
//
// It depends on the control plane (package pinboard) for the directory,
// this node's Self (its worker and replica), the tokens and the
// OwnerGate, and it mounts the control plane's API on its mux; pinboard
// does not import it. It is the only package that names the fast path
// (internal/relay).
//
// Requests take one of two paths. net/http's handlers decide everything
// (placement, claims, activation, refusals, attestation failures). A
// connection that carried a plain request to a forwarded or local id then
// moves to the kept-alive loop (routeLoop, internal/relay.Conns), which
// repeats only the decided case without net/http: forward to a live remote
// owner, or carry it to an instance live here (supervisor.Open); anything
// else goes back, unread. DESIGN.md describes the parts and the rules
// each keeps.
package frontdoor
