# bash completion for topolaunch-worker(1). The option list follows `topolaunch-worker --help`
# (tests/package/test_completion.py checks that it does).
_topolaunch_worker() {
  local cur prev words cword
  _init_completion || return

  if [[ $prev == --set ]]; then
    # table.key=value: the tables the worker reads.
    compopt -o nospace
    COMPREPLY=($(compgen -W "model. data. train. budget." -- "$cur"))
    return
  fi
  if [[ $cur == -* ]]; then
    COMPREPLY=($(compgen -W "--plan-only --ops --set -h --help" -- "$cur"))
  else
    _filedir toml
  fi
} &&
  complete -F _topolaunch_worker topolaunch-worker
