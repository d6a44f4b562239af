package main

import (
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"
)

// The scripts ask pinnedd itself for the candidates: the words typed, the
// partial word (perhaps empty) and --generate-bash-completion; complete
// answers such a line, which is never run.
const bashCompletion = `# pinnedd bash completion: source <(pinnedd completion bash)
_pinnedd_complete() {
  local cur="${COMP_WORDS[COMP_CWORD]}"
  local words=("${COMP_WORDS[@]:0:COMP_CWORD}")
  local opts
  opts=$("${words[@]}" "$cur" --generate-bash-completion 2>/dev/null)
  COMPREPLY=($(compgen -W "$opts" -- "$cur"))
}
complete -o bashdefault -o default -F _pinnedd_complete pinnedd
`

const zshCompletion = `#compdef pinnedd
# pinnedd zsh completion: source <(pinnedd completion zsh)
_pinnedd() {
  local -a opts
  local cur=${words[CURRENT]}
  opts=("${(@f)$(${words[@]:0:CURRENT-1} "$cur" --generate-bash-completion 2>/dev/null)}")
  if [[ -n "${opts[1]}" ]]; then
    _describe 'values' opts
  else
    _files
  fi
}
compdef _pinnedd pinnedd
`

func completionCommand() *cli.Command {
	return &cli.Command{
		Name:      "completion",
		Usage:     "print a shell completion script: source <(pinnedd completion bash)",
		ArgsUsage: "bash|zsh",
		Action: func(c *cli.Context) error {
			var script string
			switch sh := c.Args().First(); {
			case c.NArg() != 1:
				return usagef("pinnedd completion needs one shell: bash or zsh")
			case sh == "bash":
				script = bashCompletion
			case sh == "zsh":
				script = zshCompletion
			default:
				return usagef("no completion for shell %q: bash or zsh", sh)
			}
			_, err := fmt.Fprint(c.App.Writer, script)
			return err
		},
	}
}

// complete lists what may replace the last of words (the partial word
// being typed, after the program name, without the completion flag): the
// flags of the command reached when it starts with "-" ("--" lists the long
// ones), else that command's subcommands. It reads the line with
// reorderArgs' rules (lookupFlag, takesValue, findCommand), so what it
// offers is what runs; after "--" or a flag that wants a value it offers
// nothing and the shell completes files.
func complete(app *cli.App, words []string) []string {
	partial := ""
	if n := len(words); n > 0 {
		partial, words = words[n-1], words[:n-1]
	}
	cmds, flags := app.Commands, append(app.Flags, cli.VersionFlag)
	for i := 0; i < len(words); i++ {
		w := words[i]
		switch {
		case w == "--":
			return nil
		case isFlag(w):
			name, _, inline := strings.Cut(strings.TrimLeft(w, "-"), "=")
			f := lookupFlag(flags, name)
			if f == nil {
				f = lookupFlag(allFlags(cmds), name)
			}
			if f != nil && !inline && takesValue(f) {
				if i == len(words)-1 {
					return nil // the partial word is its value
				}
				i++
			}
		default:
			if c := findCommand(cmds, w); c != nil {
				cmds, flags = c.Subcommands, c.Flags
			} else {
				cmds = nil // an argument: a leaf command's
			}
		}
	}
	var out []string
	if !strings.HasPrefix(partial, "-") {
		for _, c := range cmds {
			if !c.Hidden && strings.HasPrefix(c.Name, partial) {
				out = append(out, c.Name)
			}
		}
		return out
	}
	for _, f := range append(flags, cli.HelpFlag) {
		if v, ok := f.(cli.VisibleFlag); ok && !v.IsVisible() {
			continue
		}
		for _, name := range f.Names() {
			d := dashed(name)
			if strings.HasPrefix(d, partial) && !(strings.HasPrefix(partial, "--") && len(name) == 1) {
				out = append(out, d)
			}
		}
	}
	return out
}
