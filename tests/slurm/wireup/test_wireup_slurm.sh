#!/bin/bash
# slurm suite: the PMIx and PMI2 wireup backends under real srun steps on the local test cluster
# (4 emulated nodes). Uses the cluster in $TOPOLAUNCH_SLURM_DIR when one runs there; otherwise
# starts a private one with tests/slurm/cluster-start and stops it at the end.
#
#   test_wireup_slurm.sh <wireup_peer>
set -uo pipefail

peer=$(realpath "${1:?usage: test_wireup_slurm.sh <wireup_peer>}")
here=$(cd "$(dirname "$0")" && pwd)
failures=0
check() {  # description command...
  local what=$1
  shift
  if "$@"; then echo "ok   - $what"; else echo "FAIL - $what"; failures=$((failures + 1)); fi
}

if [ -n "${TOPOLAUNCH_SLURM_DIR:-}" ] && [ -f "$TOPOLAUNCH_SLURM_DIR/env" ]; then
  dir=$TOPOLAUNCH_SLURM_DIR
else
  dir=$(mktemp -d /tmp/wireup-slurm-XXXXXX)
  rmdir "$dir"
  "$here/../cluster-start" "$dir" >/dev/null || { echo "FAIL - could not start the test cluster"; exit 1; }
  trap '"$here/../cluster-stop" "$dir" --remove >/dev/null' EXIT
fi
# shellcheck disable=SC1091
. "$dir/env"
cd "$dir/jobs" || exit 1
out=$(mktemp)

# N=8 ranks over 4 nodes: every rank gets every other rank's 4 KiB value (two rounds, so two
# fences with the same keys' prefix differing), and a non-per-rank key put by rank 0.
exchange_ok() {  # mpi
  timeout 120 srun -N4 -n8 --mpi="$1" "$peer" exchange 4096 20000 2 >"$out" 2>&1 &&
    [ "$(grep -c "\"backend\":\"$1\",\"exchange_us\"" "$out")" -eq 8 ] || { cat "$out"; false; }
}
shared_ok() {  # mpi
  timeout 120 srun -N4 -n8 --mpi="$1" "$peer" shared 20000 >"$out" 2>&1 &&
    [ "$(grep -c "\"backend\":\"$1\",\"shared\":\"ok\"" "$out")" -eq 8 ] || { cat "$out"; false; }
}
# Without --mpi and without a store address there is no wireup: one clear error, no hang.
no_wireup_is_an_error() {
  ! timeout 60 srun -N1 -n1 --mpi=none env -u PMI_FD -u PMI_RANK "$peer" shared 1000 >"$out" 2>&1 &&
    grep -q "no wireup found" "$out" || { cat "$out"; false; }
}

check "pmix: 8 ranks on 4 nodes exchange 4 KiB values" exchange_ok pmix
check "pmi2: 8 ranks on 4 nodes exchange 4 KiB values (base64url, split over keys)" exchange_ok pmi2
check "pmix: a key put by rank 0 but named after rank 7 is found by every rank (PMIX_RANK_UNDEF)" shared_ok pmix
check "pmi2: a key put by rank 0 but named after rank 7 is found by every rank" shared_ok pmi2
check "srun --mpi=none without a tcp store: 'no wireup found'" no_wireup_is_an_error
rm -f "$out"
exit $((failures > 0))
