package frontdoor

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testdir"

	"github.com/pinnedd/pinnedd/internal/testutil"
	"github.com/pinnedd/pinnedd/pinboard/directory"
	"github.com/pinnedd/pinnedd/plugins"
)

// The id segment is unescaped once and the decoded id validated; rest
// stays as the client escaped it.
func TestParseInstancePath(t *testing.T) {
	for path, want := range map[string][3]string{
		"/threads/a%3Ab/x":       {"/threads", "a:b", "/x"},
		"/threads/a:b/x":         {"/threads", "a:b", "/x"},
		"/threads/a%3ab":         {"/threads", "a:b", "/"},
		"/threads/u%40host/a%2F": {"/threads", "u@host", "/a%2F"},
		"/threads/plain":         {"/threads", "plain", "/"},
	} {
		ns, id, rest, err := parseInstancePath(path)
		if err != nil || [3]string{ns, id, rest} != want {
			t.Errorf("parse(%q) = %q %q %q %v, want %q", path, ns, id, rest, err, want)
		}
	}
	for path, want := range map[string]string{
		"/threads/a%2Fb/x": "escaped '/' (%2F) is not allowed",
		"/threads/a%2fb":   "escaped '/' (%2F) is not allowed",
		"/threads/a%zzb":   "malformed %-escape",
		"/threads/a%25b":   "character '%' not allowed",
		"/threads/%2Ex":    "starts with '.'",
		"/threads//x":      "empty",
	} {
		_, _, _, err := parseInstancePath(path)
		if !errors.Is(err, plugins.ErrInvalidID) || !strings.Contains(err.Error(), want) {
			t.Errorf("parse(%q) = %v, want an invalid id saying %q", path, err, want)
		}
	}
	for _, path := range []string{"/_x/a", "/Bad/a", "counters/a"} {
		if _, _, _, err := parseInstancePath(path); !errors.Is(err, plugins.ErrInvalidNamespace) {
			t.Errorf("parse(%q) = %v, want an invalid namespace", path, err)
		}
	}
}

// An owner-side path names the env of its instance in hostname-aware
// mode: ownerPath writes it, parseOwnerPath reads it back; a bad env
// segment is an invalid path.
func TestOwnerPathEnv(t *testing.T) {
	for _, k := range []directory.Key{
		{Namespace: "/counters", ID: "a"},
		{Env: "pr-41.preview.example.com", Namespace: "/counters", ID: "a"},
		{Env: "Staging_2", Namespace: "/chat", ID: "u@host"},
	} {
		path := ownerPath(ownerRoutePrefix, k)
		env, ns, id, rest, err := parseOwnerPath(strings.TrimPrefix(path, ownerRoutePrefix) + "/x")
		if err != nil || (directory.Key{Env: env, Namespace: ns, ID: id}) != k || rest != "/x" {
			t.Errorf("%+v: %s read back as %q %q %q %q %v", k, path, env, ns, id, rest, err)
		}
	}
	for _, path := range []string{"/~/counters/a", "/~bad env/counters/a", "/~a%2Fb/counters/a", "/~staging"} {
		if _, _, _, _, err := parseOwnerPath(path); !errors.Is(err, plugins.ErrInvalidNamespace) {
			t.Errorf("parseOwnerPath(%q) = %v, want an invalid path", path, err)
		}
	}
}

// A client's encodeURIComponent id reaches the instance decoded, with its
// relative path as sent; an encoded '/' is a clear 400 and activates
// nothing.
func TestEscapedIDServedDecoded(t *testing.T) {
	rig, _ := hostRig(t)
	code, body, _ := rig.call(t, "GET", "/misc/a%3Ab/some/path?q=1", "", "")
	var seen struct{ ID, Path, Query string }
	if err := json.Unmarshal([]byte(body), &seen); code != http.StatusOK || err != nil {
		t.Fatalf("GET /misc/a%%3Ab: %d %s", code, body)
	}
	if seen.ID != "a:b" || seen.Path != "/some/path" || seen.Query != "q=1" {
		t.Errorf("instance saw %+v", seen)
	}
	// The same instance under its unescaped spelling.
	if _, ok := rig.m.Placement(directory.Key{Namespace: "/misc", ID: "a:b"}); !ok {
		t.Error("no placement for /misc/a:b")
	}
	code, body, _ = rig.call(t, "GET", "/misc/a%2Fb/x", "", "")
	if code != http.StatusBadRequest || !strings.Contains(testutil.ErrorOf(t, body), "%2F") {
		t.Errorf("GET /misc/a%%2Fb: %d %s, want 400 naming %%2F", code, body)
	}
	if _, ok := rig.m.Placement(directory.Key{Namespace: "/misc", ID: "a/b"}); ok {
		t.Error("an encoded '/' placed an id")
	}
}

// Forwarded, an escaped id reaches the owner under its decoded spelling
// with a valid attestation.
func TestEscapedIDForwarded(t *testing.T) {
	var gotPath string
	rig := newForwardRigWith(t, func(w http.ResponseWriter, r *http.Request) {
		gotPath = r.URL.EscapedPath()
		fmt.Fprint(w, "ok")
	})
	m := rig.dir.Machine()
	if res := testdir.Apply(m, 20, directory.Claim{Key: directory.Key{Namespace: "/counters", ID: "a:b"}, ClientID: "owner", Now: time.Now().UnixMilli()}); res.Code != directory.CodeGranted {
		t.Fatalf("claim: %v %s", res.Code, res.Reason)
	}
	resp, err := http.Get(rig.entry.URL + "/counters/a%3Ab/x%20y")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || gotPath != "/_pinned/i/counters/a:b/x%20y" {
		t.Errorf("forwarded: %d %s, owner saw %q", resp.StatusCode, body, gotPath)
	}
}

// The node that takes over an id from a lapsed worker says so, with the
// generation and the previous owner's node.
func TestTakeoverLogged(t *testing.T) {
	rig, w := hostRig(t)
	past := time.Now().Add(-2 * time.Hour)
	if res, err := rig.dir.Do(t.Context(), directory.Register{
		ClientID: "gone", SessionID: "s-gone", NodeID: "n9", AdvertiseURL: "http://n9.internal:8080",
		Namespaces: []string{"/misc"}, Headroom: 1, TTLMs: time.Hour.Milliseconds(), Now: past.UnixMilli(),
	}); err != nil || res.Code != directory.CodeOK {
		t.Fatalf("register: %v %v", err, res.Code)
	}
	key := directory.Key{Namespace: "/misc", ID: "t1"}
	if res, err := rig.dir.Do(t.Context(), directory.Claim{Key: key, ClientID: "gone", Now: past.Add(time.Minute).UnixMilli()}); err != nil || res.Code != directory.CodeGranted {
		t.Fatalf("claim for the lapsed worker: %v %v", err, res.Code)
	}
	if code, body, _ := rig.call(t, "GET", "/misc/t1/x", "", ""); code != http.StatusOK {
		t.Fatalf("GET /misc/t1: %d %s", code, body)
	}
	p, _ := rig.m.Placement(key)
	want := fmt.Sprintf(`msg="took over instance" instance=/misc/t1 generation=%d previous_owner=gone previous_node=n9`, p.Generation)
	if p.Owner != w.ClientID() || !strings.Contains(rig.logs.String(), want) {
		t.Errorf("want %q in the log (owner %s):\n%s", want, p.Owner, rig.logs)
	}
	if n := strings.Count(rig.logs.String(), "took over instance"); n != 1 {
		t.Errorf("%d takeover lines, want 1", n)
	}
}

// With the access log on, every request gets one line saying where it was
// served, also the requests a kept-alive connection carries next (the
// loop is off).
func TestAccessLog(t *testing.T) {
	rig := newForwardRig(t)
	logs := &testutil.SyncBuffer{}
	f := New(Config{Dir: rig.dir, Logger: slog.New(slog.NewTextHandler(logs, nil)), AccessLog: true})
	entry := httptest.NewServer(f)
	t.Cleanup(func() {
		entry.Close()
		_ = f.Close()
	})
	f.serveHandBacks(entry.Config)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
	t.Cleanup(client.CloseIdleConnections)
	for range 3 {
		resp, err := client.Get(entry.URL + "/counters/c1/value?secret=x")
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	resp, err := client.Get(entry.URL + "/nope/x/y")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	lines := strings.Count(logs.String(), `msg=request method=GET path=/counters/c1/value remote=127.0.0.1:`)
	fwd := strings.Count(logs.String(), "status=200 bytes=12 ")
	if lines != 3 || fwd != 3 || strings.Count(logs.String(), "served=forwarded node=n2") != 3 {
		t.Errorf("want 3 forwarded lines:\n%s", logs)
	}
	if !strings.Contains(logs.String(), "path=/nope/x/y") || !strings.Contains(logs.String(), "status=404") {
		t.Errorf("no line for the 404:\n%s", logs)
	}
	if strings.Contains(logs.String(), "secret") {
		t.Errorf("the query reached the log:\n%s", logs)
	}
	if n := f.keep.conns.Served(); n != 0 {
		t.Errorf("the kept-alive loop carried %d requests with the access log on", n)
	}
}
