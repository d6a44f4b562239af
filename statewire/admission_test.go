package statewire_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/storegrpc"
	"github.com/pinnedd/pinnedd/internal/testutil"
	"github.com/pinnedd/pinnedd/plugins"
	"github.com/pinnedd/pinnedd/plugins/proto"
	"github.com/pinnedd/pinnedd/plugins/sdk"
	"github.com/pinnedd/pinnedd/statestore"
	"github.com/pinnedd/pinnedd/statestore/faulty"
	"github.com/pinnedd/pinnedd/statestore/memstore"
	"github.com/pinnedd/pinnedd/statewire"
)

const (
	threadNS = "/threads"
	clientID = "c1"
)

var threadKey = statestore.InstanceKey{Namespace: threadNS, ID: "t1"}

// activation is one process's activation of /threads/t1 with a Statewire
// server over real HTTP: a runtime as a plugin runs it, trays in the store
// behind client. Its "say" commands run until the instance stops, so what
// it admitted stays pending in the tray (a run in progress).
type activation struct {
	rt  *sdk.Runtime
	srv *httptest.Server
}

func activate(t *testing.T, client proto.StoreClient, gen uint64, adjust ...func(*statewire.Config)) *activation {
	t.Helper()
	host := sdk.Host{
		New: func(inst *sdk.Instance) (http.Handler, error) {
			cfg := statewire.Config{
				Initial:  map[string]any{},
				Commands: map[string]statewire.CommandSpec{"say": {Run: true}},
				Run: func(ctx context.Context, rc *statewire.RunContext) error {
					<-ctx.Done()
					return ctx.Err()
				},
			}
			for _, f := range adjust {
				f(&cfg)
			}
			return statewire.New(inst, cfg)
		},
		Trays: statewire.Trays(),
	}
	rt, err := sdk.NewRuntime(map[string]sdk.Host{threadNS: host}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	rt.UseStore(client)
	t.Cleanup(rt.Close)
	if _, err := rt.Activate(t.Context(), &proto.ActivateRequest{Namespace: threadNS, Id: threadKey.ID, Generation: gen}); err != nil {
		t.Fatal(err)
	}
	// Requests reach the instance as pinnedd sends them, through the
	// runtime: its output gate, and whatever activation it holds now.
	a := &activation{rt: rt, srv: httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Header.Set(plugins.HeaderNamespace, threadNS)
		r.Header.Set(plugins.HeaderID, threadKey.ID)
		rt.ServeHTTP(w, r)
	}))}
	t.Cleanup(a.srv.Close)
	return a
}

type framesAnswer struct {
	code       int
	resp       statewire.FramesResponse
	body       string
	retryAfter string
	err        error
}

// post sends POST /frames with "say" frames for seqs, within d.
func (a *activation) post(t *testing.T, d time.Duration, seqs ...int64) framesAnswer {
	t.Helper()
	return a.postText(t, d, "m", seqs...)
}

// postText is post with text (and the seq) in each frame.
func (a *activation) postText(t *testing.T, d time.Duration, text string, seqs ...int64) framesAnswer {
	t.Helper()
	var frames []map[string]any
	for _, s := range seqs {
		frames = append(frames, map[string]any{"seq": s, "type": "say", "text": fmt.Sprint(text, s)})
	}
	b, _ := json.Marshal(map[string]any{"clientId": clientID, "frames": frames})
	ctx, cancel := context.WithTimeout(t.Context(), d)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "POST", a.srv.URL+"/frames", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return framesAnswer{err: err}
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	ans := framesAnswer{code: resp.StatusCode, body: string(body), retryAfter: resp.Header.Get("Retry-After")}
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(body, &ans.resp); err != nil {
			t.Fatalf("frames answer %s: %v", body, err)
		}
	}
	return ans
}

// storedSeqs is the seqs of the client's command items in the store.
func storedSeqs(t *testing.T, store statestore.Store, gen uint64) []int64 {
	t.Helper()
	trays, err := store.Load(t.Context(), threadKey, gen)
	if err != nil {
		t.Fatal(err)
	}
	var seqs []int64
	for _, tr := range trays {
		if tr.Key != (statestore.TrayKey{NS: statewire.CommandTray, ID: clientID}) {
			continue
		}
		for _, it := range tr.Items {
			var c struct{ Seq int64 }
			if err := json.Unmarshal(it.Payload, &c); err != nil {
				t.Fatal(err)
			}
			seqs = append(seqs, c.Seq)
		}
	}
	return seqs
}

var appendsCommands = func(muts []statestore.Mutation) bool {
	return faulty.Touches(muts, statewire.CommandTray, faulty.Appends)
}

// Frames are acknowledged only once the commit that stores them returned:
// while it is held, no answer comes; once it is let go, the answer acks
// them.
func TestFramesAnsweredOnlyAfterTheirCommit(t *testing.T) {
	store := faulty.New(memstore.New())
	gate := faulty.NewGate()
	store.SetHook(func(ctx context.Context, _ statestore.InstanceKey, _ uint64, muts []statestore.Mutation) error {
		if appendsCommands(muts) {
			return gate.Wait(ctx)
		}
		return nil
	})
	a := activate(t, storegrpc.Client(t, store), 5)
	t.Cleanup(gate.Open) // first: a failed test must not leave the commit held

	answered := make(chan framesAnswer, 1)
	go func() { answered <- a.post(t, 20*time.Second, 1, 2) }()
	select {
	case <-gate.Entered():
	case ans := <-answered:
		t.Fatalf("answered before the commit was even tried: %+v", ans)
	case <-time.After(10 * time.Second):
		t.Fatal("the admission's commit never reached the store")
	}
	// The commit is held: nothing the server does can make the frames
	// durable now, so any answer in this window acknowledged too early.
	// (The window bounds how long a wrong answer is waited for; a right
	// server cannot fail it.)
	select {
	case ans := <-answered:
		t.Fatalf("answered while the commit was held: %+v", ans)
	case <-time.After(300 * time.Millisecond):
	}
	if got := storedSeqs(t, store, 5); len(got) != 0 {
		t.Fatalf("stored %v while the commit was held", got)
	}
	gate.Open()
	ans := <-answered
	if ans.code != http.StatusOK || ans.resp.Acked != 2 || ans.resp.Admitted != 2 || ans.resp.Duplicates != 0 {
		t.Fatalf("after the commit: %+v", ans)
	}
	if got := storedSeqs(t, store, 5); !slices.Equal(got, []int64{1, 2}) {
		t.Fatalf("stored %v, want [1 2]", got)
	}
}

// A commit that fails leaves the high-water mark where it was: the frames
// are not acknowledged, not by the failing request nor by a retry that
// would count them as duplicates. The failed commit resets the instance
// from the store; once the store is back, the retry admits them, each seq
// stored once.
func TestFailedAppendDoesNotAdvanceHighWater(t *testing.T) {
	store := faulty.New(memstore.New())
	errDown := errors.New("store down")
	store.SetHook(func(_ context.Context, _ statestore.InstanceKey, _ uint64, muts []statestore.Mutation) error {
		if appendsCommands(muts) {
			return errDown
		}
		return nil
	})
	a := activate(t, storegrpc.Client(t, store), 5)

	for i := range 3 {
		ans := a.post(t, 2*time.Second, 1, 2)
		if ans.err == nil && ans.code == http.StatusOK {
			t.Fatalf("attempt %d while every append fails: acknowledged %+v", i, ans)
		}
		if ans.err == nil && (ans.code != http.StatusServiceUnavailable || ans.retryAfter != "1") {
			t.Fatalf("attempt %d while every append fails: %d (Retry-After %q) %s, want 503 + Retry-After: 1", i, ans.code, ans.retryAfter, ans.body)
		}
	}
	if got := storedSeqs(t, store, 5); len(got) != 0 {
		t.Fatalf("stored %v while every append failed", got)
	}

	store.SetHook(nil)
	var ans framesAnswer
	testutil.WaitFor(t, 20*time.Second, "frames acknowledged once the store is back", func() bool {
		ans = a.post(t, 5*time.Second, 1, 2, 3)
		return ans.err == nil && ans.code == http.StatusOK
	})
	if ans.resp.Acked != 3 || ans.resp.Admitted+ans.resp.Duplicates != 3 {
		t.Fatalf("after the store came back: %+v", ans)
	}
	if got := storedSeqs(t, store, 5); !slices.Equal(got, []int64{1, 2, 3}) {
		t.Fatalf("stored %v, want each seq once: [1 2 3]", got)
	}
}

// A process that stored a client's commands but died before the write of
// its admitted mark (a separate, later commit) leaves the commands pending
// in the tray: the next activation must count them as admitted, so the
// client's resend is answered as duplicates and nothing is stored twice.
func TestHighWaterCountsPendingItemsAfterACrash(t *testing.T) {
	mem := memstore.New()
	store := faulty.New(mem)
	store.SetHook(func(_ context.Context, _ statestore.InstanceKey, gen uint64, muts []statestore.Mutation) error {
		if gen == 5 && faulty.Touches(muts, statewire.CommandTray, faulty.SetsField("admitted")) {
			return errors.New("the process died before this write")
		}
		return nil
	})
	client := storegrpc.Client(t, store)
	first := activate(t, client, 5)
	if ans := first.post(t, 10*time.Second, 1, 2); ans.code != http.StatusOK || ans.resp.Acked != 2 || ans.resp.Admitted != 2 {
		t.Fatalf("first activation: %+v", ans)
	}
	trays, err := mem.Load(t.Context(), threadKey, 5)
	if err != nil {
		t.Fatal(err)
	}
	for _, tr := range trays {
		if _, ok := tr.Fields["admitted"]; ok {
			t.Fatalf("the admitted mark was stored: the crash this test needs did not happen")
		}
	}

	// Another process takes the id over (its load fences the first).
	second := activate(t, client, 6)
	ans := second.post(t, 10*time.Second, 1, 2)
	if ans.code != http.StatusOK || ans.resp.Acked != 2 || ans.resp.Admitted != 0 || ans.resp.Duplicates != 2 {
		t.Fatalf("resend to the next activation: %+v, want 2 duplicates, none admitted", ans)
	}
	if ans := second.post(t, 10*time.Second, 2, 3); ans.code != http.StatusOK || ans.resp.Acked != 3 || ans.resp.Admitted != 1 || ans.resp.Duplicates != 1 {
		t.Fatalf("next frame: %+v", ans)
	}
	if got := storedSeqs(t, store, 6); !slices.Equal(got, []int64{1, 2, 3}) {
		t.Fatalf("stored %v, want [1 2 3]", got)
	}
}

// A frame the store can never take (bigger than a stored value may be,
// under a MaxBody that lets it in) is the client's to fix: 413 with the
// reason, nothing stored, and the high-water mark where it was, so the
// next frame with that seq is admitted.
func TestFrameTooLargeToStoreIsRefusedAndChangesNothing(t *testing.T) {
	store := memstore.New()
	a := activate(t, storegrpc.Client(t, store), 5, func(c *statewire.Config) { c.MaxBody = 4 << 20 })
	ans := a.postText(t, 10*time.Second, strings.Repeat("x", statestore.MaxValueLen), 1)
	if ans.code != http.StatusRequestEntityTooLarge || !strings.Contains(ans.body, "frames not admitted") || ans.retryAfter != "" {
		t.Fatalf("oversized frame: %d %s, want 413 saying why", ans.code, ans.body)
	}
	if got := storedSeqs(t, store, 5); len(got) != 0 {
		t.Fatalf("stored %v", got)
	}
	if ans := a.post(t, 10*time.Second, 1); ans.code != http.StatusOK || ans.resp.Admitted != 1 || ans.resp.Acked != 1 {
		t.Fatalf("the same seq, small: %+v", ans)
	}
}

// postAs sends POST /frames for client with the given raw frames.
func (a *activation) postAs(t *testing.T, client string, frames ...string) framesAnswer {
	t.Helper()
	b := []byte(`{"clientId":"` + client + `","frames":[` + strings.Join(frames, ",") + `]}`)
	resp, err := http.Post(a.srv.URL+"/frames", "application/json", bytes.NewReader(b))
	if err != nil {
		return framesAnswer{err: err}
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	ans := framesAnswer{code: resp.StatusCode, body: string(body)}
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(body, &ans.resp); err != nil {
			t.Fatalf("frames answer %s: %v", body, err)
		}
	}
	return ans
}

// A frame whose seq skips one never admitted is refused (409 naming the
// next seq) and admits nothing: acknowledging it would move the mark past
// the missing seq, whose frame would later be counted a duplicate and
// dropped while the client was told it was handled.
func TestSeqGapIsRefusedAndAdmitsNothing(t *testing.T) {
	store := memstore.New()
	a := activate(t, storegrpc.Client(t, store), 5)
	if ans := a.post(t, 10*time.Second, 1); ans.code != http.StatusOK || ans.resp.Acked != 1 {
		t.Fatalf("seq 1: %+v", ans)
	}
	for _, tc := range []struct {
		seqs     []int64
		expected int64
	}{{[]int64{5}, 2}, {[]int64{3}, 2}, {[]int64{2, 4}, 3}, {[]int64{1, 3}, 2}} {
		seqs := tc.seqs
		ans := a.post(t, 10*time.Second, seqs...)
		var body struct {
			Error    string
			Expected int64
		}
		_ = json.Unmarshal([]byte(ans.body), &body)
		if ans.code != http.StatusConflict || body.Expected != tc.expected || !strings.Contains(body.Error, "next seq") {
			t.Fatalf("seqs %v after 1: %d %s, want 409 expecting %d", seqs, ans.code, ans.body, tc.expected)
		}
	}
	if got := storedSeqs(t, store, 5); !slices.Equal(got, []int64{1}) {
		t.Fatalf("stored %v after refused gaps, want [1]", got)
	}
	ans := a.post(t, 10*time.Second, 1, 2, 3)
	if ans.code != http.StatusOK || ans.resp.Acked != 3 || ans.resp.Admitted != 2 || ans.resp.Duplicates != 1 {
		t.Fatalf("seqs 1-3: %+v", ans)
	}
	if got := storedSeqs(t, store, 5); !slices.Equal(got, []int64{1, 2, 3}) {
		t.Fatalf("stored %v, want [1 2 3]", got)
	}
	// The bound is 2^53-1 (exact in a JSON number in every language).
	for _, seq := range []string{"9007199254740992", "1152921504606846976", "18446744073709551616"} {
		ans := a.postAs(t, "big", `{"seq":`+seq+`,"type":"say","text":"x"}`)
		if ans.code != http.StatusBadRequest || !strings.Contains(ans.body, "9007199254740991") {
			t.Fatalf("seq %s: %d %s, want 400 naming the bound", seq, ans.code, ans.body)
		}
	}
}

// A cancel stops only the runs of the client that sent it: another
// client's cancel is admitted and changes nothing; the owner's own cancel
// stops its run, and one sent while its batch waits behind another
// client's run stops that batch before it starts.
func TestCancelStopsOnlyTheSendersRun(t *testing.T) {
	type event struct {
		client  string
		stopped bool
	}
	started := make(chan string, 4)
	ended := make(chan event, 4)
	a := activate(t, storegrpc.Client(t, memstore.New()), 5, func(c *statewire.Config) {
		c.Run = func(ctx context.Context, rc *statewire.RunContext) error {
			started <- rc.ClientID
			select {
			case <-rc.StopRequested():
				ended <- event{rc.ClientID, true}
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	})
	say := `{"seq":1,"type":"say","text":"x"}`
	if ans := a.postAs(t, "alice", say); ans.code != http.StatusOK {
		t.Fatalf("alice say: %+v", ans)
	}
	if got := recv(t, started); got != "alice" {
		t.Fatalf("run of %s started, want alice", got)
	}
	if ans := a.postAs(t, "bob", say); ans.code != http.StatusOK {
		t.Fatalf("bob say: %+v", ans)
	}
	if ans := a.postAs(t, "bob", `{"seq":2,"type":"cancel"}`); ans.code != http.StatusOK || ans.resp.Admitted != 1 {
		t.Fatalf("bob cancel: %+v", ans)
	}
	// Bob's cancel stopped his own queued batch, not alice's run: nothing
	// ends until alice cancels, then her run ends stopped, and bob's
	// starts already stopped.
	select {
	case e := <-ended:
		t.Fatalf("bob's cancel ended %s's run", e.client)
	case <-time.After(300 * time.Millisecond):
	}
	if ans := a.postAs(t, "alice", `{"seq":2,"type":"cancel"}`); ans.code != http.StatusOK {
		t.Fatalf("alice cancel: %+v", ans)
	}
	if e := recv(t, ended); e != (event{"alice", true}) {
		t.Fatalf("first end %+v, want alice stopped", e)
	}
	if got := recv(t, started); got != "bob" {
		t.Fatalf("then %s started, want bob", got)
	}
	if e := recv(t, ended); e != (event{"bob", true}) {
		t.Fatalf("then %+v, want bob stopped (his cancel came while he waited)", e)
	}
}

func recv[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatal("nothing within 10s")
		panic("unreachable")
	}
}

// The limits are inclusive: MaxFrames frames in one request and a seq of
// MaxSeq are taken (MaxSeq as a first seq is a gap, 409, not a bad seq);
// one more of either is a 400 saying what to fix.
func TestFrameLimitsAreInclusive(t *testing.T) {
	a := activate(t, storegrpc.Client(t, memstore.New()), 5)
	var seqs []int64
	for s := int64(1); s <= statewire.MaxFrames+1; s++ {
		seqs = append(seqs, s)
	}
	if ans := a.post(t, 10*time.Second, seqs...); ans.code != http.StatusBadRequest || !strings.Contains(ans.body, "at most") {
		t.Fatalf("%d frames: %d %s, want 400", len(seqs), ans.code, ans.body)
	}
	if ans := a.post(t, 10*time.Second, seqs[:statewire.MaxFrames]...); ans.code != http.StatusOK || ans.resp.Admitted != statewire.MaxFrames {
		t.Fatalf("%d frames: %+v", statewire.MaxFrames, ans)
	}
	if ans := a.post(t, 10*time.Second, statewire.MaxSeq+1); ans.code != http.StatusBadRequest || !strings.Contains(ans.body, "seq must be") {
		t.Fatalf("seq MaxSeq+1: %d %s, want 400", ans.code, ans.body)
	}
	if ans := a.post(t, 10*time.Second, statewire.MaxSeq); ans.code == http.StatusBadRequest {
		t.Fatalf("seq MaxSeq refused as invalid: %s", ans.body)
	}
}

// The admitted mark outlives the items: a process that stored commands but
// died before writing the mark leaves them pending; the next activation
// runs and settles them, and must write the mark before the items go, or
// a resend after that would be admitted (and run) again.
func TestAdmittedMarkOutlivesSettledItems(t *testing.T) {
	store := faulty.New(memstore.New())
	store.SetHook(func(_ context.Context, _ statestore.InstanceKey, gen uint64, muts []statestore.Mutation) error {
		if gen == 5 && faulty.Touches(muts, statewire.CommandTray, faulty.SetsField("admitted")) {
			return errors.New("the process died before this write")
		}
		return nil
	})
	client := storegrpc.Client(t, store)
	first := activate(t, client, 5)
	if ans := first.post(t, 10*time.Second, 1, 2); ans.code != http.StatusOK || ans.resp.Admitted != 2 {
		t.Fatalf("first activation: %+v", ans)
	}
	// The next activation's runs finish at once: its items settle.
	second := activate(t, client, 6, func(c *statewire.Config) {
		c.Run = func(context.Context, *statewire.RunContext) error { return nil }
	})
	testutil.WaitFor(t, 10*time.Second, "the redelivered commands settled", func() bool {
		return len(storedSeqs(t, store, 6)) == 0
	})
	if ans := second.post(t, 10*time.Second, 1, 2); ans.code != http.StatusOK || ans.resp.Admitted != 0 || ans.resp.Duplicates != 2 || ans.resp.Acked != 2 {
		t.Fatalf("resend after the settle: %+v, want 2 duplicates", ans)
	}
}

// A resend of frames below the mark (all duplicates) leaves the mark where
// it was: it never moves back, so a later resend of what lies between is
// still a duplicate, never admitted (and run) twice.
func TestHighWaterNeverMovesBack(t *testing.T) {
	store := memstore.New()
	a := activate(t, storegrpc.Client(t, store), 5)
	if ans := a.post(t, 10*time.Second, 1, 2, 3); ans.code != http.StatusOK || ans.resp.Acked != 3 {
		t.Fatalf("first: %+v", ans)
	}
	if ans := a.post(t, 10*time.Second, 1, 2); ans.code != http.StatusOK || ans.resp.Acked != 3 || ans.resp.Duplicates != 2 {
		t.Fatalf("resend of 1-2: %+v, want acked 3 and 2 duplicates", ans)
	}
	if ans := a.post(t, 10*time.Second, 3); ans.code != http.StatusOK || ans.resp.Duplicates != 1 || ans.resp.Admitted != 0 {
		t.Fatalf("resend of 3: %+v, want a duplicate", ans)
	}
	if got := storedSeqs(t, store, 5); !slices.Equal(got, []int64{1, 2, 3}) {
		t.Fatalf("stored %v, want [1 2 3]", got)
	}
}

// Client ids that come and go leave no state once their dedup window has
// passed: each client's tray (its dedup mark) is deleted once nothing of it
// is pending. Within the window a resent frame is a duplicate; after it the
// client is new again and starts from seq 1.
func TestIdleClientsAreForgotten(t *testing.T) {
	store := memstore.New()
	const window = 300 * time.Millisecond
	stopped := make(chan bool, 100) // each run of anon-2: was it told to stop?
	a := activate(t, storegrpc.Client(t, store), 5, func(cfg *statewire.Config) {
		cfg.Run = func(_ context.Context, rc *statewire.RunContext) error {
			if rc.ClientID == "anon-2" {
				stopped <- rc.Stopping()
			}
			return nil
		}
		cfg.DedupWindow = window
	})
	const n = 20
	for i := range n {
		if ans := a.postAs(t, fmt.Sprint("anon-", i), `{"seq":1,"type":"say"}`); ans.code != http.StatusOK || ans.resp.Admitted != 1 {
			t.Fatalf("client %d: %+v", i, ans)
		}
	}
	if ans := a.postAs(t, "anon-0", `{"seq":1,"type":"say"}`); ans.code != http.StatusOK || ans.resp.Duplicates != 1 {
		t.Fatalf("a resend within the window: %+v, want a duplicate", ans)
	}
	<-stopped
	if ans := a.postAs(t, "anon-2", `{"seq":2,"type":"cancel"}`); ans.code != http.StatusOK || ans.resp.Admitted != 1 {
		t.Fatalf("cancel: %+v", ans)
	}
	clientTrays := func() int {
		trays, err := store.Load(t.Context(), threadKey, 5)
		if err != nil {
			t.Fatal(err)
		}
		k := 0
		for _, tr := range trays {
			if tr.Key.NS == statewire.CommandTray {
				k++
			}
		}
		return k
	}
	if k := clientTrays(); k != n {
		t.Fatalf("%d client trays after %d clients, want %d", k, n, n)
	}
	testutil.WaitFor(t, 10*time.Second, "every client's tray deleted", func() bool { return clientTrays() == 0 })
	if ans := a.postAs(t, "anon-1", `{"seq":2,"type":"say"}`); ans.code != http.StatusConflict || !strings.Contains(ans.body, `"expected":1`) {
		t.Fatalf("a forgotten client's next seq: %d %s, want 409 expecting 1", ans.code, ans.body)
	}
	if ans := a.postAs(t, "anon-1", `{"seq":1,"type":"say"}`); ans.code != http.StatusOK || ans.resp.Admitted != 1 {
		t.Fatalf("a forgotten client starting over: %+v", ans)
	}
	// Its old cancel (seq 2) went with its mark: the new seq 1 runs.
	if ans := a.postAs(t, "anon-2", `{"seq":1,"type":"say"}`); ans.code != http.StatusOK || ans.resp.Admitted != 1 {
		t.Fatalf("anon-2 starting over: %+v", ans)
	}
	select {
	case s := <-stopped:
		if s {
			t.Fatal("a forgotten client's new run was stopped by the cancel it sent before")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("anon-2's new run never ran")
	}
}
