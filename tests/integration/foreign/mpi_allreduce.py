#!/usr/bin/env python3
"""An MPI program (mpi4py): the sum of rank + 1 over MPI_COMM_WORLD. Exits 3, saying so, when
MPI's world is not the launcher's (a rank started as a one-process MPI job: a singleton).

Right:  srun --mpi=pmix --topolaunch=auto -N2 -n2 python3 mpi_allreduce.py
Wrong:  topolaunch run job.toml -- python3 mpi_allreduce.py  (refused by topolaunch)
"""
import os
import sys

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
total = comm.allreduce(rank + 1, op=MPI.SUM)
launched = int(os.environ.get("SLURM_NTASKS") or os.environ.get("WORLD_SIZE") or size)
node = os.environ.get("SLURMD_NODENAME") or MPI.Get_processor_name()
print(f"rank {rank} of {size} on {node}: allreduce {total} "
      f"(expected {launched * (launched + 1) // 2})", flush=True)
if size != launched:
    print(f"rank {rank}: MPI world of {size}, launched {launched}: a singleton", file=sys.stderr)
    sys.exit(3)
