#!/bin/bash
# `topolaunch map` end to end: table, scores, explanation, --json, and exit 2 with file:line on bad
# input. Usage: map_cli_test.sh /path/to/topolaunch (TOPOLAUNCH_SHARED_DIR set by meson).
set -u
topolaunch="$(realpath "$1")"
fixtures="${TOPOLAUNCH_SHARED_DIR:?TOPOLAUNCH_SHARED_DIR is not set}/topologies/generated"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
expect() {  # expect <exit code> <text in output> <command...>
  local want_rc="$1" want_text="$2"; shift 2
  local out rc
  out="$("$@" 2>&1)"; rc=$?
  [ "$rc" = "$want_rc" ] || fail "$* -> exit $rc, want $want_rc: $out"
  grep -qF -- "$want_text" <<<"$out" || fail "$* -> output lacks '$want_text': $out"
}
cd "$work"
printf '[mapping]\npin_nics = true\ntensor = 8\n\n[rdma]\nnics = "^=mlx5_1,mlx5_2,mlx5_7,mlx5_8"\n' > job.toml
printf '[mapping]\ntensor = 16\n' > tp16.toml
printf '[mapping]\npolicy = "diagonal"\n' > policy.toml
printf 'SwitchName=leaf0 Nodes=n[1,3]\nSwitchName=leaf1 Nodes=n[2,4]\nSwitchName=spine Switches=leaf[0-1]\n' > tree.conf
printf 'SwitchName=leaf0 Nodes=n[1,3]\nSwitchName=leaf1 Nodez=n[2,4]\n' > bad.conf
h100="$fixtures/dgx-h100.full.xml"

expect 0 "rank map: 32 ranks on 4 node(s), tensor 8 x pipeline 1 x data 4; nodes in switch-tree order" \
  "$topolaunch" map job.toml --topology "$h100" --nodes 4 --switch-tree tree.conf
expect 0 "why it differs from slurm-block-closest" "$topolaunch" map job.toml --topology "$h100" --nodes 4
expect 0 "mlx5_11" "$topolaunch" map job.toml --topology "$h100" --nodes 1
"$topolaunch" map job.toml --topology "$h100" "$fixtures/dgx-a100.full.xml" --json > map.json || fail "--json exit $?"
python3 -c 'import json,sys; d=json.load(open("map.json")); assert d["map"]["world_size"]==16 and len(d["scores"])==3, d["scores"]' \
  || fail "--json is not the expected JSON"
expect 2 "tensor=16 needs 16 ranks in one NVLink domain" "$topolaunch" map tp16.toml --topology "$h100" --nodes 2
expect 2 "bad.conf:2: Nodez: unknown key" "$topolaunch" map job.toml --topology "$h100" --nodes 4 --switch-tree bad.conf
expect 2 "policy.toml:2" "$topolaunch" map policy.toml --topology "$h100"
expect 2 "no-such.xml" "$topolaunch" map job.toml --topology no-such.xml

if [ "$failures" -gt 0 ]; then echo "$failures failure(s)"; exit 1; fi
echo "all map CLI checks passed"
