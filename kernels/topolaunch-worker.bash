# bash completion for topolaunch-worker(1). The option list follows `topolaunch-worker --help`
# (tests/package/test_completion.py checks that it does).
_topolaunch_worker() {
  local cur prev words cword
  _init_completion || return

  # The commands beside training, each with the options of its --help.
  local command=${words[1]-}
  if [[ $command == data && $cword -eq 2 ]]; then
    COMPREPLY=($(compgen -W "prepare" -- "$cur"))
    return
  fi
  if [[ $command == data || $command == sample || $command == export ]] && ((cword > 1)); then
    case $prev in
      --corpus | --tokenizer | --logits) _filedir; return ;;
      --out) _filedir -d; return ;;
      --model-type) COMPREPLY=($(compgen -W "bpe unigram" -- "$cur")); return ;;
      --device) COMPREPLY=($(compgen -W "cpu cuda" -- "$cur")); return ;;
      --vocab-size | --val-fraction | --threads | --prompt | --prompt-ids | --tokens | \
        --temperature | --top-k | --seed) return ;;
    esac
    if [[ $cur == -* ]]; then
      case $command in
        data) COMPREPLY=($(compgen -W "--corpus --out --vocab-size --model-type --val-fraction --tokenizer --threads -h --help" -- "$cur")) ;;
        sample) COMPREPLY=($(compgen -W "--prompt --prompt-ids --tokens --temperature --top-k --seed --device --logits -h --help" -- "$cur")) ;;
        export) COMPREPLY=($(compgen -W "--out -h --help" -- "$cur")) ;;
      esac
    else
      _filedir -d  # a checkpoint folder
    fi
    return
  fi
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
    ((cword == 1)) && COMPREPLY+=($(compgen -W "data sample export" -- "$cur"))
  fi
} &&
  complete -F _topolaunch_worker topolaunch-worker
