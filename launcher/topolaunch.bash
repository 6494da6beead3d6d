# bash completion for topolaunch(1). The option lists follow `topolaunch SUBCOMMAND --help`
# (tests/package/test_completion.py checks that they do).
_topolaunch() {
  local cur prev words cword
  _init_completion || return

  local sub="" at=0 i
  for ((i = 1; i < cword; i++)); do
    case ${words[i]} in
      check | map | run | preflight | report)
        sub=${words[i]}
        at=$i
        break
        ;;
    esac
  done
  if [[ -z $sub ]]; then
    # `agent` is left out: run starts it through srun, people do not.
    COMPREPLY=($(compgen -W "check map run preflight report -h --help" -- "$cur"))
    return
  fi
  # topolaunch run job.toml -- COMMAND...: complete the command as bash would.
  if [[ $sub == run ]]; then
    for ((i = at + 1; i < cword; i++)); do
      if [[ ${words[i]} == -- ]]; then
        _command_offset $((i + 1))
        return
      fi
    done
  fi

  case $prev in
    --topology)
      _filedir '@(xml|json)'
      return
      ;;
    --switch-tree)
      _filedir
      return
      ;;
    --job-dir | --sysfs)
      _filedir -d
      return
      ;;
    -o | --output)
      _filedir html
      return
      ;;
    --level)
      COMPREPLY=($(compgen -W "quick full" -- "$cur"))
      return
      ;;
    --transport)
      COMPREPLY=($(compgen -W "verbs ucx" -- "$cur"))
      return
      ;;
    --nodes | --hosts | --node)
      return
      ;;
  esac

  local options
  case $sub in
    check) options="-h --help -q --quiet" ;;
    map) options="-h --help --topology --nodes --hosts --switch-tree --json" ;;
    run) options="-h --help --topology --job-dir -q --quiet --json --resume --local" ;;
    preflight) options="-h --help --json --level --transport --sysfs --node" ;;
    report) options="-h --help -o --output" ;;
  esac
  if [[ $cur == -* ]]; then
    COMPREPLY=($(compgen -W "$options" -- "$cur"))
  elif [[ $sub == report ]]; then
    _filedir -d  # the job directory
  else
    _filedir toml
  fi
} &&
  complete -F _topolaunch topolaunch
