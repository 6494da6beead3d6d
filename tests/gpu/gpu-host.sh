#!/usr/bin/env bash
# The GPU host's one command: configure, build, test and benchmark with meson, from the repository
# root, results into $OUT. The H200 hosts (see docs/gpu-runs.md) have no toml++ (header-only) and
# no Jane Austen data, so the build host prepares them first:
#   tests/gpu/gpu-host.sh --prepare [docs] on the build host: fills the ignored .carry-gpu/
#                                          (docs: also the documentation corpus, docs-bpe8k)
#   tests/gpu/gpu-host.sh [STEP...]        on the GPU host (default: setup build test)
# STEPs: setup (meson setup, the configure summary), build (ninja), test (meson test --suite gpu;
# --no-suite gpu-multi with fewer than 2 GPUs), bench (meson test --benchmark --suite gpu: each
# benchmark against PyTorch in the same run), models (meson test --benchmark --suite gpu-models:
# the example configs' GPT-2 350M/774M/1.5B and ~1B LLaMA against torch.compile, with and without
# a memory budget), example (topolaunch run of the single-GPU example), text (GPT-2 124M on the
# prepared Austen tokens: loss curves, a sample, the export in PyTorch), fp8 (the same job with
# train.precision "fp8" against "bf16" from the same start: tests/gpu/fp8_vs_bf16.py; FP8_DATA
# (default the austen-bpe8k tokens), FP8_OUT (default $OUT/fp8) and FP8_ARGS (e.g. "--batch 64
# --noise-floor --resume" with FP8_DATA=.carry-gpu/data/austen-bpe8k-v25) pass on to it).
# BUILD (default build-gpu), OUT (default $BUILD/out), MESON_ARGS (extra setup options).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
CARRY=.carry-gpu
if [ "${1:-}" = "--prepare" ]; then
  set -e
  rm -rf "$CARRY" && mkdir -p "$CARRY/include" "$CARRY/data"
  cp -r /usr/include/toml++ "$CARRY/include/"
  cp /usr/lib/R/site-library/janeaustenr/data/Rdata.* "$CARRY/data/"
  # The prepared Austen tokens and their tokenizer (the GPU hosts have no SentencePiece): the
  # `text` step and configs/jobs/gpt2-124m-austen-1gpu.toml read them.
  worker=${WORKER:-build/kernels/topolaunch-worker}
  [ -x "$worker" ] || { echo "--prepare needs $worker (ninja -C build)"; exit 2; }
  "$worker" data prepare --corpus janeaustenr --out "$CARRY/data/austen-bpe8k" --vocab-size 8192
  # A quarter of the text held out: B=64's validation batch is 65,537 tokens (the split above
  # holds 48K), for the fp8 step at B=64.
  "$worker" data prepare --corpus janeaustenr --out "$CARRY/data/austen-bpe8k-v25" \
    --vocab-size 8192 --val-fraction 0.25
  if [ "${2:-}" = "docs" ]; then
    # A larger real text for the fp8 step at B=64 (2,000 steps of 65,536 tokens see Austen's
    # 0.73M training tokens ~180 times, and both precisions memorise them): the English
    # documentation of Linux 6.1, Python 3.11 and Perl 5.36, from Debian's linux-source-6.1,
    # python3.11-doc and perl-doc (42 MB of text, 11.5M training tokens: ~11 passes).
    text=$(mktemp -d)
    trap 'rm -rf "$text"' EXIT
    for f in /usr/src/linux-source-6.1.tar.xz /usr/share/doc/python3.11/html/_sources \
      /usr/share/perl/5.36.0/pod; do
      [ -e "$f" ] || { echo "--prepare docs needs $f (apt-get install linux-source-6.1 python3.11-doc perl-doc)"; exit 2; }
    done
    tar -xJf /usr/src/linux-source-6.1.tar.xz -C "$text" --wildcards 'linux-source-6.1/Documentation/*'
    # English prose only: no translations, device-tree bindings (YAML) or sysfs ABI entries
    (cd "$text/linux-source-6.1/Documentation" && find . -type f \( -name '*.rst' -o -name '*.txt' \) \
      -not -path './translations/*' -not -path './devicetree/*' -not -path './ABI/*' -print0 |
      sort -z | xargs -0 cat) > "$text/linux-6.1-documentation.txt"
    (cd /usr/share/doc/python3.11/html/_sources && find . -name '*.rst.txt' -print0 | sort -z |
      xargs -0 cat) > "$text/python-3.11-documentation.txt"
    (cd /usr/share/perl/5.36.0/pod && find . -name '*.pod' -print0 | sort -z | xargs -0 cat) \
      > "$text/perl-5.36-documentation.txt"
    rm -rf "$text/linux-source-6.1"
    "$worker" data prepare --corpus "$text" --out "$CARRY/data/docs-bpe8k" --vocab-size 8192
  fi
  du -sh "$CARRY"
  exit 0
fi
BUILD=$(realpath -m "${BUILD:-build-gpu}")
OUT=${OUT:-$BUILD/out}
mkdir -p "$OUT"
[ -f "$CARRY/data/Rdata.rdb" ] && export TOPOLAUNCH_JANEAUSTENR=$PWD/$CARRY/data/Rdata.rdb
STEPS=("$@")
[ ${#STEPS[@]} -gt 0 ] || STEPS=(setup build test)
T0=$SECONDS
declare -A RC
stage() { echo; echo "=== $1 (at $((SECONDS - T0)) s)"; }
for step in "${STEPS[@]}"; do
  case $step in
  setup)
    stage "meson setup $BUILD"
    args=(-Dcuda=enabled -Dbench=true ${MESON_ARGS:-})
    [ -f "$CARRY/include/toml++/toml.h" ] && ! [ -f /usr/include/toml++/toml.h ] &&
      args+=(-Dtoml_include_dir="$CARRY/include")
    python3 -c 'import torch' 2> /dev/null || args+=(-Dgpu_torch=disabled)
    echo "meson setup $BUILD ${args[*]}"
    wipe=(); [ -f "$BUILD/meson-private/coredata.dat" ] && wipe=(--wipe)
    meson setup "${wipe[@]}" "$BUILD" "${args[@]}" > "$OUT/setup.log" 2>&1
    RC[setup]=$?
    # the configure summary: from "topolaunch <version>" to the end
    sed -n '/^topolaunch /,$p' "$OUT/setup.log"
    [ "${RC[setup]}" -eq 0 ] || tail -30 "$OUT/setup.log"
    ;;
  build)
    stage "ninja -C $BUILD"
    ninja -C "$BUILD" -k 0 > "$OUT/build.log" 2>&1  # -k 0: every failure at once
    RC[build]=$?
    grep -E "warning|error|FAILED" "$OUT/build.log" | head -40
    tail -1 "$OUT/build.log"
    ;;
  test)
    stage "meson test --suite gpu"
    sel=(--suite gpu)
    gpus=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU')
    [ "$gpus" -ge 2 ] || { sel+=(--no-suite gpu-multi); echo "$gpus GPU(s): gpu-multi deselected"; }
    meson test -C "$BUILD" "${sel[@]}" --print-errorlogs > "$OUT/test.log" 2>&1
    RC[test]=$?
    grep -E "^ *[0-9]+/[0-9]+ |^(Ok|Fail|Skipped|Timeout|Expected Fail|Unexpected Pass): " "$OUT/test.log"
    cp "$BUILD/meson-logs/testlog.txt" "$OUT/testlog-gpu.txt" 2> /dev/null
    cat "$BUILD"/tests/gpu/worker/*/result.json > "$OUT/worker-results.json" 2> /dev/null
    ;;
  bench)
    stage "meson test --benchmark --suite gpu"
    meson test -C "$BUILD" --benchmark --suite gpu --no-suite gpu-multi --print-errorlogs \
      > "$OUT/bench.log" 2>&1
    RC[bench]=$?
    grep -E "^ *[0-9]+/[0-9]+ " "$OUT/bench.log"
    cat "$BUILD"/tests/bench/kernels/results-gpu/*.json > "$OUT/bench-results.jsonl" 2> /dev/null
    ;;
  models)
    stage "meson test --benchmark --suite gpu-models"
    meson test -C "$BUILD" --benchmark --suite gpu-models --print-errorlogs \
      > "$OUT/models.log" 2>&1
    RC[models]=$?
    grep -E "^ *[0-9]+/[0-9]+ " "$OUT/models.log"
    cat "$BUILD"/tests/bench/kernels/results-gpu/model_*.json > "$OUT/models-results.jsonl" \
      2> /dev/null
    ;;
  example)
    stage "topolaunch run configs/jobs/gpt2-124m-1gpu.toml"
    job=$BUILD/gpt2-124m-1gpu.toml
    sed "s|^kind = \"janeaustenr\".*|kind = \"janeaustenr\"\npath = \"${TOPOLAUNCH_JANEAUSTENR:-/usr/lib/R/site-library/janeaustenr/data/Rdata.rdb}\"|" \
      configs/jobs/gpt2-124m-1gpu.toml > "$job"
    rm -rf "$BUILD/example-job"
    PATH=$BUILD/kernels:$PATH "$BUILD/launcher/topolaunch" run "$job" \
      --job-dir "$BUILD/example-job" > "$OUT/example.log" 2>&1
    RC[example]=$?
    grep -E "^\[rank 0\] (step +[0-9]*0/|rank 0 binding|done)|^(job|report)" "$OUT/example.log" | tail -25
    ;;
  text)
    stage "GPT-2 124M on the prepared Austen tokens (tests/gpu/gpt2_austen.py)"
    python3 tests/gpu/gpt2_austen.py --build "$BUILD" --data "$CARRY/data/austen-bpe8k" \
      --out "$OUT/text" > "$OUT/text.log" 2>&1
    RC[text]=$?
    tail -40 "$OUT/text.log"
    ;;
  fp8)
    stage "GPT-2 124M on the Austen tokens, fp8 against bf16 (tests/gpu/fp8_vs_bf16.py)"
    # shellcheck disable=SC2086  # FP8_ARGS: words for the script
    python3 tests/gpu/fp8_vs_bf16.py --build "$BUILD" --data "${FP8_DATA:-$CARRY/data/austen-bpe8k}" \
      --out "${FP8_OUT:-$OUT/fp8}" ${FP8_ARGS:-} > "$OUT/fp8.log" 2>&1
    RC[fp8]=$?
    tail -5 "$OUT/fp8.log"
    ;;
  *) echo "unknown step $step (setup build test bench models example text fp8)"; exit 2 ;;
  esac
  echo "--- $step: exit ${RC[$step]} ($((SECONDS - T0)) s)"
done
status=0
for step in "${STEPS[@]}"; do [ "${RC[$step]}" -eq 0 ] || status=1; done
echo "steps: $(for s in "${STEPS[@]}"; do printf '%s=%s ' "$s" "${RC[$s]}"; done)total $((SECONDS - T0)) s"
exit $status
