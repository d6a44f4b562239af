package plugins

import (
	"errors"
	"fmt"
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
