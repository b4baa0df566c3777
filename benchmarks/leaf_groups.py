#!/usr/bin/env python
"""What DistributedDataParallel's buckets cost the backward in one process: the MNIST MLP's
backward with its parameters in two LeafGroups (graph/hooks.py; one sweep hand-back each)
against the same backward without, taking turns.

    python benchmarks/leaf_groups.py [--steps 200] [--rounds 3]
"""
import argparse
import time

import numpy as np


def main():
    import jitgrad as torch
    from jitgrad.graph.hooks import LeafGroup

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(784, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(),
                            torch.nn.Linear(512, 10))
    x, y = torch.randn(32, 784), torch.randint(0, 10, (32,))
    ps = list(m.parameters())
    groups = [LeafGroup(ps[2:], lambda ts: None), LeafGroup(ps[:2], lambda ts: None)]

    def backward_ms(active):
        for g in groups:
            g.active = active
        times = []
        for _ in range(args.steps):
            m.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(m(x), y)
            t0 = time.perf_counter()
            loss.backward()
            times.append(time.perf_counter() - t0)
        return float(np.median(times[args.steps // 10:])) * 1e3

    for _ in range(args.rounds):
        off, on = backward_ms(False), backward_ms(True)
        print(f"MNIST MLP backward, 32 rows: no groups {off:.3f} ms, two groups {on:.3f} ms ({on / off:.3f}x)")


if __name__ == "__main__":
    main()
