"""python -m jitgrad: a short demo of the graph API and of backward speed.

Builds a small graph and prints its grad_fn chain and gradients, then times backward on
a scalar chain of 100,000 nodes, beside PyTorch when it is installed; with a GPU, the
same on CUDA (float32, 10,000 nodes) beside PyTorch CUDA.
"""
import argparse
import time

import jitgrad
from jitgrad.gpu import driver
from jitgrad.graph.node import AccumulateGrad


def _chain(T, n, device="cpu"):
    """(forward s, backward s, dx) of an n-node scalar chain: float64 on the CPU, float32
    on a GPU (synchronized, so the times hold the device's work)."""
    cuda = device != "cpu"
    x = T.tensor(1.0, dtype=T.float32 if cuda else T.float64, device=device, requires_grad=True)
    y = x
    t0 = time.perf_counter()
    for _ in range(n // 2):
        y = y * 1.0001
        y = y + 0.0001
    if cuda:
        T.cuda.synchronize()
    t1 = time.perf_counter()
    y.backward()
    if cuda:
        T.cuda.synchronize()
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, x.grad.item()


def _report(name, n, fwd, bwd, g):
    print(f"{name:<13} forward {fwd * 1e3:8.1f} ms   backward {bwd * 1e3:7.2f} ms "
          f"({bwd / n * 1e9:.0f} ns/node)   dx = {g:.6f}")


def cuda_section(n, torch):
    """The chain's backward on the GPU, beside PyTorch CUDA; or why there is none."""
    print(f"\n== CUDA backward: scalar chain of {n:,} nodes, float32 ==")
    if driver.simulated():
        print("no CUDA device: NUMBA_ENABLE_CUDASIM is set (numba's simulator runs kernels, but is no GPU to time)")
        return
    if not jitgrad.cuda.is_available():
        print("no CUDA device (jitgrad's CUDA target needs an NVIDIA GPU, its driver and numba-cuda: "
              "pip install -e '.[cuda]')")
        return
    print(f"device: {jitgrad.cuda.get_device_name()}")
    t0 = time.perf_counter()
    _chain(jitgrad, 100, "cuda")  # compiles (or loads) the device kernels
    print(f"CUDA kernels ready in {time.perf_counter() - t0:.2f} s")
    fwd, bwd, g = _chain(jitgrad, n, "cuda")
    _report("jitgrad cuda:", n, fwd, bwd, g)
    if torch is None or not torch.cuda.is_available():
        print("(PyTorch CUDA not available here: no comparison)")
        return
    _chain(torch, 100, "cuda")
    tf, tb, tg = _chain(torch, n, "cuda")
    _report("torch cuda:", n, tf, tb, tg)
    print(f"CUDA backward ratio jitgrad/torch = {bwd / tb:.4f}")


def print_chain(t):
    """The grad_fn chain, depth first, as in the seed documents' diagrams."""
    seen = set()

    def walk(node, depth):
        if node is None:
            return
        label = type(node).__name__
        if isinstance(node, AccumulateGrad):
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
    ap.add_argument("--cuda-nodes", type=int, default=10_000, help="length of the chain timed on a GPU")
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
    _report("jitgrad:", args.nodes, fwd, bwd, g)
    try:
        import torch
    except ImportError:
        torch = None
        print("(install torch to compare: pip install torch==2.13.0)")
    if torch is not None:
        torch.set_num_threads(1)
        tf, tb, tg = _chain(torch, args.nodes)
        _report("torch:", args.nodes, tf, tb, tg)
        print(f"backward ratio jitgrad/torch = {bwd / tb:.4f}")
    cuda_section(args.cuda_nodes, torch)


if __name__ == "__main__":
    main()
