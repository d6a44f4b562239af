// Package examples lists the example hosts built into pinnedd: --dev serves
// them by re-executing the pinnedd binary as a plugin process.
package examples

import (
	"github.com/pinnedd/pinnedd/examples/chat"
	"github.com/pinnedd/pinnedd/examples/counter"
	"github.com/pinnedd/pinnedd/examples/ticker"
	"github.com/pinnedd/pinnedd/plugins/sdk"
)

// Builtin returns the built-in hosts by namespace.
func Builtin() map[string]sdk.Host {
	return map[string]sdk.Host{
		counter.Namespace: counter.Host(),
		ticker.Namespace:  ticker.Host(),
		chat.Namespace:    chat.Host(),
	}
}
