package httpx

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// A connection that keeps moving bytes, either way, stays open past the idle bound; once it
// goes quiet it is closed, and a read blocked on it ends.
func TestIdleConnClosesOnlyWhenQuiet(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	peer := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			peer <- c
		}
	}()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	other := <-peer
	defer other.Close()
	const idle = time.Second
	c := IdleConn(raw, idle)
	defer c.Close()

	// Writes alone keep it open (a stream the other side only reads).
	for range 15 { // 1.5 bounds' worth, a byte every tenth of one
		if _, err := c.Write([]byte("x")); err != nil {
			t.Fatalf("written to while active, the connection was closed: %v", err)
		}
		time.Sleep(idle / 10)
	}
	// Quiet: a read blocked on it ends, well within a few bounds.
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		_, err := c.Read(make([]byte, 1))
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil || errors.Is(err, io.EOF) {
			t.Fatalf("the read ended with %v, want the connection closed", err)
		}
		if quiet := time.Since(start); quiet < idle/2 {
			t.Fatalf("closed after %v of quiet, before its bound %v", quiet, idle)
		}
	case <-time.After(10 * idle):
		t.Fatal("a quiet connection stayed open")
	}
}
