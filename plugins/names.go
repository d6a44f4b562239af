package plugins

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"unicode/utf8"
)

// Limits on names, shared by pinnedd's front door and the SDK.
const (
	MaxIDLen        = 256
	MaxNamespaceLen = 64
)

// Sentinel errors for invalid names.
var (
	ErrInvalidNamespace = errors.New("invalid namespace")
	ErrInvalidID        = errors.New("invalid id")
)

// Reserved are first path segments pinnedd's front door keeps for itself;
// no namespace may take them.
var Reserved = map[string]bool{"healthz": true, "readyz": true, "metrics": true, "registry": true}

// ValidateNamespace accepts "/" followed by 1-63 of [a-z0-9_-], starting with
// a letter or digit: one path segment, so routing never has to guess. The
// Reserved names are refused.
func ValidateNamespace(ns string) error {
	if Reserved[strings.TrimPrefix(ns, "/")] {
		return fmt.Errorf("%w %q: reserved by pinnedd", ErrInvalidNamespace, ns)
	}
	if len(ns) < 2 || len(ns) > MaxNamespaceLen || ns[0] != '/' {
		return fmt.Errorf("%w %q: want /name", ErrInvalidNamespace, ns)
	}
	for i := 1; i < len(ns); i++ {
		c := ns[i]
		ok := c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || (i > 1 && (c == '-' || c == '_'))
		if !ok {
			return fmt.Errorf("%w %q: only a-z, 0-9, - and _ after the slash", ErrInvalidNamespace, ns)
		}
	}
	return nil
}

// ValidateID accepts 1-256 bytes of [A-Za-z0-9._~:@=+-], not starting with
// '.', so an id can never be a path traversal or need escaping.
func ValidateID(id string) error {
	if id == "" {
		return fmt.Errorf("%w: empty", ErrInvalidID)
	}
	if len(id) > MaxIDLen {
		return fmt.Errorf("%w: longer than %d bytes", ErrInvalidID, MaxIDLen)
	}
	if id[0] == '.' {
		return fmt.Errorf("%w %q: starts with '.'", ErrInvalidID, id)
	}
	// Runes, not bytes: "é" is named as 'é', not as the Latin-1 reading of
	// its first byte.
	for i, c := range id {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case c == '.', c == '_', c == '~', c == ':', c == '@', c == '=', c == '+', c == '-':
		case c == utf8.RuneError && !strings.HasPrefix(id[i:], "\uFFFD"):
			return fmt.Errorf("%w %q: byte %q is not UTF-8", ErrInvalidID, id, id[i:i+1])
		default:
			return fmt.Errorf("%w %q: character %q not allowed", ErrInvalidID, id, c)
		}
	}
	return nil
}

// StateNamespace is the namespace an instance's durable state is stored
// under: its namespace, prefixed by its env in hostname-aware mode
// ("pr-41/counter"). Single mode's env is "", so its keys are the
// namespaces as they always were. An env never holds '/' and a namespace
// starts with one, so SplitStateNamespace undoes it. This is the one rule:
// every path between an instance and the store calls it.
func StateNamespace(env, ns string) string { return env + ns }

// SplitStateNamespace undoes StateNamespace.
func SplitStateNamespace(s string) (env, ns string) {
	i := strings.IndexByte(s, '/')
	if i < 0 {
		return "", s
	}
	return s[:i], s[i:]
}

// NormalizeHost is the hostname a request or a registration names in
// hostname-aware mode: the Host without its port, lowercased, without a
// trailing dot. "" when h names none.
func NormalizeHost(h string) string {
	if host, _, err := net.SplitHostPort(h); err == nil {
		h = host
	}
	return strings.ToLower(strings.TrimSuffix(h, "."))
}

// ValidHostname accepts a normalized DNS name (a-z, 0-9, '-', '.'; labels
// of 1-63, 253 in all) or an IP literal.
func ValidHostname(h string) bool {
	if net.ParseIP(h) != nil {
		return true
	}
	if h == "" || len(h) > 253 {
		return false
	}
	for _, label := range strings.Split(h, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-') {
				return false
			}
		}
	}
	return true
}

// ValidEnv accepts 1-128 characters of a-z A-Z 0-9 . - _: an env names
// state (StateNamespace), so nothing that needs escaping anywhere, and
// never '/'.
func ValidEnv(e string) bool { return ValidName(e, ".-_") }

// ValidName accepts 1-128 characters, ASCII letters and digits or one of
// extra: the shape of the names pinnedd passes in headers and paths
// without escaping (envs, worker client ids).
func ValidName(s, extra string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte(extra, c) >= 0) {
			return false
		}
	}
	return true
}

// ParseRoute reads a route as operators name one: "/NS", or in
// hostname-aware mode "HOST/NS" (the hostname lowercased).
func ParseRoute(s string) (host, ns string, err error) {
	i := strings.IndexByte(s, '/')
	if i < 0 {
		return "", "", fmt.Errorf("%w %q: want /namespace or hostname/namespace", ErrInvalidNamespace, s)
	}
	host, ns = strings.ToLower(s[:i]), s[i:]
	if err := ValidateNamespace(ns); err != nil {
		return "", "", err
	}
	if host != "" && !ValidHostname(host) {
		return "", "", fmt.Errorf("%w %q: %q is not a hostname", ErrInvalidNamespace, s, host)
	}
	return host, ns, nil
}
