package main

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/urfave/cli/v2"
)

// minTokenLength is the shortest deployment token an agent outside --dev
// accepts: `pinnedd token generate` makes 43 characters (32 random bytes).
const minTokenLength = 32

// errWeakToken is what validateToken's errors wrap.
var errWeakToken = errors.New("weak token")

// placeholderTokens are values copied from docs and templates, never meant
// to guard a fleet; they are refused whatever their length, compared
// case-insensitively and as a prefix ("CHANGE-ME-to-something-long"). Each
// is long enough that a generated token starts with one by chance about
// never (under 1 in 10^9).
var placeholderTokens = []string{"change-me", "changeme", "change_me", "replace-me", "replaceme", "dev-token", "devtoken", "secret", "password", "example"}

// tokenFileFlag is --token-file, beside every --token: a token on the command
// line is visible to every local user (ps, /proc/PID/cmdline).
func tokenFileFlag() cli.Flag {
	return &cli.StringFlag{Name: "token-file", Usage: "read the token from this `FILE` at start (surrounding white space trimmed), e.g. a systemd LoadCredential=; excludes --token and PINBOARD_TOKEN", EnvVars: []string{"PINBOARD_TOKEN_FILE"}}
}

// tokenFrom is the token --token (or PINBOARD_TOKEN) or --token-file gives,
// "" for none. The two exclude each other: which one holds is never a guess.
func tokenFrom(c *cli.Context) (string, error) {
	file := c.String("token-file")
	if file == "" {
		return c.String("token"), nil
	}
	if c.String("token") != "" {
		return "", usagef("--token-file and --token (or PINBOARD_TOKEN) both give the token: use one")
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("--token-file: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("--token-file %s is empty", file)
	}
	return tok, nil
}

// validateToken refuses a deployment token too weak to guard a fleet: one
// shorter than minTokenLength characters, or a known placeholder. The agent
// calls it outside --dev.
func validateToken(tok string) error {
	if strings.TrimSpace(tok) != tok {
		return fmt.Errorf("%w: the token starts or ends with white space (a stray newline from a file?); remove it", errWeakToken)
	}
	lower := strings.ToLower(tok)
	for _, p := range placeholderTokens {
		if strings.HasPrefix(lower, p) {
			return fmt.Errorf("%w: the token starts with the placeholder %q; make a real one with `pinnedd token generate`", errWeakToken, tok[:len(p)])
		}
	}
	if n := len(tok); n < minTokenLength {
		return fmt.Errorf("%w: the token is %d characters long, the minimum is %d; make one with `pinnedd token generate`", errWeakToken, n, minTokenLength)
	}
	return nil
}

// newToken is 32 random bytes, URL-safe base64 without padding (43
// characters): safe in a header, an env file and a shell.
func newToken() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("read random bytes: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

func tokenCommand() *cli.Command {
	return &cli.Command{
		Name:  "token",
		Usage: "make deployment tokens",
		Subcommands: []*cli.Command{{
			Name:  "generate",
			Usage: "print a new random token (32 bytes, URL-safe base64) for PINBOARD_TOKEN",
			Action: func(c *cli.Context) error {
				if c.NArg() > 0 {
					return usagef("pinnedd token generate takes no arguments, got %q", c.Args().First())
				}
				tok, err := newToken()
				if err != nil {
					return err
				}
				_, err = fmt.Fprintln(c.App.Writer, tok)
				return err
			},
		}},
	}
}
