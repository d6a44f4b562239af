package plugins

import (
	"errors"
	"strings"
	"testing"
)

func TestValidateID(t *testing.T) {
	for _, id := range []string{"a", "alice", "A-1_b.c~d:e@f=g+h", "_x", strings.Repeat("z", MaxIDLen), "0"} {
		if err := ValidateID(id); err != nil {
			t.Errorf("ValidateID(%q) = %v, want ok", id, err)
		}
	}
	for _, id := range []string{"", ".", "..", ".x", "a/b", "a b", "a%2F", "ü", "a\x00", strings.Repeat("z", MaxIDLen+1), "a?b", "a#b"} {
		if err := ValidateID(id); !errors.Is(err, ErrInvalidID) {
			t.Errorf("ValidateID(%q) = %v, want ErrInvalidID", id, err)
		}
	}
}

func TestValidateNamespace(t *testing.T) {
	for _, ns := range []string{"/counters", "/a", "/threads-v2", "/x_y", "/9"} {
		if err := ValidateNamespace(ns); err != nil {
			t.Errorf("ValidateNamespace(%q) = %v, want ok", ns, err)
		}
	}
	for _, ns := range []string{"", "/", "counters", "/Counters", "/-a", "/_a", "/a/b", "/a.b", "/metrics", "/registry", "/healthz", "/readyz", "/" + strings.Repeat("a", MaxNamespaceLen)} {
		if err := ValidateNamespace(ns); !errors.Is(err, ErrInvalidNamespace) {
			t.Errorf("ValidateNamespace(%q) = %v, want ErrInvalidNamespace", ns, err)
		}
	}
}

// TestValidateIDNamesRunes: a refused id names the character the user
// typed, not the Latin-1 reading of one of its bytes.
func TestValidateIDNamesRunes(t *testing.T) {
	for id, want := range map[string]string{
		"héllo":   `invalid id "héllo": character 'é' not allowed`,
		"日本":      `invalid id "日本": character '日' not allowed`,
		"a\uFFFD": "invalid id \"a\uFFFD\": character '\uFFFD' not allowed", // a real U+FFFD is a character
		"h\xffx":  `invalid id "h\xffx": byte "\xff" is not UTF-8`,
	} {
		if err := ValidateID(id); err == nil || err.Error() != want {
			t.Errorf("ValidateID(%q) = %v, want %s", id, err, want)
		}
	}
}
