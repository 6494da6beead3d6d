#!/usr/bin/env python3
"""The installed programs and the SPANK plugin must not link UCX, ibverbs, PMIx or PMI2; those
that carry their C++ runtime must not load libstdc++, libgcc_s or libfmt either.

usage: needed_libraries.py BINARY... [--runtime-linked-in BINARY...]
UCX, ibverbs, PMIx and PMI2 are dlopened on first use (rdma/src/ucx_api.cpp, verbs_api.cpp,
wireup/src/pmix_api.cpp, pmi2_api.cpp): a NEEDED entry for one of them would make every process
start load it and the libraries it pulls in, and a node without it could not start the program at
all. The binaries after --runtime-linked-in (`topolaunch` and the plugin, common/meson.build's
runtime_*) start or are loaded once per node of every step and link libstdc++, libgcc and fmt in.
Reads the dynamic section with readelf -d (binutils); without readelf the test fails.
"""
import re
import shutil
import subprocess
import sys

FORBIDDEN = re.compile(r"^lib(ucp|ucs|uct|ucm|ibverbs|rdmacm|pmix|pmi2)[.-]")
SHARED_RUNTIME = re.compile(r"^lib(stdc\+\+|gcc_s|fmt)\.so")


def needed(binary):
    out = subprocess.run(["readelf", "-d", "-W", binary], capture_output=True, text=True,
                         check=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def main():
    if shutil.which("readelf") is None:
        print("FAIL: readelf not found (binutils)")
        return 1
    ok = True
    args = sys.argv[1:]
    split = args.index("--runtime-linked-in") if "--runtime-linked-in" in args else len(args)
    linked_in = set(args[split + 1:])
    for binary in args[:split] + args[split + 1:]:
        names = needed(binary)
        bad = [n for n in names if FORBIDDEN.match(n)]
        if binary in linked_in:
            bad += [n for n in names if SHARED_RUNTIME.match(n)]
        print(f"{binary}: {len(names)} NEEDED: {' '.join(names)}")
        if not names:
            print(f"FAIL: {binary}: no NEEDED entries at all (not a dynamic ELF file?)")
            ok = False
        if bad:
            print(f"FAIL: {binary} links {', '.join(bad)} (dlopen UCX, ibverbs, PMIx and PMI2 on "
                  "first use; link the C++ runtime in where it must be)")
            ok = False
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
