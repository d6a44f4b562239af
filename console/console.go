package console

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"net/http"
	"path"
	"strings"
)

// Prefix is where every node serves the console. Its first segment starts
// with "_", so no namespace can shadow it.
const Prefix = "/_pinned/console/"

// csp allows the console's own files and calls to its own origin, and
// nothing else: no inline script or style, no other origin, no framing.
const csp = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

//go:embed static
var static embed.FS

// pages are the console's addresses below Prefix and the document each
// serves; the script reads the path to pick its view.
var pages = map[string]string{
	"fleet":           "fleet.html",
	"fleet/hosts":     "fleet.html",
	"fleet/instances": "fleet.html",
	"inspector":       "inspector.html",
}

// asset is one embedded file, ready to serve.
type asset struct {
	body  []byte
	ctype string
	etag  string
}

// Handler serves the console: pages, and their files under static/.
type Handler struct {
	files map[string]asset // by name in static/
}

// NewHandler loads the embedded files once; they never change in a
// running binary, so each gets an ETag from its content.
func NewHandler() *Handler {
	h := &Handler{files: map[string]asset{}}
	err := fs.WalkDir(static, "static", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := static.ReadFile(p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(b)
		h.files[strings.TrimPrefix(p, "static/")] = asset{body: b, ctype: contentType(p), etag: `"` + hex.EncodeToString(sum[:8]) + `"`}
		return nil
	})
	if err != nil {
		// The files are part of the binary: a failure here is a build
		// that cannot work at all.
		panic("console: embedded files: " + err.Error())
	}
	return h
}

func contentType(p string) string {
	switch path.Ext(p) {
	case ".html":
		return "text/html; charset=utf-8"
	case ".js", ".mjs":
		return "text/javascript; charset=utf-8"
	case ".css":
		return "text/css; charset=utf-8"
	case ".png":
		return "image/png"
	case ".svg":
		return "image/svg+xml"
	}
	return "application/octet-stream"
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hd := w.Header()
	hd.Set("Content-Security-Policy", csp)
	hd.Set("X-Frame-Options", "DENY")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Referrer-Policy", "no-referrer")
	hd.Set("Cross-Origin-Opener-Policy", "same-origin")
	hd.Set("Cross-Origin-Resource-Policy", "same-origin")
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		hd.Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	rest := strings.TrimPrefix(r.URL.Path, strings.TrimSuffix(Prefix, "/"))
	rest = strings.TrimPrefix(rest, "/")
	if rest == "" {
		http.Redirect(w, r, Prefix+"fleet", http.StatusFound)
		return
	}
	name, ok := pages[strings.TrimSuffix(rest, "/")]
	if !ok {
		name, ok = strings.CutPrefix(rest, "static/")
	}
	a, found := h.files[name]
	if !ok || !found {
		http.Error(w, "not found: the console's pages are "+Prefix+"fleet and "+Prefix+"inspector", http.StatusNotFound)
		return
	}
	hd.Set("Content-Type", a.ctype)
	// Revalidate every time (a new binary has new files under the same
	// names); the ETag makes that a 304.
	hd.Set("Cache-Control", "no-cache")
	hd.Set("ETag", a.etag)
	if match := r.Header.Get("If-None-Match"); match != "" && match == a.etag {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	if r.Method == http.MethodHead {
		return
	}
	_, _ = w.Write(a.body)
}
