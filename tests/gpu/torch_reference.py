#!/usr/bin/env python3
"""Our executor against PyTorch on the same small GPT (suite gpu, test torch_reference).

  torch_reference.py TEST_CUDA_BACKEND GPT2_TORCH_REFERENCE_PY FOLDER

test_cuda_backend trains the small GPT on the CPU backend and on the GPU and exports the init,
the batch and both backends' losses into FOLDER; gpt2_torch_reference.py trains the same model
with PyTorch (fp32, and bf16 autocast) from that init and compares the per-step losses (its
tolerances are in its docstring). PyTorch must be importable with CUDA: where it is not, this
test fails saying so (configure with -Dgpu_torch=disabled on hosts without PyTorch).
"""
import os
import subprocess
import sys


def main():
    exe, reference, folder = sys.argv[1:4]
    try:
        import torch  # noqa: F401  (only to fail early with a clear line)
    except ImportError as e:
        sys.exit(f"torch_reference: PyTorch is not importable ({e}); install it, or configure "
                 "with -Dgpu_torch=disabled to leave the PyTorch comparisons out")
    if not torch.cuda.is_available():
        sys.exit("torch_reference: PyTorch sees no CUDA device")
    os.makedirs(folder, exist_ok=True)
    ours = subprocess.run([exe, folder])
    if ours.returncode != 0:
        sys.exit(f"torch_reference: {exe} failed (exit {ours.returncode}); see its checks above")
    return subprocess.run([sys.executable, reference, folder]).returncode


if __name__ == "__main__":
    sys.exit(main())
