#!/usr/bin/env python3
"""`meson install --destdir` into a temporary folder: exactly the files of the manifest, man pages
that render without a warning, completions bash can parse, programs that are executable, and a
plugstack.conf.d snippet whose example line names the installed plugin.

  check_install.py --meson meson --build-root build --manifest install-manifest.txt \
      [--spank] --var bindir=/usr/local/bin --var mandir=... [--keep DIR]

Prints every installed file; exit 1 on any difference, naming it.
"""

import argparse
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile

FAILURES = []


def check(condition, message):
    if not condition:
        FAILURES.append(message)
        print("FAIL " + message)
    return condition


def expected_files(manifest, variables, spank):
    files = set()
    with open(manifest) as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if line.startswith("spank:"):
                if not spank:
                    continue
                line = line[len("spank:"):].strip()
            try:
                files.add(os.path.normpath(line.format(**variables)))
            except KeyError as e:
                raise SystemExit("%s:%d: unknown folder {%s}" % (manifest, number, e.args[0]))
    return files


def installed_files(destdir):
    files = set()
    for top, dirs, names in os.walk(destdir):
        for name in names + [d for d in dirs if os.path.islink(os.path.join(top, d))]:
            files.add("/" + os.path.relpath(os.path.join(top, name), destdir))
    return files


def check_man_page(path, shown):
    """Renders as lintian does (manpage-has-errors-from-man) and with every groff warning on."""
    env = dict(os.environ, LC_ALL="C.UTF-8", MANROFFSEQ="", MANWIDTH="80")
    for argv in (["man", "--warnings", "-E", "UTF-8", "-l", "-Tutf8", "-Z", path],
                 ["groff", "-ww", "-z", "-man", "-Tutf8", path]):
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
        check(proc.returncode == 0 and not proc.stderr.strip(),
              "%s: %s: exit %d: %s" % (shown, argv[0], proc.returncode, proc.stderr.strip()))
    section = os.path.basename(os.path.dirname(path))[len("man"):]
    name = os.path.basename(path).rsplit(".", 1)[0]
    with open(path, errors="replace") as f:
        header = next((l for l in f if l.startswith(".TH ")), "")
    words = header.split()
    check(len(words) >= 3 and words[1].lower() == name.lower() and words[2] == section,
          "%s: .TH says %r, the file is %s(%s)" % (shown, " ".join(words[1:3]), name, section))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--meson", required=True)
    parser.add_argument("--build-root", required=True)
    parser.add_argument("--manifest", required=True)
    parser.add_argument("--var", action="append", default=[], help="NAME=FOLDER for the manifest")
    parser.add_argument("--spank", action="store_true", help="the SPANK plugin is built")
    parser.add_argument("--keep", help="install here and keep it (default: a temporary folder)")
    args = parser.parse_args()
    variables = dict(v.split("=", 1) for v in args.var)
    for program, package in (("man", "man-db"), ("groff", "groff-base")):
        if not shutil.which(program):
            print("FAIL %s not found: apt-get install %s" % (program, package))
            return 1

    destdir = args.keep or tempfile.mkdtemp(prefix="topolaunch-install-")
    try:
        proc = subprocess.run([args.meson, "install", "-C", args.build_root, "--no-rebuild",
                               "--destdir", destdir], capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            print("FAIL meson install exited %d:\n%s%s" % (proc.returncode, proc.stdout,
                                                           proc.stderr))
            return 1
        got = installed_files(destdir)
        want = expected_files(args.manifest, variables, args.spank)
        print("installed (%d files):" % len(got))
        for path in sorted(got):
            print("  " + path)
        for path in sorted(got - want):
            check(False, "installed but not in the manifest: %s" % path)
        for path in sorted(want - got):
            check(False, "in the manifest but not installed: %s" % path)

        mandir = variables.get("mandir", "")
        for path in sorted(got):
            real = destdir + path
            if mandir and re.match(re.escape(mandir) + r"/man\d/", path):
                check_man_page(real, path)
            if path.startswith(variables.get("bindir", "\0") + "/"):
                mode = os.stat(real).st_mode
                check(mode & stat.S_IXOTH and mode & stat.S_IROTH,
                      "%s: mode %o is not executable by all" % (path, mode & 0o777))
            if path.startswith(variables.get("completionsdir", "\0") + "/"):
                proc = subprocess.run(["bash", "-n", real], capture_output=True, text=True)
                check(proc.returncode == 0, "%s: bash -n: %s" % (path, proc.stderr.strip()))

        if args.spank:
            snippet = os.path.join(variables["plugstack_dir"], "topolaunch.conf")
            plugin = os.path.join(variables["spank_plugin_dir"], "spank_topolaunch.so")
            if check(snippet in got, "no plugstack.conf.d snippet at %s" % snippet):
                with open(destdir + snippet) as f:
                    lines = [l.strip() for l in f if l.strip()]
                check(all(l.startswith("#") for l in lines),
                      "%s: a line is not commented out: installing must not enable the plugin"
                      % snippet)
                examples = [l[1:].split() for l in lines
                            if re.match(r"#(required|optional)\s", l)]
                check(len(examples) == 1 and examples[0][1] == plugin,
                      "%s: the example line should name %s: %s" % (snippet, plugin, examples))
    finally:
        if not args.keep:
            shutil.rmtree(destdir, ignore_errors=True)
    print("%d checks failed" % len(FAILURES) if FAILURES else "install checks passed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
