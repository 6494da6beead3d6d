#!/usr/bin/env python3
"""Boots Debian's own kernel in QEMU (TCG: no KVM needed) with Soft-RoCE and runs a guest
script against this host's root file system (rdma.md §3.2).

  qemu_guest.py --cache DIR --out DIR --script GUEST.sh [--timeout S] [--memory MiB]
                [--env KEY=VALUE ...]

Prepares, once per cache dir:
  * `apt-get download` of the kernel image package that linux-image-amd64 depends on (asked of
    apt-cache at run time) and of busybox-static; only the kernel and the modules the guest needs
    are unpacked, then depmod;
  * an initramfs (cpio newc + gzip): busybox, the modules in dependency order (modprobe
    --show-depends), and an /init that mounts this host's / read-only over 9p, mounts OUT
    read-write over 9p at the same path, chroots into the host root, runs GUEST.sh with bash and
    powers off.
Then boots once, under a hard timeout. qemu runs in its own process group with a parent-death
signal, and is killed on every way out (timeout, error, SIGTERM from meson), so nothing is left
running. OUT gets console.log, guest.log (the script's output) and guest-rc (its exit status).

Exit status: 0 when the guest script ran to the end (whatever its checks found: those are read
by the individual tests), 1 when the guest could not be prepared or booted, or did not finish.
A missing prerequisite is an error with the package to install, never a skip.
"""
import argparse
import ctypes
import gzip
import os
import shutil
import signal
import subprocess
import sys
import time

# Modules the guest loads (their dependencies are added by modprobe --show-depends):
# virtio PCI + 9p for the shared folders, Soft-RoCE (rdma_rxe; crc32_generic is the ICRC's
# crypto "crc32", a soft dependency modules.dep does not list), rdma_ucm for rdma_cm users,
# veth and dummy for the test netdevs.
GUEST_MODULES = ["virtio_pci", "9pnet_virtio", "9p", "crc32_generic", "rdma_rxe", "rdma_ucm",
                 "veth", "dummy"]
# Where those live in the kernel package (unpacking only these keeps preparation short).
MODULE_DIRS = ["drivers/virtio", "drivers/infiniband", "drivers/net/veth.ko",
               "drivers/net/dummy.ko", "net/9p", "net/ipv4/udp_tunnel.ko",
               "net/ipv6/ip6_udp_tunnel.ko", "fs/9p", "fs/netfs", "fs/fscache", "fs/configfs",
               "crypto/crc32_generic.ko"]
PREREQUISITES = {
    "qemu-system-x86_64": "qemu-system-x86",
    "cpio": "cpio",
    "depmod": "kmod",
    "modprobe": "kmod",
    "apt-get": "apt",
    "apt-cache": "apt",
    "dpkg-deb": "dpkg",
}

INIT = r"""#!/bin/busybox sh
# topolaunch rdma suite guest init: modules, 9p shares, chroot into the host root, power off.
/bin/busybox mkdir -p /proc /sys /dev /host /out /sbin /usr/bin /usr/sbin
/bin/busybox --install -s
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
die() { echo "tl-init: $*"; poweroff -f; }
while read -r mod opts; do
  insmod "/modules/$mod" $opts || echo "tl-init: insmod $mod failed"
done < /modules/list
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 out /out || die "cannot mount the out share"
. /out/guest.env
# cache=loose: the guest keeps what it read of the (read-only) host root, so the many
# processes the suite starts do not fetch the same libraries over 9p again and again.
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144,ro,cache=loose hostroot /host \
  || die "cannot mount the host root"
for d in proc sys dev; do mount --move "/$d" "/host/$d" || die "cannot move /$d"; done
mkdir -p /host/dev/shm /host/dev/pts
mount -t devpts devpts /host/dev/pts
# The guest gets fresh /tmp, /run, /var/tmp and /dev/shm; what the suite needs from under them on
# the host (a checkout or build dir under /tmp, as a CI clone may be) is bind-mounted aside first
# and put back on top of the tmpfs afterwards (TL_KEEP: space-separated host paths).
i=0
for p in $TL_KEEP; do
  mkdir -p "/keep/$i" && mount --bind "/host$p" "/keep/$i" || die "cannot keep $p"
  i=$((i + 1))
done
for d in /tmp /run /var/tmp /dev/shm; do mount -t tmpfs tmpfs "/host$d" || die "tmpfs on $d"; done
i=0
for p in $TL_KEEP; do
  mkdir -p "/host$p" && mount --move "/keep/$i" "/host$p" || die "cannot put back $p"
  i=$((i + 1))
done
mkdir -p "/host$TL_OUT" 2>/dev/null  # only where a tmpfs now hides it (an out dir under /tmp)
mount --move /out "/host$TL_OUT" || die "cannot move the out share to $TL_OUT"
echo "tl-init: running $TL_SCRIPT"
chroot /host /bin/bash "$TL_SCRIPT" > "/host$TL_OUT/guest.log" 2>&1
echo $? > "/host$TL_OUT/guest-rc"
sync
echo "tl-init: guest script finished, rc $(cat /host$TL_OUT/guest-rc)"
poweroff -f
"""


def fail(message):
    print(f"qemu_guest: {message}", file=sys.stderr, flush=True)
    sys.exit(1)


def run(cmd, **kw):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)
    if r.returncode != 0:
        fail(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout.strip()}")
    return r.stdout


def check_prerequisites():
    missing = sorted({pkg for exe, pkg in PREREQUISITES.items() if not shutil.which(exe)})
    if missing:
        fail("missing " + ", ".join(missing) + ": apt-get install -y " + " ".join(missing) +
             " (listed in scripts/debian-packages.txt)")
    if os.geteuid() != 0:
        fail("must run as root (the guest mounts this host's root over 9p with passthrough)")


def kernel_package():
    out = run(["apt-cache", "depends", "linux-image-amd64"])
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("Depends:") and line.split()[1].startswith("linux-image-"):
            return line.split()[1]
    fail("apt-cache depends linux-image-amd64 names no linux-image-* package; run apt-get update")


def download(cache, package):
    debs = os.path.join(cache, "debs")
    os.makedirs(debs, exist_ok=True)
    have = [f for f in os.listdir(debs) if f.startswith(package + "_") and f.endswith(".deb")]
    if not have:
        # The sandbox user (_apt) may not be able to write into a build dir owned by root.
        run(["apt-get", "download", "-o", "APT::Sandbox::User=root", package], cwd=debs)
        have = [f for f in os.listdir(debs) if f.startswith(package + "_") and f.endswith(".deb")]
    if not have:
        fail(f"apt-get download {package} left no .deb in {debs}")
    return os.path.join(debs, sorted(have)[-1])


def unpack_kernel(cache, deb, package):
    root = os.path.join(cache, package)
    stamp = os.path.join(root, ".unpacked")
    if os.path.exists(stamp):
        return root
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    patterns = ["./boot/vmlinuz-*", "./lib/modules/*/modules.order",
                "./lib/modules/*/modules.builtin", "./lib/modules/*/modules.builtin.modinfo"]
    patterns += [f"./lib/modules/*/kernel/{d}" for d in MODULE_DIRS]
    tar_in = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", deb], stdout=subprocess.PIPE)
    r = subprocess.run(["tar", "-x", "-C", root, "--wildcards"] + patterns, stdin=tar_in.stdout,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tar_in.stdout.close()
    if tar_in.wait() != 0 or r.returncode != 0:
        fail(f"unpacking {deb} failed:\n{r.stdout}")
    version = os.listdir(os.path.join(root, "lib", "modules"))[0]
    run(["depmod", "-b", root, version])
    open(stamp, "w").close()
    return root


def module_order(kroot, version):
    """[(path, options)] in load order, each module once."""
    order, seen = [], set()
    for name in GUEST_MODULES:
        out = run(["modprobe", "-d", kroot, "-S", version, "--show-depends", name])
        for line in out.splitlines():
            parts = line.split()
            if not parts or parts[0] != "insmod":
                continue  # "builtin X": nothing to load
            path, opts = parts[1], " ".join(parts[2:])
            if path not in seen:
                seen.add(path)
                order.append((path, opts))
    return order


def build_initramfs(cache, kroot, busybox_deb):
    version = os.listdir(os.path.join(kroot, "lib", "modules"))[0]
    image = os.path.join(cache, f"initrd-{version}.gz")
    stage = os.path.join(cache, "initrd-stage")
    shutil.rmtree(stage, ignore_errors=True)
    os.makedirs(os.path.join(stage, "bin"))
    os.makedirs(os.path.join(stage, "modules"))
    bb = os.path.join(cache, "busybox-static")
    if not os.path.exists(os.path.join(bb, "bin", "busybox")):
        shutil.rmtree(bb, ignore_errors=True)
        run(["dpkg-deb", "-x", busybox_deb, bb])
    shutil.copy2(os.path.join(bb, "bin", "busybox"), os.path.join(stage, "bin", "busybox"))
    with open(os.path.join(stage, "modules", "list"), "w") as lst:
        for path, opts in module_order(kroot, version):
            shutil.copy2(path, os.path.join(stage, "modules", os.path.basename(path)))
            lst.write(f"{os.path.basename(path)} {opts}".rstrip() + "\n")
    with open(os.path.join(stage, "init"), "w") as f:
        f.write(INIT)
    os.chmod(os.path.join(stage, "init"), 0o755)
    names = []
    for dirpath, dirnames, filenames in os.walk(stage):
        for n in dirnames + filenames:
            names.append(os.path.relpath(os.path.join(dirpath, n), stage))
    cpio = subprocess.run(["cpio", "-o", "-H", "newc", "--quiet"], cwd=stage,
                          input="\n".join(["."] + sorted(names)).encode(), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE)
    if cpio.returncode != 0:
        fail(f"cpio failed: {cpio.stderr.decode()}")
    with gzip.open(image, "wb", compresslevel=6) as f:
        f.write(cpio.stdout)
    kernel = os.path.join(kroot, "boot", f"vmlinuz-{version}")
    return kernel, image, version


def set_pdeathsig():
    # qemu dies with us even if we are SIGKILLed; own process group for a clean group kill.
    os.setpgrp()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Terminated(Exception):
    pass


def on_signal(signum, _frame):
    raise Terminated(f"signal {signum}")


def boot(kernel, initrd, out, timeout, memory_mib, smp):
    console_path = os.path.join(out, "console.log")
    cmd = ["qemu-system-x86_64", "-accel", "tcg,thread=multi", "-cpu", "max",
           "-smp", str(smp), "-m", str(memory_mib), "-nographic", "-no-reboot", "-nic", "none",
           "-kernel", kernel, "-initrd", initrd,
           "-append", "console=ttyS0 panic=-1 quiet loglevel=3",
           "-virtfs", "local,path=/,mount_tag=hostroot,security_model=passthrough,readonly=on,"
                      "multidevs=remap",
           "-virtfs", f"local,path={out},mount_tag=out,security_model=passthrough"]
    print("qemu_guest: " + " ".join(cmd), flush=True)
    t0 = time.monotonic()
    with open(console_path, "wb") as console:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=console,
                                stderr=subprocess.STDOUT, preexec_fn=set_pdeathsig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            print(f"qemu_guest: guest did not finish within {timeout} s: killed", flush=True)
        finally:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.wait()
    return proc.returncode, time.monotonic() - t0


HIDDEN_IN_GUEST = ["/tmp", "/run", "/var/tmp", "/dev/shm"]  # the guest mounts a tmpfs on each


def hidden_paths(paths):
    """The folders of `paths` that the guest's tmpfs mounts would hide, as few as cover them all:
    (the top folder below /tmp etc. that holds each, e.g. /tmp/ci for /tmp/ci/main/build/x)."""
    tops = set()
    for p in paths:
        p = os.path.realpath(p)
        for hidden in HIDDEN_IN_GUEST:
            if p.startswith(hidden + "/"):
                first = p[len(hidden) + 1:].split("/", 1)[0]
                top = os.path.join(hidden, first)
                tops.add(top if os.path.isdir(top) else os.path.dirname(p))
    for t in tops:
        if " " in t or "'" in t:
            fail(f"cannot share {t!r} with the guest: its name has a space or quote")
    return sorted(tops)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--script", required=True)
    ap.add_argument("--timeout", type=float, default=240)
    ap.add_argument("--memory", type=int, default=2048)
    ap.add_argument("--smp", type=int, default=2)
    ap.add_argument("--env", action="append", default=[])
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    cache, out = os.path.abspath(a.cache), os.path.abspath(a.out)
    # A fresh out dir per attempt; attempt.json (written on every way out, below) tells the
    # checks that this attempt is over, so a failed boot is reported, not retried by each check.
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    ATTEMPT["path"] = os.path.join(out, "attempt.json")
    check_prerequisites()
    script = os.path.abspath(a.script)
    os.makedirs(cache, exist_ok=True)
    t0 = time.monotonic()
    package = kernel_package()
    kdeb = download(cache, package)
    bdeb = download(cache, "busybox-static")
    kroot = unpack_kernel(cache, kdeb, package)
    kernel, initrd, version = build_initramfs(cache, kroot, bdeb)
    prepared = time.monotonic() - t0
    print(f"qemu_guest: {package} ({version}), initramfs {os.path.getsize(initrd)} B, "
          f"prepared in {prepared:.1f} s", flush=True)
    keep = hidden_paths([os.path.dirname(script)] +
                        [v for v in (kv.partition("=")[2] for kv in a.env) if os.path.isabs(v)])
    with open(os.path.join(out, "guest.env"), "w") as f:
        f.write(f"TL_OUT='{out}'\nTL_SCRIPT='{script}'\nTL_KEEP='{' '.join(keep)}'\n"
                "export TL_OUT TL_SCRIPT TL_KEEP\n")
        for kv in a.env:
            k, _, v = kv.partition("=")
            f.write(f"export {k}='{v}'\n")
    rc, seconds = boot(kernel, initrd, out, a.timeout, a.memory, a.smp)
    with open(os.path.join(out, "timing.json"), "w") as f:
        f.write(f'{{"prepare_seconds": {prepared:.2f}, "boot_to_poweroff_seconds": {seconds:.2f}}}\n')
    guest_rc_path = os.path.join(out, "guest-rc")
    if not os.path.exists(guest_rc_path):
        with open(os.path.join(out, "console.log"), errors="replace") as f:
            tail = f.read()[-4000:]
        fail(f"the guest did not finish its script (qemu exit {rc}, {seconds:.1f} s); "
             f"console:\n{tail}")
    print(f"qemu_guest: guest script exit {open(guest_rc_path).read().strip()}, "
          f"boot to power-off {seconds:.1f} s", flush=True)
    return 0


ATTEMPT = {"path": None}


if __name__ == "__main__":
    status = 1
    try:
        status = main()
    except Terminated as e:
        print(f"qemu_guest: terminated ({e}); qemu killed", file=sys.stderr, flush=True)
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else 1
    finally:
        if ATTEMPT["path"]:
            with open(ATTEMPT["path"], "w") as f:
                f.write(f'{{"exit": {status}}}\n')
    sys.exit(status)
