package plugins

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/pinnedd/pinnedd/plugins/proto"
)

// ProtocolVersion is the plugin protocol version both sides must agree on.
//
// History:
//
//	1: Control service (Describe, Activate, Deactivate, Stats, Health,
//	   Shutdown, Events); instance HTTP over the plugin's unix socket; Data
//	   service (gRPC streaming) kept as the measured alternative; Store
//	   service served by pinnedd over the broker (id in DescribeRequest).
//	2: least privilege. DescribeRequest carries the process's data-socket
//	   secret (every data-socket request must carry it in
//	   HeaderSocketSecret: a plugin refuses any other with 403) and its
//	   cluster-call credential (no longer EnvClusterCallToken). The
//	   environment is an allow-list (AllowedEnv). A version-1 plugin would
//	   serve its socket to anyone, so pinnedd refuses to start it.
//	3: the Data service is gone: a plugin serves Control only, and
//	   instance HTTP reaches it on its data socket alone.
//
// pinnedd speaks ProtocolVersion only and refuses a plugin of any other
// version at the handshake. An older plugin is refused with
// ErrProtocolVersion, naming both versions (see HostVersions); a newer one
// by go-plugin ("incompatible API version").
const ProtocolVersion = 3

// ErrProtocolVersion: the plugin speaks an older protocol version than
// pinnedd; it must be rebuilt with pinnedd's SDK.
var ErrProtocolVersion = errors.New("plugin protocol version mismatch")

// Handshake is shared by pinnedd and every plugin. The cookie is not a
// security measure: it makes a plugin binary run by hand say it must be
// started by pinnedd instead of hanging.
var Handshake = plugin.HandshakeConfig{
	ProtocolVersion:  ProtocolVersion,
	MagicCookieKey:   "PINNEDD_PLUGIN",
	MagicCookieValue: "a2f1c7a4-host-plugin",
}

// PluginName is the single plugin kind a pinnedd plugin binary dispenses.
const PluginName = "host"

// Environment variables pinnedd sets for a plugin process.
const (
	// EnvDataSocket is the unix socket path the plugin must serve instance
	// HTTP on; pinnedd creates its directory with mode 0700.
	EnvDataSocket = "PINNEDD_DATA_SOCKET"
	// EnvParentPID lets the plugin notice it was orphaned before Pdeathsig
	// was armed (the parent died between fork and prctl).
	EnvParentPID = "PINNEDD_PARENT_PID"
	// EnvPluginName tags the plugin's own logs.
	EnvPluginName = "PINNEDD_PLUGIN_NAME"
	// EnvFrontDoor is the URL of the node's own front door, where
	// instances make cluster calls.
	EnvFrontDoor = "PINNEDD_URL"
	// EnvFrontDoorCA holds CA certificates (PEM) that verify an https
	// EnvFrontDoor besides the system roots: the node's --http-tls-ca.
	EnvFrontDoorCA = "PINNEDD_URL_CA"
	// EnvClusterCallToken was protocol 1's cluster-call token, shared by
	// every plugin of a node.
	//
	// Deprecated: the credential is per process and arrives in
	// DescribeRequest.cluster_call_token; pinnedd never passes this
	// variable to a plugin.
	EnvClusterCallToken = "PINNEDD_CLUSTER_CALL_TOKEN"
)

// AllowedEnv names what a plugin inherits from pinnedd's own environment:
// nothing else does (no PINBOARD_*, no DATABASE_URL, no pinnedd secret).
// Names ending in "*" are prefixes. pinnedd adds the variables it sets
// itself (the Env* above, go-plugin's cookie and PLUGIN_* settings) and
// what the operator passes per plugin.
var AllowedEnv = []string{"PATH", "HOME", "LANG", "LC_*", "TZ", "TMPDIR"}

// Allowed reports whether the variable name is in AllowedEnv.
func Allowed(name string) bool {
	for _, a := range AllowedEnv {
		if p, ok := strings.CutSuffix(a, "*"); ok && strings.HasPrefix(name, p) || a == name {
			return true
		}
	}
	return false
}

// ReservedEnv says why the variable name may not be passed to a plugin by
// an operator setting, or "" if it may: PINBOARD_* and DATABASE_URL are
// pinnedd's secrets, PINNEDD_* and PLUGIN_* (and the handshake cookie) are
// set by pinnedd and go-plugin, and systemd's NOTIFY_SOCKET, socket
// activation and credentials belong to the agent.
func ReservedEnv(name string) string {
	switch {
	case SecretEnv(name):
		return "pinnedd's secrets never reach plugins"
	case name == Handshake.MagicCookieKey || strings.HasPrefix(name, "PINNEDD_") || strings.HasPrefix(name, "PLUGIN_"):
		return "set by pinnedd itself"
	}
	switch name {
	case "NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES", "CREDENTIALS_DIRECTORY":
		return "belongs to the pinnedd agent, not its plugins"
	}
	return ""
}

// SecretEnv reports whether the variable holds a pinnedd secret: pinnedd
// drops it from anything it hands a plugin, whoever asked.
func SecretEnv(name string) bool {
	return strings.HasPrefix(name, "PINBOARD_") || name == "DATABASE_URL" || name == EnvClusterCallToken
}

// Server is what a plugin process implements (the SDK does it for host authors).
type Server interface {
	proto.ControlServer
	// SetBroker receives the broker pinnedd's callbacks are dialed through.
	SetBroker(*plugin.GRPCBroker)
}

// HostPlugin is the go-plugin glue for the "host" plugin kind. On the plugin
// side Impl is set; on pinnedd's side it is nil and GRPCClient returns a *Conn.
type HostPlugin struct {
	plugin.NetRPCUnsupportedPlugin
	Impl Server
}

var _ plugin.GRPCPlugin = (*HostPlugin)(nil)

// GRPCServer registers the plugin's services and hands it the broker it
// dials pinnedd's callbacks through.
func (p *HostPlugin) GRPCServer(broker *plugin.GRPCBroker, s *grpc.Server) error {
	proto.RegisterControlServer(s, p.Impl)
	p.Impl.SetBroker(broker)
	return nil
}

// GRPCClient wraps the connection pinnedd uses to talk to one plugin process.
func (p *HostPlugin) GRPCClient(_ context.Context, broker *plugin.GRPCBroker, cc *grpc.ClientConn) (any, error) {
	return &Conn{Control: proto.NewControlClient(cc), Broker: broker}, nil
}

// Conn is pinnedd's handle on one plugin process's services.
type Conn struct {
	Control proto.ControlClient
	// Broker serves pinnedd's callbacks (the Store service) to the plugin.
	Broker *plugin.GRPCBroker
}

// PluginSet is the plugin map both sides pass to go-plugin.
func PluginSet(impl Server) plugin.PluginSet {
	return plugin.PluginSet{PluginName: &HostPlugin{Impl: impl}}
}

// HostVersions is the plugin map pinnedd's go-plugin client offers
// (ClientConfig.VersionedPlugins): the host plugin at ProtocolVersion and,
// at every older version, a stand-in whose dispensing fails with
// ErrProtocolVersion. go-plugin accepts only the versions offered, and its
// own refusal ("incompatible API version") names neither side's meaning;
// offering the older ones lets the handshake finish so the refusal can say
// which version the plugin speaks and which pinnedd does.
func HostVersions() map[int]plugin.PluginSet {
	vs := map[int]plugin.PluginSet{ProtocolVersion: PluginSet(nil)}
	for v := 1; v < ProtocolVersion; v++ {
		vs[v] = plugin.PluginSet{PluginName: outdatedPlugin{version: v}}
	}
	return vs
}

// outdatedPlugin stands for a plugin of an older protocol version: it
// refuses to be dispensed (or served).
type outdatedPlugin struct {
	plugin.NetRPCUnsupportedPlugin
	version int
}

var _ plugin.GRPCPlugin = outdatedPlugin{}

func (o outdatedPlugin) err() error {
	return fmt.Errorf("%w: the plugin speaks plugin protocol %d, this pinnedd speaks %d: rebuild the plugin with this pinnedd's plugins/sdk",
		ErrProtocolVersion, o.version, ProtocolVersion)
}

// GRPCServer implements plugin.GRPCPlugin.
func (o outdatedPlugin) GRPCServer(*plugin.GRPCBroker, *grpc.Server) error { return o.err() }

// GRPCClient implements plugin.GRPCPlugin: the refusal.
func (o outdatedPlugin) GRPCClient(context.Context, *plugin.GRPCBroker, *grpc.ClientConn) (any, error) {
	return nil, o.err()
}
