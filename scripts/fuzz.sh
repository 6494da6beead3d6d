#!/bin/sh
# Runs every libFuzzer harness of tests/fuzz for SECONDS of CPU each, one at a time under
# nice -n 19; merges inputs that add coverage into tests/fuzz/corpus/<harness>/, stores every
# crashing, hanging or out-of-memory input under tests/fuzz/crashes/<harness>/, and prints one
# JSON object per harness: executions, exec/s (per wall and per CPU second), CPU seconds, new
# corpus files, crashes. Exits 1 when any harness crashed. FUZZ_MAX_WALL=S also ends each
# harness after S wall seconds (a busy host gives a nice-19 process little CPU).
#
# usage: scripts/fuzz.sh SECONDS [HARNESS...]
#        scripts/fuzz.sh --seed      (re-make the seeds the code writes: frames, checkpoint, tokens)
#        scripts/fuzz.sh --minimize  (shrink each committed corpus to the files that add coverage)
# Build: clang (Debian's clang + libclang-rt-dev) in ${FUZZ_BUILD_DIR:-build-fuzz}.
set -eu
cd "$(dirname "$0")/.."
build=${FUZZ_BUILD_DIR:-build-fuzz}
harnesses="job_config hwloc_xml store_frames pmi2_codec spank_options checkpoint token_file safetensors"

if [ $# -lt 1 ]; then
  sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
if [ ! -d "$build" ]; then
  CC=clang CXX=clang++ meson setup "$build" --buildtype=debugoptimized -Dfuzz=true -Dbench=false \
    >/dev/null
fi
mode=run
case "$1" in
  --seed) mode=seed; shift ;;
  --minimize) mode=minimize; shift ;;
  *) seconds=$1; shift ;;
esac
[ $# -gt 0 ] && harnesses="$*"
targets=tests/fuzz/fuzz_make_seeds
if [ "$mode" != seed ]; then
  targets=""
  for h in $harnesses; do targets="$targets tests/fuzz/fuzz_$h"; done
fi
nice ninja -C "$build" $targets >/dev/null

if [ "$mode" = seed ]; then
  exec "$build/tests/fuzz/fuzz_make_seeds" tests/fuzz/corpus
fi

exec python3 - "$mode" "$build" "${seconds:-0}" $harnesses <<'PY'
import json, os, re, resource, shutil, subprocess, sys, tempfile, time

mode, build, seconds, harnesses = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4:]
max_wall = float(os.environ.get("FUZZ_MAX_WALL") or "inf")
root = os.path.join("tests", "fuzz")
# Leaks inside a library on its error paths (docs/fuzzing-findings.md), not ours.
fuzz_env = dict(os.environ, LSAN_OPTIONS="suppressions=" + os.path.abspath(
    os.path.join(root, "lsan.supp")))
# Per-harness libFuzzer flags: input size caps keep each run on the shapes that matter.
max_len = {"hwloc_xml": 16384, "checkpoint": 4096, "token_file": 4096, "job_config": 4096,
           "store_frames": 4096, "pmi2_codec": 2048, "spank_options": 1100, "safetensors": 4096}


def cpu_of_children():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def fuzzer(h):
    return os.path.join(build, "tests", "fuzz", "fuzz_" + h)


def files_in(d):
    return sorted(f for f in os.listdir(d) if not f.startswith(".")) if os.path.isdir(d) else []


def merge(h, into, sources):
    subprocess.run(["nice", "-n", "19", fuzzer(h), "-merge=1", "-max_len=%d" % max_len[h],
                    into] + sources, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   check=True, env=fuzz_env)


any_crash = False
for h in harnesses:
    corpus = os.path.join(root, "corpus", h)
    crashes = os.path.join(root, "crashes", h)
    os.makedirs(corpus, exist_ok=True)
    os.makedirs(crashes, exist_ok=True)
    if mode == "minimize":
        with tempfile.TemporaryDirectory() as fresh:
            before = len(files_in(corpus))
            merge(h, fresh, [corpus])
            shutil.rmtree(corpus)
            shutil.copytree(fresh, corpus)
        print(json.dumps({"harness": h, "corpus_files_before": before,
                          "corpus_files": len(files_in(corpus)),
                          "corpus_bytes": sum(os.path.getsize(os.path.join(corpus, f))
                                              for f in files_in(corpus))}))
        continue
    work = tempfile.mkdtemp(prefix="topolaunch-fuzz-%s-" % h)
    new = os.path.join(work, "new")
    os.makedirs(new)
    found_before = set(files_in(crashes))
    executions, cpu, wall = 0, 0.0, 0.0
    while cpu < seconds and wall < max_wall:
        # libFuzzer stops at the first crash: start again until the CPU budget is spent. Its
        # -max_total_time is wall time; the host is shared, so the budget is counted in CPU.
        left = min(seconds - cpu, max_wall - wall)
        start_cpu, start_wall = cpu_of_children(), time.monotonic()
        proc = subprocess.run(
            ["nice", "-n", "19", fuzzer(h), "-max_total_time=%d" % max(1, int(left)),
             "-print_final_stats=1", "-timeout=25", "-rss_limit_mb=2048",
             "-max_len=%d" % max_len[h], "-artifact_prefix=" + crashes + "/",
             "-close_fd_mask=1", new, corpus],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, errors="replace",
            env=dict(fuzz_env, TMPDIR=work))
        cpu += cpu_of_children() - start_cpu
        wall += time.monotonic() - start_wall
        runs = [int(x) for x in re.findall(r"stat::number_of_executed_units: (\d+)", proc.stderr)]
        # A crash ends the run before the final stats: count from the last status line.
        if not runs:
            runs = [int(x) for x in re.findall(r"^#(\d+)\s", proc.stderr, re.M)][-1:] or [0]
        executions += runs[-1]
        if proc.returncode != 0:
            any_crash = True
            with open(os.path.join(work, "run-%d.log" % len(os.listdir(work))), "w") as log:
                log.write(proc.stderr)
            if not re.search(r"Test unit written to", proc.stderr):
                sys.stderr.write(proc.stderr[-3000:])
                sys.exit("fuzz.sh: %s failed without a crashing input (see above)" % h)
    merge(h, corpus, [new])
    found = sorted(set(files_in(crashes)) - found_before)
    corpus_files = files_in(corpus)
    print(json.dumps({
        "harness": h, "executions": executions, "cpu_seconds": round(cpu, 1),
        "wall_seconds": round(wall, 1),
        "exec_per_cpu_second": round(executions / cpu) if cpu else 0,
        "exec_per_wall_second": round(executions / wall) if wall else 0,
        "corpus_files": len(corpus_files),
        "corpus_bytes": sum(os.path.getsize(os.path.join(corpus, f)) for f in corpus_files),
        "new_crashes": [os.path.join(crashes, f) for f in found],
        "logs": work if found else None}), flush=True)
    if not found:
        shutil.rmtree(work)
sys.exit(1 if any_crash else 0)
PY
