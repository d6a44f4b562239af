// Command chat is the chat host as a standalone pinnedd plugin:
//
//	pinnedd agent --dev --plugin /threads=./chat
package main

import (
	"github.com/pinnedd/pinnedd/examples/chat"
	"github.com/pinnedd/pinnedd/plugins/sdk"
)

func main() {
	sdk.Serve(map[string]sdk.Host{chat.Namespace: chat.Host()})
}
