package e2e

import (
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testutil"
	"github.com/pinnedd/pinnedd/statewire/client"
)

// Statewire's rules against loss and for authority, on a real pinnedd
// (--dev) and its chat host, as an outside client sees them: no command is
// acknowledged and then dropped (a seq gap, a message id already taken),
// and a client cancels only its own run.
func TestStatewireRules(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "data")
	a := testutil.StartAgent(t, chatEnv, "--dev", "--data-dir", dir, "--http-addr", testutil.FreeAddr(t))
	ctx := t.Context()

	sendFrame := func(seq int, id, text string) string {
		idField := ""
		if id != "" {
			idField = `"id":"` + id + `",`
		}
		return `{"seq":` + strconv.Itoa(seq) + `,"type":"send","message":{` + idField + `"parts":[{"type":"text","text":"` + text + `"}]}}`
	}
	post := func(c *client.Client, frames ...string) (client.FramesResponse, *client.HTTPError) {
		t.Helper()
		r, err := c.PostFrames(ctx, []byte(`{"clientId":"`+c.ID()+`","frames":[`+strings.Join(frames, ",")+`]}`))
		if err == nil {
			return r, nil
		}
		var he *client.HTTPError
		if !asHTTPError(err, &he) {
			t.Fatalf("POST frames: %v", err)
		}
		return r, he
	}
	idle := func(want string) func(chatThread) bool {
		return func(th chatThread) bool { return th.status() == "idle" && th.line() == want }
	}

	// Seq 1, then 5: the 5 is refused (409 naming 2) and so is 3, nothing
	// of them admitted; 2 and 3 in order are then admitted and shown.
	// Before the rule, 5 was acked and 3 acked as a duplicate, never shown.
	t.Run("SeqGapIsRefused", func(t *testing.T) {
		c := client.New(a.URL + "/threads/gap")
		s := c.Attach(ctx)
		defer s.Close()
		if r, he := post(c, sendFrame(1, "", "one")); he != nil || r.Acked != 1 {
			t.Fatalf("seq 1: %+v %v", r, he)
		}
		for _, seq := range []int{5, 3} {
			r, he := post(c, sendFrame(seq, "", "lost"))
			if he == nil || he.Code != http.StatusConflict || !strings.Contains(he.Message, "skips 2") {
				t.Fatalf("seq %d after 1: %+v %v, want 409 naming seq 2", seq, r, he)
			}
		}
		if r, he := post(c, sendFrame(2, "", "two"), sendFrame(3, "", "three")); he != nil || r.Acked != 3 || r.Admitted != 2 {
			t.Fatalf("seqs 2, 3: %+v %v", r, he)
		}
		waitThread(t, s, 30*time.Second, "every acknowledged send shown",
			idle("user: one | assistant: echo: one | user: two | user: three | assistant: echo: three"))
	})

	// A message id another client already used (shown, or admitted and
	// waiting for its run) is refused with 409 and a message saying so:
	// acked, it would never be shown. The refused seq is free for the
	// client's next frame.
	t.Run("DuplicateMessageIDIsRefused", func(t *testing.T) {
		alice, bob := client.New(a.URL+"/threads/dupid"), client.New(a.URL+"/threads/dupid")
		s := alice.Attach(ctx)
		defer s.Close()
		if r, he := post(alice, sendFrame(1, "m-1", "first")); he != nil || r.Admitted != 1 {
			t.Fatalf("alice m-1: %+v %v", r, he)
		}
		waitThread(t, s, 30*time.Second, "alice's reply", idle("user: first | assistant: echo: first"))
		r, he := post(bob, sendFrame(1, "m-1", "second"))
		if he == nil || he.Code != http.StatusConflict || !strings.Contains(he.Message, `message id "m-1" is already used`) {
			t.Fatalf("bob reuses a shown id: %+v %v, want 409 saying the id is used", r, he)
		}
		// Alice's next message waits behind her reply in progress, admitted
		// but not yet in the document: its id is taken all the same.
		long := strings.Repeat("w ", 100)
		if r, he := post(alice, sendFrame(2, "m-2", long)); he != nil || r.Admitted != 1 {
			t.Fatalf("alice m-2: %+v %v", r, he)
		}
		waitThread(t, s, 30*time.Second, "m-2's reply streams", func(th chatThread) bool {
			return len(th.transcript()) == 4 && streamedWords(th.line()) >= 1
		})
		if r, he := post(alice, sendFrame(3, "m-3", "queued")); he != nil || r.Admitted != 1 {
			t.Fatalf("alice m-3: %+v %v", r, he)
		}
		if r, he := post(bob, sendFrame(1, "m-3", "mine")); he == nil || he.Code != http.StatusConflict {
			t.Fatalf("bob reuses an admitted id: %+v %v, want 409", r, he)
		}
		if r, he := post(bob, sendFrame(1, "b-1", "mine")); he != nil || r.Acked != 1 || r.Admitted != 1 {
			t.Fatalf("bob's next frame with a new id, same seq: %+v %v", r, he)
		}
		// Every acknowledged message is shown once, with its own text.
		th := waitThread(t, s, 60*time.Second, "every message answered", func(th chatThread) bool {
			return th.status() == "idle" && len(th.transcript()) == 8
		})
		for id, text := range map[string]string{"m-1": "first", "m-2": strings.TrimSpace(long), "m-3": "queued", "b-1": "mine"} {
			if m, ok := th.Messages.Messages[id]; !ok || m.text() != text {
				t.Fatalf("message %s: %+v, want %q; thread %q", id, m, text, th.line())
			}
		}
	})

	// Bob's cancel does not stop Alice's reply: it streams to its last
	// word. Alice's own cancel stops hers.
	t.Run("OnlyTheSenderCancels", func(t *testing.T) {
		alice, bob := client.New(a.URL+"/threads/authority"), client.New(a.URL+"/threads/authority")
		s := alice.Attach(ctx)
		defer s.Close()
		long := strings.Repeat("word ", 100)
		if _, err := alice.Send(ctx, "send", map[string]any{"message": map[string]any{"parts": []any{map[string]any{"type": "text", "text": long}}}}); err != nil {
			t.Fatal(err)
		}
		waitThread(t, s, 20*time.Second, "streaming", func(th chatThread) bool { return streamedWords(th.line()) >= 3 })
		if _, err := bob.Send(ctx, "cancel", nil); err != nil {
			t.Fatalf("bob's cancel: %v", err)
		}
		th := waitThread(t, s, 30*time.Second, "idle", func(th chatThread) bool { return th.status() == "idle" })
		if want := "user: " + strings.TrimSpace(long) + " | assistant: " + echoOf(long); th.line() != want {
			t.Fatalf("bob's cancel cut alice's reply at %d words", streamedWords(th.line()))
		}
		if _, err := alice.Send(ctx, "send", map[string]any{"message": map[string]any{"parts": []any{map[string]any{"type": "text", "text": long}}}}); err != nil {
			t.Fatal(err)
		}
		waitThread(t, s, 20*time.Second, "streaming again", func(th chatThread) bool {
			return len(th.transcript()) == 4 && streamedWords(th.line()) >= 3
		})
		if _, err := alice.Send(ctx, "cancel", nil); err != nil {
			t.Fatal(err)
		}
		th = waitThread(t, s, 30*time.Second, "idle after alice's cancel", func(th chatThread) bool { return th.status() == "idle" })
		if n := streamedWords(th.line()); n >= 101 {
			t.Fatalf("alice's cancel did not stop her reply (%d words)", n)
		}
	})
}
