#!/usr/bin/env python3
"""Compares what `topodiag --json` says about this node with what `nvidia-smi` says, which must
agree: per GPU its place in the order (PCI bus id of index i), its NUMA node and CPU
affinity; per pair of devices (GPUs and NICs) the relation cell (NV#, PIX, PXB, PHB, NODE, SYS).
Prints one line per check with `agree` or `DISAGREE`, then a verdict; writes one JSON line with the
counts to --jsonl (appended). Exit status 0 when everything agrees, 1 when something disagrees,
2 when an input cannot be read or parsed.

  compare_topology.py TOPO_M.txt GPUS.csv TOPODIAG.json [--jsonl FILE]
  compare_topology.py --live TOPODIAG_EXE [--jsonl FILE]   (suite gpu: runs nvidia-smi and
                                                             topodiag --json on this node itself)

TOPO_M.txt: `nvidia-smi topo -m` as printed (ANSI underline codes and tabs are fine).
GPUS.csv:   `nvidia-smi --query-gpu=index,pci.bus_id --format=csv,noheader`.
One rule is not a plain equality: nvidia-smi prints NUMA "N/A" when the kernel gives the GPU no
NUMA node (common in virtual machines); that counts as agreeing with topodiag's node only when the
machine has exactly one NUMA node (then there is no other node the GPU could belong to), and the
line says so.
"""
import json
import os
import re
import sys

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
DEVICE = re.compile(r"^(?:GPU|NIC)\d+$")


def cpu_ids(text):
    """'0-3,8' -> {0,1,2,3,8}; None for N/A or empty."""
    if text is None or text.strip() in ("", "N/A"):
        return None
    out = set()
    for part in text.strip().split(","):
        a, _, b = part.partition("-")
        out.update(range(int(a), int(b or a) + 1))
    return out


def bus_id(text):
    """'00000000:1B:00.0' / '0000:1b:00.0' -> (0, 0x1b, 0, 0)."""
    m = re.match(r"\s*(?:([0-9a-fA-F]+):)?([0-9a-fA-F]+):([0-9a-fA-F]+)\.([0-7])\s*$", text)
    if not m:
        raise ValueError(f"not a PCI bus id: {text!r}")
    return tuple(int(g or "0", 16) for g in m.groups())


def parse_topo_m(text):
    """Returns (labels, rows, nic_names): rows[label] = {"cells": {label: cell}, "cpus", "numa"}."""
    lines = [ANSI.sub("", line).rstrip() for line in text.splitlines()]
    header = None
    for line in lines:
        tokens = line.split()
        # the header starts with whitespace and names the devices; a row starts with its label
        if tokens and tokens[0] == "GPU0" and line[:1].isspace():
            header = tokens
            break
    if header is None:
        raise ValueError("no header line with GPU0 in the nvidia-smi topo -m output")
    labels = [t for t in header if DEVICE.match(t)]
    rows = {}
    for line in lines:
        tokens = line.split()
        if not tokens or line[:1].isspace() or tokens[0] not in labels:
            continue
        if len(tokens) < 1 + len(labels):
            raise ValueError(f"short row in nvidia-smi topo -m: {line!r}")
        cells = dict(zip(labels, tokens[1:1 + len(labels)]))
        rest = tokens[1 + len(labels):]
        rows[tokens[0]] = {"cells": cells,
                           "cpus": rest[0] if len(rest) > 0 else None,
                           "numa": rest[1] if len(rest) > 1 else None}
    nic_names = {}
    for line in lines:
        m = re.match(r"^\s*(NIC\d+):\s*(\S+)\s*$", line)
        if m:
            nic_names[m.group(1)] = m.group(2)
    return labels, rows, nic_names


def parse_gpu_csv(text):
    """'0, 00000000:06:00.0' lines -> {index: busid tuple}."""
    out = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        index, busid = [f.strip() for f in line.split(",")[:2]]
        out[int(index)] = bus_id(busid)
    return out


def compare(topo_m_text, gpu_csv_text, diag):
    """Returns a list of (check, agrees, detail)."""
    labels, rows, nic_names = parse_topo_m(topo_m_text)
    smi_bus = parse_gpu_csv(gpu_csv_text)
    numa_nodes = [n for n in diag.get("numa", []) if n.get("subtype") is None]
    diag_gpus = {g["index"]: g for g in diag.get("gpus", [])}
    diag_nics = {n["index"]: n for n in diag.get("nics", [])}
    diag_matrix = diag.get("matrix", {})
    checks = []

    smi_gpus = [lab for lab in labels if lab.startswith("GPU")]
    smi_nics = [lab for lab in labels if lab.startswith("NIC")]
    checks.append(("GPU count", len(smi_gpus) == len(diag_gpus) == len(smi_bus),
                   f"nvidia-smi topo -m {len(smi_gpus)}, --query-gpu {len(smi_bus)}, "
                   f"topodiag {len(diag_gpus)}"))
    checks.append(("NIC count", len(smi_nics) == len(diag_nics),
                   f"nvidia-smi {len(smi_nics)}, topodiag {len(diag_nics)}"))

    for i in sorted(set(smi_bus) | set(diag_gpus)):
        g = diag_gpus.get(i)
        smi = smi_bus.get(i)
        ours = bus_id(g["busid"]) if g else None
        checks.append((f"GPU{i} bus id (order)", smi is not None and smi == ours,
                       f"nvidia-smi {fmt_bus(smi)}, topodiag {fmt_bus(ours)}"))
        row = rows.get(f"GPU{i}")
        if row is None or g is None:
            continue
        smi_numa, diag_numa = row["numa"], g.get("numa")
        if smi_numa in (None, "N/A"):
            if diag_numa is None:
                checks.append((f"GPU{i} NUMA", True, "nvidia-smi N/A, topodiag null"))
            else:
                only = len(numa_nodes) == 1 and numa_nodes[0].get("os_index") == diag_numa
                checks.append((f"GPU{i} NUMA", only,
                               f"nvidia-smi N/A, topodiag {diag_numa}"
                               + (" (the machine's only NUMA node)" if only else "")))
        else:
            checks.append((f"GPU{i} NUMA", diag_numa is not None and int(smi_numa) == diag_numa,
                           f"nvidia-smi {smi_numa}, topodiag {diag_numa}"))
        smi_cpus, diag_cpus = cpu_ids(row["cpus"]), cpu_ids(g.get("cpus"))
        checks.append((f"GPU{i} CPU affinity", smi_cpus == diag_cpus,
                       f"nvidia-smi {row['cpus']}, topodiag {g.get('cpus')}"))

    for k, name in sorted(nic_names.items()):
        n = diag_nics.get(int(k[3:]))
        theirs = n.get("name") if n else None
        checks.append((f"{k} name", name == theirs, f"nvidia-smi {name}, topodiag {theirs}"))

    for a_i, a in enumerate(labels):
        for b in labels[a_i + 1:]:
            smi_ab = rows.get(a, {}).get("cells", {}).get(b)
            smi_ba = rows.get(b, {}).get("cells", {}).get(a)
            ours_ab = diag_matrix.get(a, {}).get(b)
            ours_ba = diag_matrix.get(b, {}).get(a)
            good = smi_ab is not None and smi_ab == ours_ab and smi_ba == ours_ba
            detail = f"nvidia-smi {smi_ab}, topodiag {ours_ab}"
            if smi_ab != smi_ba or ours_ab != ours_ba:
                detail += f" (reverse: nvidia-smi {smi_ba}, topodiag {ours_ba})"
            checks.append((f"{a}-{b} relation", good, detail))
    return checks


def fmt_bus(t):
    return "missing" if t is None else f"{t[0]:04x}:{t[1]:02x}:{t[2]:02x}.{t[3]}"


def live_inputs(topodiag):
    """This node's `nvidia-smi topo -m`, GPU list and `topodiag --json`, as the three inputs."""
    import subprocess
    import tempfile
    folder = tempfile.mkdtemp(prefix="compare-topology-")
    commands = {"topo-m.txt": ["nvidia-smi", "topo", "-m"],
                "gpus.csv": ["nvidia-smi", "--query-gpu=index,pci.bus_id", "--format=csv,noheader"],
                "topodiag.json": [topodiag, "--json"]}
    paths = []
    for name, cmd in commands.items():
        path = os.path.join(folder, name)
        with open(path, "w") as out:
            # topodiag's exit status reports findings (warnings on a VM are expected): only an
            # output that cannot be read fails the comparison
            subprocess.run(cmd, stdout=out, timeout=120)
        paths.append(path)
    return paths


def main(argv):
    args = argv[1:]
    jsonl = None
    if "--jsonl" in args:
        i = args.index("--jsonl")
        jsonl = args[i + 1]
        del args[i:i + 2]
    if len(args) == 2 and args[0] == "--live":
        args = live_inputs(args[1])
    if len(args) != 3:
        print("usage: compare_topology.py TOPO_M.txt GPUS.csv TOPODIAG.json [--jsonl FILE]",
              file=sys.stderr)
        return 2
    try:
        topo_m = open(args[0], errors="replace").read()
        gpus = open(args[1], errors="replace").read()
        diag = json.load(open(args[2]))
        checks = compare(topo_m, gpus, diag)
    except (OSError, ValueError, KeyError) as e:
        print(f"compare_topology: cannot compare: {e}", file=sys.stderr)
        if jsonl:
            with open(jsonl, "a") as f:
                f.write(json.dumps({"kind": "topology_compare", "verdict": "error",
                                    "error": str(e)}) + "\n")
        return 2
    width = max(len(c[0]) for c in checks)
    for name, good, detail in checks:
        print(f"{name:<{width}}  {'agree' if good else 'DISAGREE'}  ({detail})")
    bad = [c for c in checks if not c[1]]
    verdict = "agree" if not bad else "disagree"
    print(f"topodiag vs nvidia-smi: {verdict.upper()} ({len(checks) - len(bad)} of {len(checks)} "
          f"checks agree)")
    if jsonl:
        with open(jsonl, "a") as f:
            f.write(json.dumps({"kind": "topology_compare", "verdict": verdict,
                                "checks": len(checks), "disagree": len(bad),
                                "disagreements": [f"{c[0]}: {c[2]}" for c in bad]}) + "\n")
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
