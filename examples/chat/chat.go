// Package chat is the README's durable echo chat, as a
// pinnedd host built on statewire: each id under /threads is a thread whose
// transcript lives in the tray ("log", "~") field "messages", and whose
// replies echo the user's words one at a time.
//
//	POST /threads/t1/stream   snapshot + ops (statewire)
//	POST /threads/t1/frames   {"clientId":"c1","frames":[{"seq":1,"type":"send","message":{"parts":[{"type":"text","text":"hi"}]}}]}
//
// The assistant message is stored before its reply streams, the streamed
// text only at the end: a reply cut off by a crash restarts from its first
// word under the same message id. It is built into pinnedd (--dev) and also
// builds as a plugin of its own: go build ./examples/chat/cmd/chat.
package chat

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/pinnedd/pinnedd/plugins/sdk"
	"github.com/pinnedd/pinnedd/statewire"
)

// Namespace the chat host is served under.
const Namespace = "/threads"

// DefaultWordDelay is the reply's pace: one word every 50 ms.
const DefaultWordDelay = 50 * time.Millisecond

// EnvWordDelay overrides the pace (a Go duration), so tests can stream a
// long reply quickly. pinnedd passes its environment to plugins.
const EnvWordDelay = "CHAT_WORD_DELAY"

// main is the id of the one branch and the one thread of a conversation.
const mainBranch = "main"

// Options tune the host.
type Options struct {
	WordDelay time.Duration
	KeepAlive time.Duration
}

// Host builds the chat host with the pace from CHAT_WORD_DELAY.
func Host() sdk.Host {
	opts := Options{WordDelay: DefaultWordDelay}
	if v := os.Getenv(EnvWordDelay); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			slog.Warn("ignoring bad "+EnvWordDelay, "value", v)
		} else {
			opts.WordDelay = d
		}
	}
	return HostWith(opts)
}

// HostWith builds the chat host with explicit options.
func HostWith(opts Options) sdk.Host {
	return sdk.Host{
		New: func(inst *sdk.Instance) (http.Handler, error) { return newThread(inst, opts) },
		// The command pools' handler; the log tray admits no work items.
		Trays: statewire.Trays(),
	}
}

// Message is one transcript entry.
type Message struct {
	ID       string  `json:"id"`
	Role     string  `json:"role"`
	ParentID *string `json:"parentId"`
	Parts    []Part  `json:"parts"`
}

// Part is a piece of a message; only text parts exist here.
type Part struct {
	Type  string `json:"type"`
	Text  string `json:"text"`
	State string `json:"state,omitempty"`
}

// Messages is the stored transcript: every message by id, and the head of
// the main branch; parent links give the order.
type Messages struct {
	MainBranchID string `json:"mainBranchId"`
	Branches     map[string]struct {
		HeadID *string `json:"headId"`
	} `json:"branches"`
	Messages map[string]Message `json:"messages"`
}

type thread struct {
	inst *sdk.Instance
	log  *sdk.Tray
	srv  *statewire.Server
	opts Options
	// reserved maps the message ids of admitted sends to "client/seq":
	// until its run shows it, an id is taken only here.
	reserved map[string]string
}

func newThread(inst *sdk.Instance, opts Options) (http.Handler, error) {
	t := &thread{inst: inst, log: inst.Tray("log", "~"), opts: opts, reserved: map[string]string{}}
	var msgs Messages
	found, err := t.log.Get("messages", &msgs)
	if err != nil {
		return nil, fmt.Errorf("restore transcript: %w", err)
	}
	if !found || msgs.Messages == nil {
		msgs = Messages{MainBranchID: mainBranch, Messages: map[string]Message{}}
		msgs.Branches = map[string]struct {
			HeadID *string `json:"headId"`
		}{mainBranch: {}}
	}
	status := "idle"
	if m := transcript(msgs); len(m) > 0 {
		// A reply cut off by a crash (or a turn admitted but not answered)
		// is about to be redelivered: say so from the first snapshot, so a
		// client does not take the thread for finished.
		last := m[len(m)-1]
		if last.Role == "user" || len(last.Parts) > 0 && last.Parts[0].State == "streaming" {
			status = "streaming"
		}
	}
	t.srv, err = statewire.New(inst, statewire.Config{
		Initial: map[string]any{
			"messages": msgs,
			"threads":  map[string]any{mainBranch: map[string]any{"status": status}},
		},
		Commands:  map[string]statewire.CommandSpec{"send": {Validate: validateSend, Run: true}},
		Run:       t.run,
		Admit:     t.admit,
		KeepAlive: opts.KeepAlive,
	})
	if err != nil {
		return nil, err
	}
	// Sends a previous activation admitted and did not run keep their ids.
	for _, c := range t.srv.Pending() {
		if f, err := decodeSend(c.Frame); err == nil && c.Type == "send" {
			t.reserved[messageID(f, c)] = fmt.Sprintf("%s/%d", c.ClientID, c.Seq)
		}
	}
	return t.srv, nil
}

// transcript follows the parent links back from the main branch's head.
func transcript(m Messages) []Message {
	var out []Message
	head := m.Branches[m.MainBranchID].HeadID
	for id := head; id != nil; {
		msg, ok := m.Messages[*id]
		if !ok || len(out) > len(m.Messages) {
			break
		}
		out = append(out, msg)
		id = msg.ParentID
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out
}

var idPattern = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,100}$`)

// sendFrame is the send command: the user's message. Every level is
// decoded strictly: a field the host does not know is refused, never
// silently dropped.
type sendFrame struct {
	Seq     json.RawMessage `json:"seq"`
	Type    string          `json:"type"`
	Message *struct {
		ID    string `json:"id"`
		Role  string `json:"role"`
		Parts []struct {
			Type string  `json:"type"`
			Text *string `json:"text"`
		} `json:"parts"`
	} `json:"message"`
}

const maxText = 32 << 10

func decodeSend(frame json.RawMessage) (sendFrame, error) {
	var f sendFrame
	dec := json.NewDecoder(bytes.NewReader(frame))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return f, fmt.Errorf("send: %w (a send frame has seq, type and message{id, role, parts[{type, text}]})", err)
	}
	switch m := f.Message; {
	case m == nil:
		return f, errors.New("missing message")
	case m.ID != "" && !idPattern.MatchString(m.ID):
		return f, errors.New("message id must be 1-100 characters of A-Z a-z 0-9 . _ : -")
	case m.Role != "" && m.Role != "user":
		return f, errors.New(`message role must be "user"`)
	case len(m.Parts) == 0:
		return f, errors.New("message has no parts")
	}
	n := 0
	for i, p := range f.Message.Parts {
		if p.Type != "text" {
			return f, fmt.Errorf("part %d: unsupported part type %q (only \"text\")", i, p.Type)
		}
		if p.Text == nil {
			return f, fmt.Errorf("part %d: text part without \"text\"", i)
		}
		n += len(*p.Text)
	}
	if n > maxText {
		return f, fmt.Errorf("message text over %d bytes", maxText)
	}
	return f, nil
}

func validateSend(frame json.RawMessage) error {
	_, err := decodeSend(frame)
	return err
}

// messageID is the id a send's user message gets: its own, or one made of
// the client id and seq.
func messageID(f sendFrame, c statewire.Command) string {
	if f.Message.ID != "" {
		return f.Message.ID
	}
	return fmt.Sprintf("u-%s-%d", c.ClientID, c.Seq)
}

// admit refuses a send whose message id is taken, by a message of the
// thread or by a send admitted but not run yet (statewire serializes the
// calls): once acknowledged, such a message would never be shown.
func (t *thread) admit(cmds []statewire.Command) error {
	mine := map[string]string{}
	for _, c := range cmds {
		if c.Type != "send" {
			continue
		}
		f, err := decodeSend(c.Frame)
		if err != nil {
			return err
		}
		id := messageID(f, c)
		owner := fmt.Sprintf("%s/%d", c.ClientID, c.Seq)
		var shown bool
		_ = t.srv.Doc().View(func(tx *statewire.Tx) error {
			_, shown = tx.Lookup(msgPath(id))
			return nil
		})
		if o, taken := t.reserved[id]; shown || taken && o != owner || mine[id] != "" {
			return fmt.Errorf("message id %q is already used in this thread; send the message with a new id (or none: the server makes one)", id)
		}
		mine[id] = owner
	}
	for id, owner := range mine {
		t.reserved[id] = owner
	}
	return nil
}

var (
	pathMessages = statewire.Path{"messages"}
	pathStatus   = statewire.Path{"threads", mainBranch, "status"}
)

func msgPath(id string, rest ...any) statewire.Path {
	return append(statewire.Path{"messages", "messages", id}, rest...)
}

// appendMessage links m under the branch head, unless a message with its id
// exists already (a send redelivered before its run was marked applied).
func (t *thread) appendMessage(m Message) error {
	return t.srv.Doc().Update(func(tx *statewire.Tx) error {
		if _, ok := tx.Lookup(msgPath(m.ID)); ok {
			return nil
		}
		var head *string
		if _, err := tx.Get(statewire.Path{"messages", "branches", mainBranch, "headId"}, &head); err != nil {
			return err
		}
		m.ParentID = head
		if err := tx.Set(msgPath(m.ID), m); err != nil {
			return err
		}
		return tx.Set(statewire.Path{"messages", "branches", mainBranch, "headId"}, m.ID)
	})
}

// persist writes the transcript through to the log tray.
func (t *thread) persist() error {
	var raw json.RawMessage
	err := t.srv.Doc().View(func(tx *statewire.Tx) error {
		var err error
		raw, err = tx.Raw(pathMessages)
		return err
	})
	if err != nil {
		return err
	}
	return t.log.Set("messages", raw)
}

func (t *thread) messages() (Messages, error) {
	var m Messages
	err := t.srv.Doc().View(func(tx *statewire.Tx) error {
		_, err := tx.Get(pathMessages, &m)
		return err
	})
	return m, err
}

// run answers a batch of send commands: store the user messages, mark the
// batch applied, store the assistant message, then stream the echo.
func (t *thread) run(ctx context.Context, rc *statewire.RunContext) error {
	for _, c := range rc.Commands {
		f, err := decodeSend(c.Frame)
		if err != nil {
			return fmt.Errorf("send %s/%d: %w", c.ClientID, c.Seq, err)
		}
		id := messageID(f, c)
		parts := make([]Part, len(f.Message.Parts))
		for i, p := range f.Message.Parts {
			parts[i] = Part{Type: "text", Text: *p.Text, State: "done"}
		}
		if err := t.appendMessage(Message{ID: id, Role: "user", Parts: parts}); err != nil {
			return err
		}
	}
	if err := t.persist(); err != nil {
		return err
	}
	if err := rc.Applied(ctx); err != nil {
		return err
	}
	msgs, err := t.messages()
	if err != nil {
		return err
	}
	conv := transcript(msgs)
	var user *Message
	for i := len(conv) - 1; i >= 0 && user == nil; i-- {
		if conv[i].Role == "user" {
			user = &conv[i]
		}
	}
	if user == nil {
		return errors.New("a run without a user message")
	}
	// A reply stored whole before the process died (its batch not yet
	// settled) is finished: say so, do not stream it again.
	if last := conv[len(conv)-1]; last.Role == "assistant" && len(last.Parts) > 0 && last.Parts[0].State == "done" {
		if err := t.srv.Doc().Set(pathStatus, "idle"); err != nil {
			return err
		}
		return t.persist()
	}
	if err := t.srv.Doc().Set(pathStatus, "streaming"); err != nil {
		return err
	}
	// Reuse the assistant message of an interrupted reply; otherwise
	// create one and store it before a single word streams.
	var replyID string
	if last := conv[len(conv)-1]; last.Role == "assistant" {
		replyID = last.ID
	} else {
		replyID = "a-" + randomID()
		if err := t.appendMessage(Message{ID: replyID, Role: "assistant",
			Parts: []Part{{Type: "text", Text: "", State: "streaming"}}}); err != nil {
			return err
		}
	}
	err = t.srv.Doc().Update(func(tx *statewire.Tx) error {
		if err := tx.Set(msgPath(replyID, "parts", 0, "text"), ""); err != nil {
			return err
		}
		return tx.Set(msgPath(replyID, "parts", 0, "state"), "streaming")
	})
	if err != nil {
		return err
	}
	// No word leaves before the assistant message is stored: the output
	// gate holds every frame written after this write until it is.
	if err := t.persist(); err != nil {
		return err
	}

	words := []string{"echo:"}
	for _, p := range user.Parts {
		words = append(words, strings.Fields(p.Text)...)
	}
	timer := time.NewTimer(t.opts.WordDelay)
	defer timer.Stop()
	textPath := msgPath(replyID, "parts", 0, "text")
stream:
	for i, w := range words {
		if i > 0 {
			w = " " + w
		}
		select {
		case <-ctx.Done():
			// Evicted or crashed: the batch stays queued and the reply
			// restarts on the next activation.
			return ctx.Err()
		case <-rc.StopRequested():
			break stream
		case <-timer.C:
		}
		if err := t.srv.Doc().AppendText(textPath, w); err != nil {
			return err
		}
		timer.Reset(t.opts.WordDelay)
	}
	// The finished reply is durable before any client sees the thread
	// idle (the gate holds the "idle" frame behind this write): a crash
	// after "idle" never brings the reply back to stream again.
	if err := t.srv.Doc().Set(msgPath(replyID, "parts", 0, "state"), "done"); err != nil {
		return err
	}
	if err := t.persist(); err != nil {
		return err
	}
	if err := t.srv.Doc().Set(pathStatus, "idle"); err != nil {
		return err
	}
	return t.persist()
}

func randomID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
