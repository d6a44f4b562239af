package plugins

import (
	"errors"
	"fmt"
	"strings"
)

// Request headers pinnedd sets on every request it hands to a plugin; the
// SDK routes on them and strips them before the instance sees the request.
const (
	HeaderNamespace = "X-Pinned-Namespace"
	HeaderID        = "X-Pinned-Id"
	// HeaderRefusal marks a response refused in-band, by pinnedd or a
	// plugin rather than by instance code; its value says why (Refusal*).
	HeaderRefusal = "X-Pinned-Refusal"
	// HeaderClusterCall marks a request an instance makes through its own
	// node's front door (a cluster call); its value is ClusterCallValue:
	// the calling instance's namespace and its process's cluster-call
	// credential (DescribeRequest.cluster_call_token).
	HeaderClusterCall = "X-Pinned-Cluster-Call"
	// HeaderSocketSecret carries the plugin process's data-socket secret
	// (DescribeRequest.socket_secret) on every request pinnedd writes to
	// the data socket; the SDK refuses a request without it and strips it.
	HeaderSocketSecret = "X-Pinned-Socket-Secret"
)

// ErrClusterCallMalformed: an X-Pinned-Cluster-Call value that is not
// "<namespace> <credential>".
var ErrClusterCallMalformed = errors.New("malformed " + HeaderClusterCall + ": want \"<namespace> <credential>\"")

// ClusterCallValue is the HeaderClusterCall value for a call from an
// instance of namespace ns holding credential token.
func ClusterCallValue(ns, token string) string { return ns + " " + token }

// ParseClusterCall splits a HeaderClusterCall value into the calling
// namespace and the credential. The front door then asks the supervisor
// whether the credential is live and covers that namespace.
func ParseClusterCall(v string) (ns, token string, err error) {
	ns, token, ok := strings.Cut(v, " ")
	if !ok || token == "" || strings.ContainsAny(token, " \t") {
		return "", "", ErrClusterCallMalformed
	}
	if err := ValidateNamespace(ns); err != nil {
		return "", "", fmt.Errorf("%w: %w", ErrClusterCallMalformed, err)
	}
	return ns, token, nil
}

// In-band refusal reasons (HeaderRefusal values), shared by the plugin SDK,
// the supervisor and the front door.
const (
	// RefusalInactive: the plugin does not have the instance (it
	// restarted); pinnedd re-activates it.
	RefusalInactive = "inactive"
	// RefusalDraining, RefusalLeaseUnhealthy and RefusalDegraded (the
	// namespace's plugin crash-loops on that node): the owner takes no new
	// activation; a forwarding front door releases the placement and
	// retries on another worker.
	RefusalDraining       = "draining"
	RefusalLeaseUnhealthy = "lease-unhealthy"
	RefusalDegraded       = "degraded"
	// RefusalNotOwner: the forwarded request named a placement this node
	// does not hold under that generation; the forwarder asks the leader.
	RefusalNotOwner = "not-owner"
	// RefusalAttestation: the owner side did not accept the forwarder's
	// attestation (403): signed for a session the owner no longer or not
	// yet holds (it re-registered a moment ago). Nothing ran; the
	// forwarder asks the leader, as for RefusalNotOwner.
	RefusalAttestation = "attestation"
)
