#!/usr/bin/env python3
"""The CPU example job from raw text to a model you can use (configs/jobs/tiny-gpt-cpu.toml):
`data prepare` trains a BPE tokenizer on Jane Austen and writes the splits; `topolaunch run` trains
on two ranks with validation, whose loss falls; `sample` prints text decoded by that tokenizer;
`export` writes safetensors that a plain PyTorch GPT-2 loads with our decoder's logits; and a job
started from the export (train.init_from) gives the same validation loss, bit for bit.

usage: example_text.py --topolaunch T --worker W --source-root R
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

STEPS = 100


def fail(message):
    print("FAIL:", message)
    sys.exit(1)


def check(condition, message):
    if not condition:
        fail(message)


def run(argv, timeout=300, **kw):
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)
    if proc.returncode != 0:
        fail("%s: exit %d\n%s\n%s" % (" ".join(argv), proc.returncode, proc.stdout[-3000:],
                                      proc.stderr[-3000:]))
    return proc


def torch_python():
    """A Python that imports torch (Debian's python3-torch is /usr/bin/python3's)."""
    for candidate in (sys.executable, "/usr/bin/python3"):
        if subprocess.run([candidate, "-c", "import torch"], capture_output=True).returncode == 0:
            return candidate
    fail("no python3 here imports torch (apt-get install python3-torch)")


def val_losses(path):
    """step -> the validation loss as written (%.17g)."""
    out = {}
    with open(path) as f:
        for line in f:
            m = re.search(r'"step":(\d+),"val_loss":([-0-9.e+]+)', line)
            if m:
                out[int(m.group(1))] = m.group(2)
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--topolaunch", required=True)
    p.add_argument("--worker", required=True)
    p.add_argument("--source-root", required=True)
    args = p.parse_args()
    args.topolaunch, args.worker = os.path.abspath(args.topolaunch), os.path.abspath(args.worker)
    args.source_root = os.path.abspath(args.source_root)
    env = dict(os.environ, PATH=os.path.dirname(os.path.abspath(args.worker)) + os.pathsep +
               os.environ.get("PATH", ""))
    with tempfile.TemporaryDirectory(prefix="tl-example-text-") as tmp:
        # 1. The documented command, in the folder the job file's relative paths name.
        out = run([args.worker, "data", "prepare", "--corpus", "janeaustenr", "--out",
                   "data/austen-bpe", "--vocab-size", "512"], cwd=tmp).stdout
        print(out.strip())
        check("vocabulary 512" in out, "data prepare did not train a vocabulary of 512: " + out)

        # 2. The example job, shortened, with a metrics file.
        with open(os.path.join(args.source_root, "configs", "jobs", "tiny-gpt-cpu.toml")) as f:
            text = f.read()
        text, n = re.subn(r"(?m)^steps = \d+", "steps = %d" % STEPS, text)
        check(n == 1, "the example job has no steps line")
        metrics = os.path.join(tmp, "metrics.jsonl")
        text += 'metrics_file = "%s"\n' % metrics
        job = os.path.join(tmp, "tiny.toml")
        with open(job, "w") as f:
            f.write(text)
        job_dir = os.path.join(tmp, "job")
        proc = run([args.topolaunch, "run", job, "--job-dir", job_dir], cwd=tmp, env=env)
        logged = [l for l in (proc.stdout + proc.stderr).splitlines() if "val loss" in l]
        print("\n".join(logged))
        val = val_losses(metrics)
        check(sorted(val) == [0, 50, 100], "validation steps: %s" % sorted(val))
        first, last = float(val[0]), float(val[STEPS])
        check(abs(first - 6.238) < 0.2, "the first validation loss %.3f is not about ln(512)" % first)
        series = [float(val[s]) for s in sorted(val)]
        check(all(b < a for a, b in zip(series, series[1:])) and last < first - 0.5,
              "the validation loss did not fall at each validation and by 0.5 in all: %s" % series)
        with open(os.path.join(job_dir, "report.json")) as f:
            report = json.load(f)
        training = report.get("training", {})
        check(training.get("val_loss") == float(val[STEPS]),
              "report.json's training.val_loss %r is not the last one logged (%s)" %
              (training.get("val_loss"), val[STEPS]))
        ckpt = os.path.join(job_dir, "checkpoints")
        for name in ("model.json", "tokenizer.model"):
            check(os.path.exists(os.path.join(ckpt, name)), "the checkpoints lack " + name)

        # 3. Text from the checkpoint, decoded by the stored tokenizer.
        sample = run([args.worker, "sample", ckpt, "--prompt", "It is a truth", "--tokens", "60",
                      "--seed", "3"]).stdout
        print("sample:", sample.strip()[:300])
        check(sample.startswith("It is a truth"), "the sample does not start with its prompt")
        words = re.findall(r"[A-Za-z]+", sample[len("It is a truth"):])
        check(len(words) >= 10, "the sample holds %d words of text: %r" % (len(words), sample))

        # 4. Export; a plain PyTorch GPT-2 on it against our decoder's logits.
        export = os.path.join(tmp, "exported")
        run([args.worker, "export", ckpt, "--out", export])
        ids = [3, 70, 11, 200, 5, 400, 17, 3, 99, 256]
        logits = os.path.join(tmp, "logits.f32")
        run([args.worker, "sample", ckpt, "--prompt-ids", ",".join(map(str, ids)), "--tokens", "1",
             "--logits", logits])
        ids_file = os.path.join(tmp, "ids.txt")
        with open(ids_file, "w") as f:
            f.write(",".join(map(str, ids)))
        proc = run([torch_python(), os.path.join(args.source_root, "tests", "gpu", "torch_gpt2.py"),
                    export, ids_file, logits])
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        print("pytorch:", json.dumps(result))
        check(result["max_abs_diff_plain_torch"] < 1e-4,
              "PyTorch's logits differ from ours by %g" % result["max_abs_diff_plain_torch"])

        # 5. A job from the export: its validation loss before any step is the last one above.
        text2 = text.replace("[train]\n", '[train]\ninit_from = "%s"\n' % export, 1)
        text2 = re.sub(r"(?m)^steps = \d+", "steps = 0", text2)
        text2 = text2.replace(metrics, metrics + ".import")
        job2 = os.path.join(tmp, "import.toml")
        with open(job2, "w") as f:
            f.write(text2)
        proc = run([args.topolaunch, "run", job2, "--job-dir", os.path.join(tmp, "job2")], cwd=tmp,
                   env=env)
        check("initialised from" in proc.stdout + proc.stderr, "the import was not said")
        imported = val_losses(metrics + ".import")
        check(imported.get(0) == val[STEPS],
              "the imported model's validation loss %s is not the exported one's %s" %
              (imported.get(0), val[STEPS]))
        print("import: validation loss %s = %s (bit-identical)" % (imported[0], val[STEPS]))
    print("ok")


if __name__ == "__main__":
    main()
