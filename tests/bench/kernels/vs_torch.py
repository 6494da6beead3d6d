#!/usr/bin/env python3
"""One GPU benchmark against its PyTorch peer in the same run (meson test --benchmark --suite gpu).

  vs_torch.py NAME OUT_DIR OURS_EXE [ARGS...] [-- PEER.py [ARGS...]] [--env K=V ...]

Runs our benchmark (JSON on stdout) into OUT_DIR/NAME-ours.json, then the peer, which reads that
file as its first argument and prints the comparison (ratios), into OUT_DIR/NAME.json, and prints
both. Without a peer (classifier_bench compares its own kernels) the ours file is the result.
"""
import os
import subprocess
import sys

NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                "NVSHMEM_DISABLE_NVLS": "1"}


def main():
    name, out_dir = sys.argv[1], sys.argv[2]
    rest = sys.argv[3:]
    env = dict(os.environ, **NO_MULTICAST)
    while "--env" in rest:
        i = rest.index("--env")
        key, _, value = rest[i + 1].partition("=")
        env[key] = value
        del rest[i:i + 2]
    ours_cmd, peer_cmd = (rest[:rest.index("--")], rest[rest.index("--") + 1:]) \
        if "--" in rest else (rest, [])
    os.makedirs(out_dir, exist_ok=True)
    ours_path = os.path.join(out_dir, f"{name}-ours.json")
    with open(ours_path, "w") as out:
        rc = subprocess.run(ours_cmd, stdout=out, env=env).returncode
    print(open(ours_path).read(), end="", flush=True)
    if rc != 0:
        sys.exit(f"{name}: {' '.join(ours_cmd)} failed (exit {rc})")
    if not peer_cmd:
        return 0
    result_path = os.path.join(out_dir, f"{name}.json")
    with open(result_path, "w") as out:
        rc = subprocess.run([sys.executable, peer_cmd[0], ours_path] + peer_cmd[1:], stdout=out,
                            env=env).returncode
    print(open(result_path).read(), end="", flush=True)
    if rc != 0:
        sys.exit(f"{name}: the PyTorch peer {peer_cmd[0]} failed (exit {rc})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
