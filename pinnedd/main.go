// Command pinnedd runs durable-object workloads on your own machines: one
// binary per VM, instances addressed by (namespace, id), host code in
// supervised plugin processes. See the README for the quick start.
package main

import "os"

func main() { os.Exit(run(os.Args)) }
