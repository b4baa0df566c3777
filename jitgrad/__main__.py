"""python -m jitgrad: a short demo of the graph API and of backward speed.

Builds a small graph and prints its grad_fn chain and gradients, then times backward on
a scalar chain of 100,000 nodes, beside PyTorch when it is installed.
"""
import argparse
import time

import jitgrad


def _chain(T, n):
    x = T.tensor(1.0, dtype=T.float64, requires_grad=True)
    y = x
    t0 = time.perf_counter()
    for _ in range(n // 2):
        y = y * 1.0001
        y = y + 0.0001
    t1 = time.perf_counter()
    y.backward()
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, x.grad.item()


def print_chain(t):
    """The grad_fn chain, depth first, as in the seed documents' diagrams."""
    seen = set()

    def walk(node, depth):
        if node is None:
            return
        label = type(node).__name__
        if isinstance(node, jitgrad.autograd.graph.AccumulateGrad):
            label += f"  (leaf, shape {tuple(node.variable.shape)})"
        print("  " * depth + label + ("  ..." if id(node) in seen else ""))
        if id(node) in seen:
            return
        seen.add(id(node))
        for nxt, _ in node.next_functions:
            walk(nxt, depth + 1)

    walk(t.grad_fn, 1)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=100_000, help="length of the timed scalar chain")
    args = ap.parse_args(argv)

    print("== a small graph ==")
    x = jitgrad.tensor([2.0, -1.0], requires_grad=True)
    w = jitgrad.tensor([[3.0, 0.5], [1.0, 2.0]], requires_grad=True)
    loss = (w @ x).tanh().sum() + (x ** 2).mean()
    print("loss =", loss)
    print_chain(loss)
    print("(backward: the first run in a fresh environment compiles the engine first, 20-40 s)")
    loss.backward()
    print("x.grad =", x.grad)
    print("w.grad =", w.grad)

    print(f"\n== backward speed: scalar chain of {args.nodes:,} nodes ==")
    t0 = time.perf_counter()
    _chain(jitgrad, 1000)  # loads (or compiles, the first time) the float64 engine
    print(f"float64 engine ready in {time.perf_counter() - t0:.2f} s")
    fwd, bwd, g = _chain(jitgrad, args.nodes)
    print(f"jitgrad: forward {fwd * 1e3:8.1f} ms   backward {bwd * 1e3:7.2f} ms "
          f"({bwd / args.nodes * 1e9:.0f} ns/node)   dx = {g:.6f}")
    try:
        import torch
    except ImportError:
        print("(install torch to compare: pip install torch==2.13.0)")
        return
    torch.set_num_threads(1)
    tf, tb, tg = _chain(torch, args.nodes)
    print(f"torch:   forward {tf * 1e3:8.1f} ms   backward {tb * 1e3:7.2f} ms "
          f"({tb / args.nodes * 1e9:.0f} ns/node)   dx = {tg:.6f}")
    print(f"backward ratio jitgrad/torch = {bwd / tb:.4f}")


if __name__ == "__main__":
    main()
