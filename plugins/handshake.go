package plugins

import (
	"context"

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
const ProtocolVersion = 1

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
	// EnvFrontDoor is the URL of the node's own front door, and
	// EnvClusterCallToken the token that marks a request to it as a
	// cluster call from one of its instances.
	EnvFrontDoor        = "PINNEDD_URL"
	EnvClusterCallToken = "PINNEDD_CLUSTER_CALL_TOKEN"
)

// Server is what a plugin process implements (the SDK does it for host authors).
type Server interface {
	proto.ControlServer
	proto.DataServer
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
	proto.RegisterDataServer(s, p.Impl)
	p.Impl.SetBroker(broker)
	return nil
}

// GRPCClient wraps the connection pinnedd uses to talk to one plugin process.
func (p *HostPlugin) GRPCClient(_ context.Context, broker *plugin.GRPCBroker, cc *grpc.ClientConn) (any, error) {
	return &Conn{Control: proto.NewControlClient(cc), Data: proto.NewDataClient(cc), Broker: broker}, nil
}

// Conn is pinnedd's handle on one plugin process's services.
type Conn struct {
	Control proto.ControlClient
	Data    proto.DataClient
	// Broker serves pinnedd's callbacks (the Store service) to the plugin.
	Broker *plugin.GRPCBroker
}

// PluginSet is the plugin map both sides pass to go-plugin.
func PluginSet(impl Server) plugin.PluginSet {
	return plugin.PluginSet{PluginName: &HostPlugin{Impl: impl}}
}
