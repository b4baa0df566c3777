"""The CUDA workloads (issue 12), written once against ``T`` (jitgrad or torch) and a device.

float32, everything on the device; each timed call ends with ``T.cuda.synchronize()``
and each setup with one too, so a timing holds exactly the device work it starts:

* chain 1e4, backward: ``y = y * 1.0001; y = y + 0.0001`` from one scalar leaf, 1e4
  nodes; the backward alone (PyTorch launches a kernel per node).
* wide tree 2e4, backward: 2e4 scalar leaves, ``stack([(x * 2).sin() + 1 ...]).sum()``;
  the backward alone.
* MLP step: zero the grads, forward (``relu(h @ w + b)`` layers), cross-entropy,
  backward: batch 64 of 784-512-512-10, and batch 256 of 2048-2048-2048-10.
* digits CNN step: one training step (zero_grad, forward, cross-entropy, backward,
  Adam) of jitgrad/examples/digits.py's CNN on a batch of 256 of its 8x8 images.

benchmarks/side_by_side.py times them beside PyTorch CUDA (``cuda_comparisons``),
benchmarks/bench_cuda.py for asv; tests/cuda/test_examples.py runs them at tiny sizes
(``TINY``) on the simulator, so they keep working while no GPU runs them.
"""
import numpy as np

from jitgrad.examples import digits
from jitgrad.gpu import driver

CHAIN_N = 10_000
WIDE_N = 20_000
# name: (batch, layer sizes)
MLPS = {"MNIST MLP": (64, (784, 512, 512, 10)), "large MLP": (256, (2048, 2048, 2048, 10))}
CNN_BATCH = 256
# the same workloads at sizes the simulator runs in seconds
TINY = {"chain": 10, "wide": 6, "mlp": (4, (12, 8, 8, 10)), "cnn": 2}

# (workload, phase) -> max ratio jitgrad / PyTorch CUDA
TARGETS = {
    ("chain 1e4", "cuda backward"): 0.1,
    ("wide tree 2e4", "cuda backward"): 0.2,
    ("MNIST MLP", "cuda step"): 1.2,
    ("large MLP", "cuda step"): 1.1,
    ("digits CNN b256", "cuda step"): 1.5,
}


def sync(T, device):
    if device != "cpu":
        T.cuda.synchronize()


def no_gpu(jitgrad):
    """Why jitgrad has no GPU to time here (a row's "skipped: ..." text), or None."""
    if driver.simulated():
        return "skipped: simulator, no GPU"          # NUMBA_ENABLE_CUDASIM is set
    if not jitgrad.cuda.is_available():
        return "skipped: no GPU"
    return None


def not_on_gpu(jitgrad, torch):
    """no_gpu, or torch's lack of CUDA: None when a real GPU serves both libraries."""
    why = no_gpu(jitgrad)
    if why is None and (torch is None or not torch.cuda.is_available()):
        why = "skipped: torch has no CUDA"
    return why


# ------------------------------------------------------------------ backward of graphs

def chain_setup(T, device="cuda", n=CHAIN_N):
    """(leaf, output) of the n-node scalar chain, recorded."""
    x = T.tensor(1.0, dtype=T.float32, device=device, requires_grad=True)
    y = x
    for _ in range(n // 2):
        y = y * 1.0001
        y = y + 0.0001
    sync(T, device)
    return x, y


def wide_setup(T, device="cuda", n=WIDE_N):
    """(leaves, output) of the n-leaf wide tree, recorded."""
    vals = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    leaves = [T.tensor(float(v), dtype=T.float32, device=device, requires_grad=True) for v in vals]
    loss = T.stack([(x * 2.0).sin() + 1.0 for x in leaves]).sum()
    sync(T, device)
    return leaves, loss


def backward(T, state, device="cuda"):
    state[1].backward()
    sync(T, device)


def graph_result(state):
    """(output, the first leaf's gradient) after backward: what the libraries must agree on."""
    first = state[0] if not isinstance(state[0], list) else state[0][0]
    return state[1].item(), first.grad.item()


# ------------------------------------------------------------------ training steps

def mlp_setup(T, device="cuda", batch=64, sizes=MLPS["MNIST MLP"][1]):
    """(params, x, target) of an MLP, the same numbers for both libraries."""
    rng = np.random.default_rng(0)
    params = []
    for n_in, n_out in zip(sizes[:-1], sizes[1:]):
        w = (rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(np.float32)
        params.append((T.tensor(w, device=device, requires_grad=True),
                       T.tensor(np.zeros(n_out, np.float32), device=device, requires_grad=True)))
    x = T.tensor(rng.standard_normal((batch, sizes[0])).astype(np.float32), device=device)
    target = T.tensor(rng.integers(0, sizes[-1], size=batch), device=device)
    sync(T, device)
    return params, x, target


def mlp_step(T, state, device="cuda"):
    params, x, target = state
    for w, b in params:
        w.grad = None
        b.grad = None
    h = x
    for w, b in params[:-1]:
        h = T.relu(h @ w + b)
    w, b = params[-1]
    loss = T.nn.functional.cross_entropy(h @ w + b, target)
    loss.backward()
    sync(T, device)
    return loss


def mlp_result(state, loss):
    return loss.item(), float(np.abs(state[0][0][0].grad.cpu().numpy()).sum())


def cnn_setup(T, device="cuda", batch=CNN_BATCH):
    """(model, its training step, x, y): the digits example's CNN with Adam, on a batch of
    its images."""
    xtr, ytr, _, _ = digits.load_split()
    model = digits.build_cnn(T, digits.cnn_weights())
    model.to(device)
    step = digits.train_step(model, T.optim.Adam(model.parameters(), lr=3e-3), T.nn.CrossEntropyLoss())
    x = T.tensor(xtr[:batch].reshape(-1, 1, 8, 8), device=device)
    y = T.tensor(ytr[:batch], device=device)
    sync(T, device)
    return model, step, x, y


def cnn_step(T, state, device="cuda"):
    _, step, x, y = state
    loss = step(x, y)
    sync(T, device)
    return loss


def cnn_result(state, loss):
    return loss.item(), float(np.abs(state[0][0].weight.grad.cpu().numpy()).sum())


# ------------------------------------------------------------------ all of them

def workloads(T, device="cuda", tiny=False):
    """(workload, phase) -> (setup(), timed(state), result(state, timed's return))."""
    chain_n, wide_n = (TINY["chain"], TINY["wide"]) if tiny else (CHAIN_N, WIDE_N)
    out = {
        ("chain 1e4", "cuda backward"): (lambda: chain_setup(T, device, chain_n),
                                         lambda s: backward(T, s, device), lambda s, _: graph_result(s)),
        ("wide tree 2e4", "cuda backward"): (lambda: wide_setup(T, device, wide_n),
                                             lambda s: backward(T, s, device), lambda s, _: graph_result(s)),
    }
    for name, (batch, sizes) in MLPS.items():
        if tiny:
            batch, sizes = TINY["mlp"]
        out[(name, "cuda step")] = (lambda b=batch, z=sizes: mlp_setup(T, device, b, z),
                                    lambda s: mlp_step(T, s, device), mlp_result)
    out[("digits CNN b256", "cuda step")] = (lambda: cnn_setup(T, device, TINY["cnn"] if tiny else CNN_BATCH),
                                             lambda s: cnn_step(T, s, device), cnn_result)
    return out


def run_once(workload):
    """Set up, run and read back one workload: its result pair."""
    setup, timed, result = workload
    state = setup()
    return result(state, timed(state))


def check(jitgrad, torch, device="cuda", torch_device="cuda", tiny=False, rtol=1e-3):
    """Each workload once per library (which also compiles jitgrad's kernels before the
    timings): the lines where results differ."""
    ours, theirs = workloads(jitgrad, device, tiny), workloads(torch, torch_device, tiny)
    problems = []
    for key in ours:
        a, b = run_once(ours[key]), run_once(theirs[key])
        if not np.allclose(a, b, rtol=rtol, atol=1e-5):
            problems.append(f"{key[0]} {key[1]}: jitgrad {a} vs torch {b}")
    return problems


def cuda_comparisons(jitgrad, torch):
    """side_by_side.py's rows for the CUDA workloads: jitgrad vs PyTorch CUDA on a real
    GPU, or rows skipped with not_on_gpu's reason."""
    why = not_on_gpu(jitgrad, torch)
    if why:
        return [{"key": key, "vs": "torch cuda", "target": TARGETS[key], "note": None, "skipped": why,
                 "sides": None} for key in TARGETS]
    return timed_rows(jitgrad, torch)


def timed_rows(jitgrad, torch, tiny=False, torch_device="cuda"):
    """The rows with both sides to time (the tests time tiny ones with torch on the CPU)."""
    ours, theirs = workloads(jitgrad, "cuda", tiny), workloads(torch, torch_device, tiny)
    return [{"key": key, "vs": "torch cuda", "target": TARGETS[key], "note": None, "skipped": None,
             "sides": {"jitgrad": ours[key][:2], "torch cuda": theirs[key][:2]}} for key in TARGETS]
