#!/usr/bin/env python3
"""Hostile inputs to the programs: each must end in exit status 2 with one line on stderr that
names the file, never a crash (research/hostile-inputs.md has what the probes found).

usage: hostile_inputs.py CASE --topolaunch T --worker W --topodiag D --source-root R
"""
import argparse
import os
import signal
import subprocess
import sys
import tempfile

# Table headers that abort toml++ 3.3.0 (Debian 12) inside parse_key().
TOML_CRASH_HEADERS = ["[+]", "[*]", "[.]", "[[[", "[[[1]]]", "[[="]


def fail(message):
    print("FAIL:", message)
    sys.exit(1)


def one_clean_line(argv, name, env=None, timeout=30):
    """Runs argv; asserts exit 2 and exactly one stderr line naming `name`; returns the line."""
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, **(env or {})))
    shown = " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(argv))
    if proc.returncode < 0:
        fail("%s died of %s" % (shown, signal.Signals(-proc.returncode).name))
    if proc.returncode != 2:
        fail("%s: exit %d (want 2); stderr: %s" % (shown, proc.returncode, proc.stderr.strip()))
    lines = [l for l in proc.stderr.split("\n") if l.strip()]
    if len(lines) != 1:
        fail("%s: %d stderr lines (want 1): %s" % (shown, len(lines), proc.stderr.strip()))
    if name not in lines[0]:
        fail("%s: the line does not name %s: %s" % (shown, name, lines[0]))
    print("ok  %-60s %s" % (shown[:60], lines[0]))
    return lines[0]


def write(directory, name, text):
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        f.write(text)
    return path


def toml_crash_headers(args, tmp):
    """The 4-byte configs that aborted `check`, `run` and the worker (finding 14.1)."""
    for i, header in enumerate(TOML_CRASH_HEADERS):
        name = "crash%d.toml" % i
        path = write(tmp, name, header + "\n")
        for argv in ([args.topolaunch, "check", path],
                     [args.topolaunch, "run", path, "--job-dir", os.path.join(tmp, "job%d" % i)],
                     [args.topolaunch, "map", path],
                     [args.worker, "--plan-only", path]):
            line = one_clean_line(argv, name)
            if "TOML syntax error" not in line or ":1:" not in line:
                fail("reason does not give the line and the TOML error: " + line)
        # Behind a valid table, on a later line: the place is still right.
        path = write(tmp, "late%d.toml" % i, '[job]\nname = "x"\n' + header + "\n")
        line = one_clean_line([args.topolaunch, "check", path], "late%d.toml:3:" % i)


def xml_dtd_subset(args, tmp):
    """An internal DTD subset crashed hwloc 2.9's libxml importer (finding 14.2)."""
    real = os.path.join(args.source_root, "..", "shared", "topologies", "generated",
                        "dgx-h100.pci.xml")
    with open(real) as f:
        body = f.read()
    head, _, rest = body.partition("<topology")
    head = head.replace('<!DOCTYPE topology SYSTEM "hwloc2.dtd">', "")
    variants = {
        "dtd-empty.xml": '<!DOCTYPE x []>\n<topology version="2.0"></topology>',
        "dtd-real.xml": head + "<!DOCTYPE topology [<!ELEMENT topology ANY>]>\n<topology" + rest,
        "entity.xml": head + '<!DOCTYPE topology [<!ENTITY a "b">]>\n<topology' + rest,
    }
    job = os.path.join(args.source_root, "configs", "jobs", "tiny-gpt-cpu.toml")
    for name, text in variants.items():
        path = write(tmp, name, text)
        one_clean_line([args.topodiag, "--input", path], name)
        one_clean_line([args.topolaunch, "map", job, "--topology", path], name)


def xml_minimal_importer(args, tmp):
    """User XML is read by hwloc's minimal parser even when the environment asks for libxml2:
    single-quoted attributes, which libxml2 accepts and the minimal parser does not, are refused."""
    real = os.path.join(args.source_root, "..", "shared", "topologies", "generated",
                        "dgx-h100.pci.xml")
    with open(real) as f:
        lines = f.read().split("\n")
    text = "\n".join([lines[0]] + [l.replace('"', "'") for l in lines[1:]])
    path = write(tmp, "single-quoted.xml", text)
    env = {"HWLOC_LIBXML": "1", "HWLOC_LIBXML_IMPORT": "1"}
    one_clean_line([args.topodiag, "--input", path], "single-quoted.xml", env=env)
    # The same file with double quotes loads: the refusal is the parser's, not the content's.
    proc = subprocess.run([args.topodiag, "--input", real, "--json"], capture_output=True,
                          text=True, env=dict(os.environ, **env), timeout=30)
    if proc.returncode not in (0, 1, 3):
        fail("the double-quoted original did not load: %s" % proc.stderr.strip())
    print("ok  the double-quoted original loads (exit %d)" % proc.returncode)


CASES = {"toml_crash_headers": toml_crash_headers, "xml_dtd_subset": xml_dtd_subset,
         "xml_minimal_importer": xml_minimal_importer}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("case", choices=sorted(CASES))
    p.add_argument("--topolaunch", required=True)
    p.add_argument("--worker", required=True)
    p.add_argument("--topodiag", required=True)
    p.add_argument("--source-root", required=True)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="topolaunch-fault-") as tmp:
        CASES[args.case](args, tmp)
    print("PASS", args.case)


if __name__ == "__main__":
    main()
