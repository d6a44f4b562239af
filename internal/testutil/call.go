package testutil

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// Call sends one request to base+path with a bearer token ("" for none)
// and returns the status, the body and the response.
func Call(t testing.TB, method, base, path, token, body string) (int, string, *http.Response) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp
}

// ErrorOf is the "error" field of a JSON error body.
func ErrorOf(t testing.TB, body string) string {
	t.Helper()
	var e struct {
		Error string `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error == "" {
		t.Fatalf("not a JSON error body: %q", body)
	}
	return e.Error
}
