package main

import (
	"fmt"

	"github.com/urfave/cli/v2"
)

// The scripts ask pinnedd itself for the candidates: urfave/cli answers a
// command line ending in --generate-bash-completion with the commands and
// flags that fit there.
const bashCompletion = `# pinnedd bash completion: source <(pinnedd completion bash)
_pinnedd_complete() {
  local cur="${COMP_WORDS[COMP_CWORD]}"
  local words=("${COMP_WORDS[@]:0:COMP_CWORD}")
  local opts
  if [[ "$cur" == -* ]]; then
    opts=$("${words[@]}" "$cur" --generate-bash-completion 2>/dev/null)
  else
    opts=$("${words[@]}" --generate-bash-completion 2>/dev/null)
  fi
  COMPREPLY=($(compgen -W "$opts" -- "$cur"))
}
complete -o bashdefault -o default -F _pinnedd_complete pinnedd
`

const zshCompletion = `#compdef pinnedd
# pinnedd zsh completion: source <(pinnedd completion zsh)
_pinnedd() {
  local -a opts
  local cur=${words[CURRENT]}
  if [[ "$cur" == -* ]]; then
    opts=("${(@f)$(${words[@]:0:CURRENT-1} $cur --generate-bash-completion 2>/dev/null)}")
  else
    opts=("${(@f)$(${words[@]:0:CURRENT-1} --generate-bash-completion 2>/dev/null)}")
  fi
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
