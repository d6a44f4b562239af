package sdnotify

import (
	"fmt"
	"os"
	"testing"
	"time"
)

func TestSendsToAbstractSocket(t *testing.T) {
	// Abstract names are global to the network namespace: make it unique.
	next := listen(t, fmt.Sprintf("@pinnedd-sdnotify-test-%d-%d", os.Getpid(), time.Now().UnixNano()))
	if err := Ready(); err != nil {
		t.Fatal(err)
	}
	if got := next(); got != "READY=1" {
		t.Fatalf("sent %q, want %q", got, "READY=1")
	}
	if err := Stopping(); err != nil {
		t.Fatal(err)
	}
	if got := next(); got != "STOPPING=1" {
		t.Fatalf("sent %q, want %q", got, "STOPPING=1")
	}
}
