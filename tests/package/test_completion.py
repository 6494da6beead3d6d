#!/usr/bin/env python3
"""The bash completions of topolaunch, topolaunch-worker and topodiag, driven as bash drives them.

Each case loads bash-completion and one completion file in a fresh bash, sets COMP_WORDS,
COMP_CWORD, COMP_LINE and COMP_POINT the way readline does, calls the completion function and
reads COMPREPLY. The option lists are checked against each program's own --help, so an option
added to a program and not to its completion fails here.

  test_completion.py --bash-completion /usr/share/bash-completion/bash_completion \
      --source-root . --topolaunch T --topodiag D --worker W
"""

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile

FAILURES = []


def check(condition, message):
    if not condition:
        FAILURES.append(message)
        print("FAIL " + message)
    return condition


def complete(args, script, function, words, cwd, options=None):
    """COMPREPLY of `function` for the command line `words` (the last word is being typed).

    compopt only works inside a completion that readline started, so a stand-in records what
    the function asks of it; `options`, when given, receives those requests."""
    line = " ".join(words)
    program = "\n".join([
        "source %s" % shlex.quote(args.bash_completion),
        "source %s" % shlex.quote(script),
        'compopt() { printf "%s\\n" "$*" >>"$COMPOPT_LOG"; }',
        "COMP_WORDS=(%s)" % " ".join(shlex.quote(w) for w in words),
        "COMP_CWORD=%d" % (len(words) - 1),
        "COMP_LINE=%s" % shlex.quote(line),
        "COMP_POINT=%d" % len(line),
        "%s %s %s %s" % (function, shlex.quote(words[0]), shlex.quote(words[-1]),
                         shlex.quote(words[-2] if len(words) > 1 else "")),
        'printf "%s\\n" "${COMPREPLY[@]}"',
    ])
    log = os.path.join(cwd, ".compopt")
    open(log, "w").close()
    proc = subprocess.run(["bash", "--norc", "--noprofile", "-c", program], cwd=cwd,
                          env=dict(os.environ, COMPOPT_LOG=log),
                          capture_output=True, text=True, timeout=30)
    if options is not None:
        with open(log) as f:
            options.extend(f.read().split())
    os.remove(log)
    if proc.returncode != 0 or proc.stderr.strip():
        FAILURES.append("%s: bash failed: %s" % (line, proc.stderr.strip()))
        print("FAIL %s: bash failed (%d): %s" % (line, proc.returncode, proc.stderr.strip()))
    return {w for w in proc.stdout.split("\n") if w}


def help_text(argv):
    proc = subprocess.run(argv + ["--help"], capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise SystemExit("%s --help exited %d: %s" % (" ".join(argv), proc.returncode,
                                                      proc.stderr.strip()))
    return proc.stdout


def cli11_options(text):
    """Option spellings of a CLI11 help: the first word of each line of the Options section."""
    options, section = set(), None
    for line in text.split("\n"):
        if re.match(r"^\S.*:$", line):
            section = line[:-1]
            continue
        if section == "Options" and re.match(r"^  -", line):
            options.update(line.split()[0].split(","))
    return options


def cli11_subcommands(text):
    names, section = [], None
    for line in text.split("\n"):
        if re.match(r"^\S.*:$", line):
            section = line[:-1]
            continue
        if section == "Subcommands" and re.match(r"^  \S", line):
            names.append(line.split()[0])
    return names


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bash-completion", required=True, help="bash-completion's main script")
    parser.add_argument("--source-root", required=True)
    parser.add_argument("--topolaunch", required=True)
    parser.add_argument("--topodiag", required=True)
    parser.add_argument("--worker", required=True)
    args = parser.parse_args()
    if not os.path.isfile(args.bash_completion):
        print("FAIL %s is missing: apt-get install bash-completion" % args.bash_completion)
        return 1
    root = os.path.abspath(args.source_root)
    launcher = os.path.join(root, "launcher", "topolaunch.bash")
    topodiag = os.path.join(root, "topology", "topodiag", "topodiag.bash")
    worker = os.path.join(root, "kernels", "topolaunch-worker.bash")

    with tempfile.TemporaryDirectory() as cwd:
        for name in ("job.toml", "node.xml", "base.json", "notes.txt"):
            open(os.path.join(cwd, name), "w").close()
        os.mkdir(os.path.join(cwd, "runs"))

        # topolaunch: subcommands and each subcommand's options, as --help lists them.
        top_help = help_text([args.topolaunch])
        subcommands = cli11_subcommands(top_help)
        check(sorted(subcommands) == ["check", "map", "preflight", "report", "run"],
              "topolaunch --help lists subcommands %s" % subcommands)
        got = complete(args, launcher, "_topolaunch", ["topolaunch", ""], cwd)
        check(set(subcommands) <= got, "topolaunch <TAB>: %s lacks %s" % (sorted(got),
                                                                            subcommands))
        check("agent" not in got, "topolaunch <TAB> offers the internal agent command")
        got = complete(args, launcher, "_topolaunch", ["topolaunch", "-"], cwd)
        want = cli11_options(top_help)
        check(got == want, "topolaunch -<TAB>: %s, --help lists %s" % (sorted(got), sorted(want)))
        for sub in subcommands:
            want = cli11_options(help_text([args.topolaunch, sub]))
            got = complete(args, launcher, "_topolaunch", ["topolaunch", sub, "-"], cwd)
            check(got == want, "topolaunch %s -<TAB>: %s, --help lists %s"
                  % (sub, sorted(got), sorted(want)))
            got = complete(args, launcher, "_topolaunch", ["topolaunch", sub, ""], cwd)
            if sub == "report":  # its argument is a job directory
                check(got == {"runs"}, "topolaunch report <TAB>: %s (want the folder)"
                      % sorted(got))
                continue
            check(got == {"job.toml", "runs"}, "topolaunch %s <TAB>: %s (want the .toml and the "
                  "folder)" % (sub, sorted(got)))
        preflight_help = help_text([args.topolaunch, "preflight"])
        choices = re.search(r"--transport TEXT:\{([^}]*)\}", preflight_help)
        check(choices is not None, "topolaunch preflight --help shows no --transport choices")
        got = complete(args, launcher, "_topolaunch",
                       ["topolaunch", "preflight", "--transport", ""], cwd)
        check(choices is not None and got == set(choices.group(1).split(",")),
              "--transport <TAB>: %s, --help says %s" % (sorted(got),
                                                         choices and choices.group(1)))
        got = complete(args, launcher, "_topolaunch",
                       ["topolaunch", "preflight", "--level", ""], cwd)
        check(got == {"quick", "full"}, "--level <TAB>: %s" % sorted(got))
        got = complete(args, launcher, "_topolaunch",
                       ["topolaunch", "map", "--topology", ""], cwd)
        check(got == {"node.xml", "base.json", "runs"}, "map --topology <TAB>: %s" % sorted(got))
        got = complete(args, launcher, "_topolaunch",
                       ["topolaunch", "run", "--job-dir", ""], cwd)
        check(got == {"runs"}, "run --job-dir <TAB>: %s (want folders only)" % sorted(got))
        got = complete(args, launcher, "_topolaunch",
                       ["topolaunch", "run", "job.toml", "--", "ech"], cwd)
        check("echo" in got, "run job.toml -- ech<TAB>: %s (want commands)" % sorted(got))

        # topodiag
        want = cli11_options(help_text([args.topodiag]))
        got = complete(args, topodiag, "_topodiag", ["topodiag", "-"], cwd)
        check(got == want, "topodiag -<TAB>: %s, --help lists %s" % (sorted(got), sorted(want)))
        for option in ("--input", "-i", "--baseline"):
            got = complete(args, topodiag, "_topodiag", ["topodiag", option, ""], cwd)
            check(got == {"node.xml", "base.json", "runs"},
                  "topodiag %s <TAB>: %s" % (option, sorted(got)))

        # topolaunch-worker: its usage lists every option but -h/--help, which it accepts too.
        usage = help_text([args.worker])
        want = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", usage)) | {"-h", "--help"}
        got = complete(args, worker, "_topolaunch_worker", ["topolaunch-worker", "-"], cwd)
        check(got == want, "topolaunch-worker -<TAB>: %s, --help lists %s"
              % (sorted(got), sorted(want)))
        got = complete(args, worker, "_topolaunch_worker", ["topolaunch-worker", ""], cwd)
        check(got == {"job.toml", "runs", "data", "sample", "export"},
              "topolaunch-worker <TAB>: %s" % sorted(got))
        # Its commands: each one's options are those of its usage.
        for command in (["data", "prepare"], ["sample"], ["export"]):
            usage = help_text([args.worker] + command)
            want = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", usage)) | {"-h", "--help"}
            got = complete(args, worker, "_topolaunch_worker",
                           ["topolaunch-worker"] + command + ["-"], cwd)
            check(got == want, "topolaunch-worker %s -<TAB>: %s, its --help lists %s"
                  % (" ".join(command), sorted(got), sorted(want)))
        requested = []
        got = complete(args, worker, "_topolaunch_worker",
                       ["topolaunch-worker", "--set", "tr"], cwd, requested)
        check(got == {"train."}, "topolaunch-worker --set tr<TAB>: %s" % sorted(got))
        check(requested == ["-o", "nospace"],
              "topolaunch-worker --set: compopt %s (want -o nospace: the key follows)" % requested)

    print("%d checks failed" % len(FAILURES) if FAILURES else "all completion checks passed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
