#!/usr/bin/env python3
"""The Debian packages end to end: build them from a copy of the tree (dpkg-buildpackage -us -uc
-b), check them with lintian, install them (dpkg -i), run one `srun --topolaunch=auto` job on the
private Slurm test cluster with the INSTALLED plugin, purge them, and check that no file they
installed is left. Runs as root (dpkg, and slurmd switching users). Prints the phases' times as
one JSON line at the end.

  debian_package.py --source-root . --oracle build/tests/slurm/map_oracle [--keep DIR]
      [--prebuilt DIR]

--prebuilt takes the .debs and .changes that an earlier run (or dpkg-buildpackage) left in DIR
instead of building them, to repeat the rest without the build's minutes.
TOPOLAUNCH_SLURM_LOCK=FILE holds flock(FILE) while the test cluster runs, and only then, where
several people's slurm suites share a machine (the build takes minutes and needs no lock); do not
also run the test under flock on the same file.
"""

import argparse
import contextlib
import fcntl
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

PACKAGES = ["topolaunch", "topolaunch-slurm-plugin"]
PLUGIN_PACKAGE = "topolaunch-slurm-plugin"
PREREQUISITES = [  # (program, Debian package)
    ("dpkg-buildpackage", "dpkg-dev"),
    ("dh", "debhelper"),
    ("lintian", "lintian"),
    ("git", "git"),
]
FAILURES = []


class Fatal(Exception):
    pass


def check(condition, message):
    if not condition:
        FAILURES.append(message)
        print("FAIL " + message, flush=True)
    return condition


def run(argv, log=None, **kwargs):
    """Runs argv; its output goes to `log` (a path) or is returned. Raises Fatal on failure."""
    if log:
        with open(log, "w") as out:
            proc = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, text=True, **kwargs)
        if proc.returncode != 0:
            with open(log) as f:
                tail = f.read()[-4000:]
            raise Fatal("%s exited %d; the end of %s:\n%s" % (" ".join(argv), proc.returncode,
                                                             log, tail))
        return ""
    proc = subprocess.run(argv, capture_output=True, text=True, **kwargs)
    if proc.returncode != 0:
        raise Fatal("%s exited %d: %s" % (" ".join(argv), proc.returncode,
                                          (proc.stderr or proc.stdout).strip()[-4000:]))
    return proc.stdout


def package_state(name):
    proc = subprocess.run(["dpkg-query", "-W", "-f=${db:Status-Abbrev}", name],
                          capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else ""


def copy_tree(source, target):
    """The files git would commit (tracked and untracked, not ignored): no build folders."""
    listing = run(["git", "-C", source, "ls-files", "-z", "--cached", "--others",
                   "--exclude-standard"])
    names = [n for n in listing.split("\0") if n and os.path.lexists(os.path.join(source, n))]
    os.makedirs(target)
    for name in names:
        src, dst = os.path.join(source, name), os.path.join(target, name)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if os.path.islink(src):
            os.symlink(os.readlink(src), dst)
        else:
            shutil.copy2(src, dst)


def deb_contents(deb):
    """Paths a .deb installs: files (and links) and folders, without the leading '.'."""
    files, dirs = [], []
    for line in run(["dpkg-deb", "--contents", deb]).split("\n"):
        if not line.strip():
            continue
        path = line.split(None, 5)[5].split(" -> ")[0]
        path = path[1:] if path.startswith(".") else path
        if path.endswith("/"):
            if path != "/":
                dirs.append(path.rstrip("/"))
        else:
            files.append(path)
    return files, dirs


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--source-root", required=True)
    parser.add_argument("--oracle", required=True, help="tests/slurm's map_oracle (build tree)")
    parser.add_argument("--keep", help="build in this (empty) folder and keep it")
    parser.add_argument("--prebuilt", help="use the packages in this folder, do not build")
    args = parser.parse_args()
    source = os.path.abspath(args.source_root)
    missing = [(p, pkg) for p, pkg in PREREQUISITES if not shutil.which(p)]
    for program, package in missing:
        print("FAIL prerequisites: %s not found: apt-get install %s" % (program, package))
    if missing:
        return 1
    if os.geteuid() != 0:
        print("FAIL prerequisites: the package test runs as root (dpkg -i, dpkg --purge)")
        return 1
    for name in PACKAGES:
        state = package_state(name)
        if state and not state.startswith("un"):
            print("FAIL %s is already on this machine (dpkg state %r): the test installs and "
                  "purges its own build; purge it first (dpkg --purge %s)" % (name, state, name))
            return 1

    timings = {}
    work = args.prebuilt or args.keep or tempfile.mkdtemp(prefix="topolaunch-deb-")
    os.makedirs(work, exist_ok=True)
    t_all = time.monotonic()
    installed = False
    try:
        # --- build -------------------------------------------------------------------------
        t0 = time.monotonic()
        if not args.prebuilt:
            tree = os.path.join(work, "topolaunch")
            copy_tree(source, tree)
            env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
            # noddebs: no -dbgsym packages, which nothing here installs (saves their strip
            # and lintian time).
            env["DEB_BUILD_OPTIONS"] = "parallel=%d noddebs" % os.cpu_count()
            run(["dpkg-buildpackage", "-us", "-uc", "-b"], log=os.path.join(work, "build.log"),
                cwd=tree, env=env, timeout=3000)
        timings["build_s"] = round(time.monotonic() - t0, 1)
        debs = {}
        for name in PACKAGES:
            found = glob.glob(os.path.join(work, "%s_*.deb" % name))
            if not check(len(found) == 1, "expected one %s .deb, found %s" % (name, found)):
                raise Fatal("the build did not produce the packages")
            debs[name] = found[0]
        changes = glob.glob(os.path.join(work, "topolaunch_*.changes"))
        print("built in %.0fs: %s" % (timings["build_s"],
                                      ", ".join(os.path.basename(d) for d in debs.values())))

        # --- lintian: no error, warning or info tag that debian/*lintian-overrides does not
        # explain ------------------------------------------------------------------------------
        t0 = time.monotonic()
        proc = subprocess.run(["lintian", "--display-info", "--fail-on", "error,warning,info"]
                              + changes, capture_output=True, text=True, timeout=900)
        timings["lintian_s"] = round(time.monotonic() - t0, 1)
        # lintian says once that it runs as root; that is no tag.
        report = "\n".join(l for l in (proc.stdout + proc.stderr).split("\n")
                           if l.strip() and "running with root privileges" not in l)
        print("lintian (%.0fs, exit %d): %s" % (timings["lintian_s"], proc.returncode,
                                                report or "no tags"))
        check(proc.returncode == 0 and not report, "lintian is not clean")

        # --- the plugin's Depends: the Slurm release it was built against ----------------------
        depends = run(["dpkg-deb", "--field", debs[PLUGIN_PACKAGE], "Depends"]).strip()
        slurm = run(["dpkg-query", "-W", "-f=${Version}", "slurm-wlm-basic-plugins"]).strip()
        release = ".".join(slurm.split(".")[:2])
        print("%s Depends: %s (installed Slurm: %s)" % (PLUGIN_PACKAGE, depends, slurm))
        check("slurm-wlm-basic-plugins (>= %s" % release in depends and
              "slurm-wlm-basic-plugins (<< " in depends,
              "the plugin does not depend on Slurm %s's plugin package: %s" % (release, depends))

        # --- the programs' Recommends: the libraries they dlopen on first use ----------------
        # (shlibs finds no NEEDED entry for them, so nothing else would pull them in)
        main_deb = debs["topolaunch"]
        recommends = run(["dpkg-deb", "--field", main_deb, "Recommends"]).strip()
        print("%s Recommends: %s" % (os.path.basename(main_deb), recommends))
        for lib in ("libucx0", "libibverbs1", "libpmix2", "libpmi2-0"):
            check(lib in recommends.replace(",", " ").split(),
                  "%s does not recommend %s, which it dlopens: %s" % (main_deb, lib, recommends))

        # --- install -----------------------------------------------------------------------
        contents = {name: deb_contents(deb) for name, deb in debs.items()}
        existed_before = {p for files, dirs in contents.values() for p in files + dirs
                          if os.path.lexists(p)}
        for name, (files, _) in contents.items():
            check(not (set(files) & existed_before),
                  "%s would overwrite files already here: %s" % (name,
                                                                sorted(set(files) &
                                                                       existed_before)))
        t0 = time.monotonic()
        installed = True
        run(["dpkg", "-i"] + [debs[n] for n in PACKAGES], log=os.path.join(work, "install.log"))
        timings["install_s"] = round(time.monotonic() - t0, 1)
        for name, (files, _) in contents.items():
            listed = {l for l in run(["dpkg", "-L", name]).split("\n")
                      if l and not os.path.isdir(l)}
            check(listed == set(files), "dpkg -L %s differs from the .deb: %s" %
                  (name, sorted(listed ^ set(files))))
            absent = [f for f in files if not os.path.lexists(f)]
            check(not absent, "%s: installed files missing: %s" % (name, absent))
            print("%s installed %d files:" % (name, len(files)))
            for f in sorted(files):
                print("  " + f)
        plugin = next((f for f in contents[PLUGIN_PACKAGE][0]
                       if f.endswith("/spank_topolaunch.so")), None)
        if not check(plugin is not None and plugin.startswith("/usr/lib/"),
                     "no installed spank_topolaunch.so under /usr/lib: %s" % plugin):
            raise Fatal("nothing to run the job with")
        snippet = "/etc/slurm/plugstack.conf.d/topolaunch.conf"
        if check(snippet in contents[PLUGIN_PACKAGE][0], "no %s in the plugin package" % snippet):
            with open(snippet) as f:
                check(("#required %s " % plugin) in f.read(),
                      "%s: its example line does not name %s" % (snippet, plugin))
        # The installed programs run from PATH; the example configs they ship are valid.
        for example in sorted(glob.glob("/usr/share/doc/topolaunch/examples/jobs/*.toml")):
            proc = subprocess.run(["/usr/bin/topolaunch", "check", "-q", example],
                                  capture_output=True, text=True, timeout=60)
            check(proc.returncode == 0, "topolaunch check %s: exit %d: %s" %
                  (example, proc.returncode, proc.stderr.strip()))
        proc = subprocess.run(["/usr/bin/topodiag", "--version"], capture_output=True, text=True)
        check(proc.returncode == 0 and proc.stdout.startswith("topodiag "),
              "/usr/bin/topodiag --version: %s" % (proc.stdout + proc.stderr).strip())

        # --- one srun --topolaunch=auto job with the installed plugin --------------------------
        scripts = os.path.join(source, "tests", "slurm")
        with contextlib.ExitStack() as held:
            if os.environ.get("TOPOLAUNCH_SLURM_LOCK"):
                t0 = time.monotonic()
                lock = held.enter_context(open(os.environ["TOPOLAUNCH_SLURM_LOCK"], "a"))
                fcntl.flock(lock, fcntl.LOCK_EX)
                timings["slurm_lock_wait_s"] = round(time.monotonic() - t0, 1)
            t0 = time.monotonic()
            proc = subprocess.run([sys.executable, os.path.join(scripts, "slurm_suite.py"),
                                   "--plugin", plugin, "--oracle", args.oracle, "--scripts",
                                   scripts, "-k", "map_two_dgx_h100"], capture_output=True,
                                  text=True, timeout=300)
        timings["srun_job_s"] = round(time.monotonic() - t0, 1)
        print(proc.stdout.strip())
        check(proc.returncode == 0 and "PASS map_two_dgx_h100" in proc.stdout,
              "srun --topolaunch=auto with %s failed: %s" % (plugin, proc.stderr.strip()[-2000:]))
    except Fatal as e:
        check(False, str(e))
    except subprocess.TimeoutExpired as e:
        check(False, "timed out: %s" % " ".join(e.cmd))
    finally:
        # --- purge, and nothing of the packages is left ------------------------------------
        if installed:
            t0 = time.monotonic()
            proc = subprocess.run(["dpkg", "--purge"] + PACKAGES[::-1], capture_output=True,
                                  text=True)
            timings["purge_s"] = round(time.monotonic() - t0, 1)
            check(proc.returncode == 0, "dpkg --purge: %s" % (proc.stdout + proc.stderr).strip())
            left = []
            for name, (files, dirs) in contents.items():
                left += [p for p in files + dirs if p not in existed_before and
                         os.path.lexists(p)]
                left += glob.glob("/var/lib/dpkg/info/%s.*" % name)
                left += glob.glob("/var/lib/dpkg/info/%s:*" % name)
            left += glob.glob("/etc/slurm/plugstack.conf.d/topolaunch.conf*")
            for name in PACKAGES:
                state = package_state(name)
                check(not state or state.startswith("un"), "%s still known to dpkg as %r"
                      % (name, state))
            check(not left, "left after the purge: %s" % sorted(set(left)))
            if not left:
                print("purged: none of the %d installed paths is left" %
                      sum(len(f) + len(d) for f, d in contents.values()))
        if not (args.keep or args.prebuilt) and not FAILURES:
            shutil.rmtree(work, ignore_errors=True)
        elif FAILURES:
            print("build and logs kept in %s" % work)
    timings["total_s"] = round(time.monotonic() - t_all, 1)
    timings["failed"] = len(FAILURES)
    print(json.dumps(timings))
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
