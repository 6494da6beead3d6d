#!/usr/bin/env python3
"""Hostile inputs to the programs: each must end in exit status 2 with one line on stderr that
names the file (or the variable), never a crash (research/hostile-inputs.md has what the probes
found).

usage: hostile_inputs.py CASE --topolaunch T --worker W --topodiag D --source-root R
"""
import argparse
import json
import os
import signal
import struct
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


def xml_missing_complete_set(args, tmp):
    """hwloc 2.9 crashes (SIGSEGV, both importers) on a NUMA node or root with nodeset but no
    complete_nodeset (found by tests/fuzz/fuzz_hwloc_xml; docs/fuzzing-findings.md)."""
    found = os.path.join(args.source_root, "tests", "fuzz", "crashes", "hwloc_xml",
                         "numa-nodeset-without-complete.xml")
    real = os.path.join(args.source_root, "..", "shared", "topologies", "generated",
                        "dgx-h100.pci.xml")
    with open(real) as f:
        body = f.read()
    node = body.index('<object type="NUMANode"')
    attr = body.index(' complete_nodeset="', node)
    edited = body[:attr] + body[body.index('"', attr + 19) + 1:]
    job = os.path.join(args.source_root, "configs", "jobs", "tiny-gpt-cpu.toml")
    with open(found) as f:
        small = f.read()
    for name, text in {"found.xml": small, "dgx-numa.xml": edited}.items():
        path = write(tmp, name, text)
        for env in ({}, {"HWLOC_LIBXML": "1", "HWLOC_LIBXML_IMPORT": "1"}):
            line = one_clean_line([args.topodiag, "--input", path], name, env=env)
            if "nodeset without complete_nodeset" not in line:
                fail("the line does not say what is missing: " + line)
            one_clean_line([args.topolaunch, "map", job, "--topology", path], name, env=env)
    # A shape no check of ours can see (an unbalanced quote hides the attribute from a tag scan,
    # hwloc's parser drops it): the isolated import probe refuses it.
    differential = os.path.join(args.source_root, "tests", "fuzz", "crashes", "hwloc_xml",
                                "machine-attribute-quote-differential.xml")
    for argv in ([args.topodiag, "--input", differential],
                 [args.topolaunch, "map", job, "--topology", differential]):
        line = one_clean_line(argv, "machine-attribute-quote-differential.xml")
        if "crashed" not in line:
            fail("the line does not say the probe crashed: " + line)


# Worker tables that only the worker used to refuse, once its ranks had started: now `check` (and
# `run`, before it starts anything) refuses them, naming file:line and the key.
BAD_JOB_TABLES = {
    "batch.toml": ("[train]\nbatch = -1\n", ":2:9:", "train.batch"),
    "heads.toml": ("[model]\nn_embd = 64\nn_head = 5\n", ":2:10:", "model.n_embd"),
    "memory.toml": ('[budget]\nmemory = "-3GiB"\n', ":2:10:", "budget.memory"),
    "steps.toml": ('[train]\nsteps = "many"\n', ":2:9:", "train.steps"),
    "kind.toml": ('[model]\nkind = "transformer-xl"\n', ":2:8:", "model.kind"),
    "keep.toml": ("[train]\nkeep_checkpoints = 0\n", ":2:20:", "train.keep_checkpoints"),
    "trian.toml": ("[trian]\nsteps = 10\n", ":1:2:", 'trian: unknown table (did you mean "train"?)'),
}


def bad_job_tables(args, tmp):
    for name, (text, place, key) in BAD_JOB_TABLES.items():
        path = write(tmp, name, text)
        line = one_clean_line([args.topolaunch, "check", path], name + place)
        if key not in line:
            fail("check: the line does not name %s: %s" % (key, line))
        job_dir = os.path.join(tmp, "job-" + name)
        line = one_clean_line([args.topolaunch, "run", path, "--job-dir", job_dir], name + place)
        if os.path.exists(job_dir):
            fail("run created %s before refusing %s" % (job_dir, name))
        line = one_clean_line([args.worker, "--plan-only", path], name + place)


def worker_environment(args, tmp):
    """A malformed integer in the worker's environment is refused naming it, not read as 0."""
    job = write(tmp, "job.toml", "[model]\nvocab_size = 65\n")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("TOPOLAUNCH_") and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    cases = [("LOCAL_RANK", "1x", ["--plan-only"]), ("LOCAL_RANK", "1x", []),
             ("WORLD_SIZE", "two", ["--plan-only"]), ("RANK", "-1", []),
             ("TOPOLAUNCH_WORLD_SIZE", "0", ["--plan-only"])]
    for variable, value, options in cases:
        proc = subprocess.run([args.worker] + options + [job], capture_output=True, text=True,
                              timeout=30, env=dict(env, **{variable: value}))
        shown = "%s=%s topolaunch-worker %s" % (variable, value, " ".join(options))
        lines = [l for l in proc.stderr.split("\n") if l.strip()]
        if proc.returncode != 2 or len(lines) != 1 or (variable + "=" + value) not in lines[0]:
            fail("%s: exit %d, stderr %r (want exit 2 and one line naming %s=%s)"
                 % (shown, proc.returncode, proc.stderr, variable, value))
        print("ok  %-60s %s" % (shown, lines[0]))
    # The same worker with the variables well formed plans fine.
    proc = subprocess.run([args.worker, "--plan-only", job], capture_output=True, text=True,
                          timeout=30, env=dict(env, LOCAL_RANK="1", WORLD_SIZE="2", RANK="1"))
    if proc.returncode != 0:
        fail("well-formed RANK/WORLD_SIZE/LOCAL_RANK: exit %d: %s" % (proc.returncode, proc.stderr))
    print("ok  RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 plans (exit 0)")


def token_file(path, tokens, vocab, magic=20240520, version=1, count=None):
    """An llm.c token file: 256 int32 header (magic, version, count, our vocabulary), uint16s."""
    header = [0] * 256
    header[0], header[1] = magic, version
    header[2] = len(tokens) if count is None else count
    header[3] = vocab
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack("<%dH" % len(tokens), *tokens))
    return path


def safetensors(path, tensors, cut=None):
    """tensors: name -> shape (F32 zeros); cut: keep only the first `cut` bytes."""
    header, offset = {}, 0
    for name, shape in tensors.items():
        n = 4
        for d in shape:
            n *= d
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header).encode()
    data = struct.pack("<Q", len(text)) + text + bytes(offset)
    with open(path, "wb") as f:
        f.write(data if cut is None else data[:cut])
    return path


def gpt2_tensors(C, layers, vocab, positions):
    t = {"wte.weight": [vocab, C], "wpe.weight": [positions, C]}
    for i in range(layers):
        p = "h.%d." % i
        t.update({p + "ln_1.weight": [C], p + "ln_1.bias": [C],
                  p + "attn.c_attn.weight": [C, 3 * C], p + "attn.c_attn.bias": [3 * C],
                  p + "attn.c_proj.weight": [C, C], p + "attn.c_proj.bias": [C],
                  p + "ln_2.weight": [C], p + "ln_2.bias": [C],
                  p + "mlp.c_fc.weight": [C, 4 * C], p + "mlp.c_fc.bias": [4 * C],
                  p + "mlp.c_proj.weight": [4 * C, C], p + "mlp.c_proj.bias": [C]})
    t.update({"ln_f.weight": [C], "ln_f.bias": [C]})
    return t


def text_inputs(args, tmp):
    """From raw text to a model: an empty corpus, a missing or corrupt tokenizer, a
    token file with a wrong header or a vocabulary above the model's, a safetensors file with a
    truncated header, a tensor of the wrong shape on import."""
    empty = write(tmp, "empty-corpus.txt", "")
    one_clean_line([args.worker, "data", "prepare", "--corpus", empty, "--out",
                    os.path.join(tmp, "prep")], "empty-corpus.txt")
    tokens = token_file(os.path.join(tmp, "train.bin"), [i % 100 for i in range(5000)], 100)
    model = "[model]\nn_layer = 1\nn_embd = 16\nn_head = 2\nblock_size = 8\n"
    train = '[train]\nbatch = 2\nseq_len = 8\nsteps = 1\ncheckpoint_dir = "%s"\n'

    def job(name, data, extra_train="", model_text=model, path=tokens):
        return write(tmp, name, model_text + '[data]\nkind = "tokens"\npath = "%s"\n' % path +
                     data + train % os.path.join(tmp, "ckpt-" + name) + extra_train)

    missing = os.path.join(tmp, "missing-tokenizer.model")
    one_clean_line([args.worker, job("tok-missing.toml", 'tokenizer = "%s"\n' % missing)],
                   "missing-tokenizer.model")
    one_clean_line([args.worker, "data", "prepare", "--corpus", "janeaustenr", "--out",
                    os.path.join(tmp, "prep"), "--tokenizer", missing], "missing-tokenizer.model")
    corrupt = write(tmp, "corrupt-tokenizer.model", "\x08\x96\x01 this is not a model\n")
    one_clean_line([args.worker, job("tok-corrupt.toml", 'tokenizer = "%s"\n' % corrupt)],
                   "corrupt-tokenizer.model")
    bad_magic = token_file(os.path.join(tmp, "bad-magic.bin"), [1, 2, 3], 100, magic=20240521)
    one_clean_line([args.worker, job("magic.toml", "", path=bad_magic)], "bad-magic.bin")
    bad_count = token_file(os.path.join(tmp, "bad-count.bin"), [1, 2, 3], 100, count=900)
    one_clean_line([args.worker, job("count.toml", "", path=bad_count)], "bad-count.bin")
    val = token_file(os.path.join(tmp, "val-over.bin"), [1, 2, 300], 100)
    one_clean_line([args.worker, job("val.toml", 'val_path = "%s"\n' % val, "val_every = 1\n")],
                   "val-over.bin")
    line = one_clean_line([args.worker, job("vocab.toml", "", model_text=model + "vocab_size = 50\n")],
                          "model.vocab_size")
    if "train.bin" not in line:
        fail("the line does not name the token file: " + line)
    hf = os.path.join(tmp, "hf-cut")
    os.makedirs(hf)
    safetensors(os.path.join(hf, "model.safetensors"), gpt2_tensors(16, 1, 100, 8), cut=60)
    line = one_clean_line([args.worker, job("cut.toml", "", 'init_from = "%s"\n' % hf)],
                          "model.safetensors")
    if "truncated safetensors header" not in line:
        fail("the line does not say the header is truncated: " + line)
    hf = os.path.join(tmp, "hf-shape")
    os.makedirs(hf)
    shapes = gpt2_tensors(16, 1, 100, 8)
    shapes["h.0.mlp.c_fc.weight"] = [16, 48]
    safetensors(os.path.join(hf, "model.safetensors"), shapes)
    one_clean_line([args.worker, job("shape.toml", "", 'init_from = "%s"\n' % hf)],
                   "h.0.mlp.c_fc.weight")
    one_clean_line([args.worker, "export", os.path.join(tmp, "no-such-checkpoints"), "--out",
                    os.path.join(tmp, "out")], "no-such-checkpoints")


CASES = {"toml_crash_headers": toml_crash_headers, "xml_dtd_subset": xml_dtd_subset,
         "xml_missing_complete_set": xml_missing_complete_set,
         "xml_minimal_importer": xml_minimal_importer, "bad_job_tables": bad_job_tables,
         "worker_environment": worker_environment, "text_inputs": text_inputs}


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
