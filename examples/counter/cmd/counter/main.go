// Command counter is the counter host as a standalone pinnedd plugin; under
// --dev it takes /counters over from the built-in host:
//
//	pinnedd agent --dev --plugin /counters=./counter
package main

import (
	"github.com/pinnedd/pinnedd/examples/counter"
	"github.com/pinnedd/pinnedd/plugins/sdk"
)

func main() {
	sdk.Serve(map[string]sdk.Host{counter.Namespace: counter.Host()})
}
