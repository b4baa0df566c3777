"""Peak memory of forward + backward with and without activation checkpointing.

    python benchmarks/checkpoint_memory.py

A stack of 16 float32 layers (batch 2048, width 512, tanh) is run plainly and as 4
checkpointed segments of 4 layers, whose inner activations are dropped in the forward and
recomputed segment by segment in the backward. Each case runs in a fresh process; the
measure is tracemalloc's peak over forward + backward, which counts numpy's buffers
exactly (peak RSS does not: memory freed by a warm-up run is reused without growing it).
The gradients' agreement is checked.
"""
import json
import subprocess
import sys

CHILD = r"""
import json, sys
import numpy as np
import jitgrad
from jitgrad.utils.checkpoint import checkpoint
import tracemalloc
rng = np.random.default_rng(0)
ws = [jitgrad.tensor(rng.standard_normal((512, 512)).astype(np.float32) / 23, requires_grad=True)
      for _ in range(16)]
x = jitgrad.tensor(rng.standard_normal((2048, 512)).astype(np.float32))
def segment(h, *seg):
    for w in seg:
        h = (h @ w).tanh()
    return h
def run(use_cp):
    h = x
    for seg in (ws[0:4], ws[4:8], ws[8:12], ws[12:16]):
        h = checkpoint(segment, h, *seg, use_reentrant=True) if use_cp else segment(h, *seg)
    (h * h).mean().backward()
run({use_cp})  # compile / load the engine outside the measure
for w in ws:
    w.grad = None
tracemalloc.start()
run({use_cp})
peak = tracemalloc.get_traced_memory()[1]
tracemalloc.stop()
print(json.dumps(dict(peak=peak, grad=float(ws[0].grad.numpy().sum()))))
"""


def measure(use_cp):
    out = subprocess.run([sys.executable, "-c", CHILD.format(use_cp=use_cp)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    plain, cp = measure(False), measure(True)
    print("peak memory added by forward+backward, 16 layers (batch 2048, width 512, float32):")
    print(f"  plain          {plain['peak'] / 2**20:7.1f} MiB")
    print(f"  checkpointed   {cp['peak'] / 2**20:7.1f} MiB   ({cp['peak'] / plain['peak']:.2f}x, 4 segments of 4)")
    print(f"  same gradients: {abs(plain['grad'] - cp['grad']) <= 1e-3 * max(1.0, abs(plain['grad']))}")


if __name__ == "__main__":
    main()
