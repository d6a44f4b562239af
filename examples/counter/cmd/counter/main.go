// Command counter is the counter host as a standalone pinnedd plugin:
//
//	pinnedd agent --dev --no-builtin --plugin /counters=./counter
package main

import (
	"github.com/pinnedd/pinnedd/examples/counter"
	"github.com/pinnedd/pinnedd/plugins/sdk"
)

func main() {
	sdk.Serve(map[string]sdk.Host{counter.Namespace: counter.Host()})
}
