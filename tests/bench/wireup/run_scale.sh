#!/bin/bash
# The wireup simulation at 64, 256 and 1,024 nodes x 8 ranks, this design ("tree") against the
# one before it ("flat"), plus the map / report / heartbeat parts; one JSON object per line.
#
#   run_scale.sh BUILD_DIR [OUT.jsonl]
#
# Takes about 5 minutes on 2 cores, most of it the flat design at 1,024 nodes (23 GB of node
# records through one store). Results of a run are in results/scale-*.jsonl.
set -euo pipefail
build=${1:?usage: run_scale.sh BUILD_DIR [OUT.jsonl]}
out=${2:-/dev/stdout}
here=$(cd "$(dirname "$0")" && pwd)
bench=$build/tests/bench/wireup/bench_wireup_scale
fixtures=$here/../../fixtures/slurm
[ -x "$bench" ] || { echo "run_scale.sh: $bench not built (ninja -C $build $bench)" >&2; exit 2; }
: >"$out"
for agents in 64 256 1024; do
  processes=$((agents >= 256 ? 4 : 2))
  "$bench" --fixtures "$fixtures" --agents "$agents" --parts >>"$out"
  for design in tree flat; do
    "$bench" --fixtures "$fixtures" --agents "$agents" --processes "$processes" \
      --design "$design" --timeout-s 900 >>"$out"
  done
done
