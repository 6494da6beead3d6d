# bash completion for topodiag(8). The option list follows `topodiag --help`
# (tests/package/test_completion.py checks that it does).
_topodiag() {
  local cur prev words cword
  _init_completion || return

  case $prev in
    -i | --input | --baseline)
      _filedir '@(xml|json)'
      return
      ;;
    --save-baseline)
      _filedir json
      return
      ;;
    --nics | --memory-tolerance)
      return
      ;;
  esac
  COMPREPLY=($(compgen -W "-h --help -i --input --baseline --save-baseline --json --gres --dot
    --nics --memory-tolerance --warnings-ok -v --verbose --version" -- "$cur"))
} &&
  complete -F _topodiag topodiag
