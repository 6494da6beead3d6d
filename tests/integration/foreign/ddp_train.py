#!/usr/bin/env python3
"""A user's own PyTorch DDP script, as a new user writes one: gloo, env:// rendezvous,
DistributedSampler, torch.distributed.elastic's @record. Misbehaves on request.

  --steps N            optimizer steps (default 200)
  --step-sleep S       sleep S seconds per step (a slow, healthy job)
  --beat               beat TOPOLAUNCH_HEARTBEAT_FILE every step (the two-line helper)
  --fail-rank R --fail-step K [--fail-attempt A]
                       rank R raises RuntimeError at step K (only in attempt A when given)
  --stop-rank R --stop-step K
                       rank R stops itself with SIGSTOP at step K (a hang: the others wait in
                       the all-reduce)
  --params FILE        rank 0 writes the final parameters there (float.hex, one per line)
  --marks DIR          each rank writes DIR/<launch>-<rank>.{started,first-step,failing} with
                       time.time() (for the tests' and the benchmark's timings)
Prints "step K loss L" on rank 0 every 20 steps.
"""
import argparse
import os
import signal
import sys
import time

STARTED = time.time()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.elastic.multiprocessing.errors import record  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402
from torch.utils.data.distributed import DistributedSampler  # noqa: E402


# The heartbeat helper of topolaunch(1) (HANG DETECTION), as a user copies it.
def beat(step, _path=os.environ.get("TOPOLAUNCH_HEARTBEAT_FILE")):
    if _path: open(_path, "w").write(f"{step}\n")


def mark(args, what):
    if args.marks:
        launch = os.environ.get("TORCHELASTIC_RUN_ID", "run")
        with open(os.path.join(args.marks, f"{launch}-{dist.get_rank()}.{what}"), "w") as f:
            f.write(repr(time.time()))


@record
def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--beat", action="store_true")
    p.add_argument("--fail-rank", type=int, default=-1)
    p.add_argument("--fail-step", type=int, default=-1)
    p.add_argument("--fail-attempt", type=int, default=-1)
    p.add_argument("--stop-rank", type=int, default=-1)
    p.add_argument("--stop-step", type=int, default=-1)
    p.add_argument("--params", default="")
    p.add_argument("--marks", default="")
    args = p.parse_args()

    # One thread: the same float order under every launcher (topolaunch sets OMP_NUM_THREADS to
    # the rank's cores, torchrun to 1).
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if args.marks:
        launch = os.environ.get("TORCHELASTIC_RUN_ID", "run")
        with open(os.path.join(args.marks, f"{launch}-{rank}.started"), "w") as f:
            f.write(repr(STARTED))
    print(f"rank {rank} of {world} (local {os.environ['LOCAL_RANK']}) attempt {attempt}",
          flush=True)

    gen = torch.Generator().manual_seed(1234)
    inputs = torch.randn(8192, 16, generator=gen)
    targets = (inputs @ torch.linspace(-1, 1, 16)).unsqueeze(1) + 0.1 * torch.randn(8192, 1,
                                                                                   generator=gen)
    dataset = TensorDataset(inputs, targets)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=7)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.02, momentum=0.9)
    loss_fn = torch.nn.MSELoss()

    step, epoch = 0, 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        for x, y in loader:
            step += 1
            if rank == args.fail_rank and step == args.fail_step and \
                    args.fail_attempt in (-1, attempt):
                mark(args, "failing")
                raise RuntimeError(f"rank {rank} failed on purpose at step {step}")
            if rank == args.stop_rank and step == args.stop_step:
                mark(args, "stopping")
                os.kill(os.getpid(), signal.SIGSTOP)
            optimizer.zero_grad()
            loss = loss_fn(ddp(x), y)
            loss.backward()
            optimizer.step()
            if step == 1:
                mark(args, "first-step")
            if args.beat:
                beat(step)
            if rank == 0 and step % 20 == 0:
                print(f"step {step} loss {loss.item():.6f}", flush=True)
            if args.step_sleep:
                time.sleep(args.step_sleep)
            if step == args.steps:
                break
        epoch += 1
    if rank == 0 and args.params:
        with open(args.params, "w") as f:
            for tensor in model.state_dict().values():
                for value in tensor.flatten().tolist():
                    f.write(float(value).hex() + "\n")
    dist.destroy_process_group()
    print(f"rank {rank} done after {step} steps", flush=True)


if __name__ == "__main__":
    main()
