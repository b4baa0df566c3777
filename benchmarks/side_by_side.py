#!/usr/bin/env python
"""jitgrad vs torch, side by side, single-threaded (and the MLP steps at default threads).

    python benchmarks/side_by_side.py [--quick] [--json out.json] [--torch-compile]

Every workload is written once against a module parameter ``T`` (``jitgrad``
or ``torch``), so the code timed is the same text for both libraries. Each
phase gets warm-up runs, then the median of several repeats (the two
libraries take turns); untimed setup (building inputs, or the graph for a
backward phase) runs before each repeat.

It also measures
* peak memory added by forward+backward (large MLP, 1e5 chain), each in a
  fresh child process: after a warm-up step, the kernel's peak-RSS counter is
  reset (``/proc/self/clear_refs``) and the peak above the RSS just before the
  step is read back (VmHWM); where that is not possible, RSS is sampled from a
  thread;
* start-up: wall time of a fresh ``python`` doing ``import jitgrad`` and one
  small backward, with warm caches and with cold ones (empty
  ``NUMBA_CACHE_DIR`` and ``JITGRAD_CACHE_DIR``, where jitgrad writes its
  generated engine). torch's import + first backward is shown for reference.

The "step, default" rows time the MNIST and large MLP steps with both libraries at their
default thread counts (torch's physical cores; jitgrad the same), in a child process
without the one-thread settings (benchmarks/blas.py, which also compares thread counts
and BLAS libraries).

``--quick`` uses fewer repeats and skips the cold start (< 1 minute).

The jitgrad.compile rows (issue 11) time the replay of a step compiled with
``jitgrad.compile`` against eager torch running the same step, and for the small
MLP also against ``torch.compile`` of that step (its first call compiles for ~10 s:
run in full runs, or in quick ones with ``--torch-compile``) and against ``jax.jit``
of the same step written in JAX (only where jax is importable). A compiled row's
note says whether the step replayed a plan or ran eagerly because of graph breaks
(then its time is eager jitgrad's). A row's "vs" column names what the ratio
divides by.

The real-program rows (issue 27; benchmarks/real_programs.py) time training steps of
torchdiffeq's examples/ode_demo.py (``odeint`` and ``odeint_adjoint``, dopri5; jitgrad runs
torchdiffeq through its import shim, imported once per library in this process) and of a
2-layer nanoGPT, per step, from the same weights on the same batches; their first losses are
compared first. The ode_demo rows need torchdiffeq (``pip install --no-deps
torchdiffeq==0.2.5``) and say "skipped" without it.

The CUDA rows (issue 12; benchmarks/cuda_workloads.py: chain 1e4 and wide tree 2e4
backward, MNIST-size and large MLP steps, the digits CNN step at batch 256, float32)
time jitgrad's CUDA target beside PyTorch CUDA, each call synchronized. They run only
with a real GPU and a CUDA build of torch (``--only cuda`` selects them); otherwise each
row says why it was skipped.
"""
import os

# Single thread, before numpy / torch / jitgrad are imported (here or in any
# child process, which inherits the environment). Only when run as a script:
# asv imports every module under benchmarks/ and must not be affected.
if __name__ == "__main__":
    for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                 "NUMBA_NUM_THREADS"):
        os.environ[_var] = "1"
    # jax, where installed: CPU only, one thread
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    # torch.compile's first call compiles from scratch, as a new user's does
    os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")
    os.environ["XLA_FLAGS"] = " ".join(
        (os.environ.get("XLA_FLAGS", ""),
         "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")).strip()

import argparse  # noqa: E402
import gc  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

# Benchmark the jitgrad of this checkout, installed or not (children too).
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if __name__ == "__main__":
    sys.path.insert(0, REPO_ROOT)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (REPO_ROOT, os.environ.get("PYTHONPATH")) if p)

# the default-thread rows, the CUDA rows, the real programs (torchdiffeq's ode_demo, a small
# nanoGPT): after the path above
from benchmarks import blas as blas_rows  # noqa: E402
from benchmarks import cuda_workloads, real_programs  # noqa: E402

LIBS = ("jitgrad", "torch")

CHAIN_N = 100_000
WIDE_N = 20_000

# name: (batch, layer sizes, dtype name, loss)
MLP_CONFIGS = {
    "small MLP": (16, (32, 32, 32, 1), "float64", "mse"),
    "MNIST MLP": (64, (784, 512, 512, 10), "float32", "nll"),
    "large MLP": (256, (2048, 2048, 2048, 10), "float32", "nll"),
}

# (workload, phase) -> max ratio jitgrad/torch (the compiled rows' targets are in COMPILE_TARGETS)
TIME_TARGETS = {
    ("small MLP", "forward"): 2.0,
    ("chain 1e5", "backward"): 0.02,
    ("chain 1e5", "forward"): 0.5,
    ("wide tree 2e4", "forward"): 0.5,
    ("small MLP", "step"): 0.5,
    ("MNIST MLP", "step"): 1.0,
    ("large MLP", "step"): 1.1,
    ("MNIST MLP", "step, default"): 1.0,
    ("large MLP", "step, default"): 1.0,
    ("digits MLP", "epoch"): 1.0,
    ("Adam 1e6", "step"): 1.0,
    ("CNN", "step"): 1.5,
    ("jacobian 64", "reverse"): 1.0,
    ("jacobian 64", "forward"): 1.0,
    ("per-sample grads", "vmap(grad)"): 1.0,
    ("jvp chain 1e5", "forward"): 1.0,
    # real programs (issue 27; benchmarks/real_programs.py), per training step
    ("ode_demo", "dopri5 step"): 0.5,
    ("ode_demo", "adjoint step"): 0.7,
    ("small GPT", "step"): 1.0,
}

# jitgrad.compile (issue 11): (workload, phase, what the ratio divides by) -> max ratio.
# "first call" is recording + plan building, divided by one eager jitgrad step.
COMPILE_TARGETS = {
    ("small MLP SGD", "compiled step", "torch"): 0.2,
    ("small MLP SGD", "compiled step", "torch.compile"): 0.15,
    ("small MLP SGD", "compiled step", "jax.jit"): 0.5,
    ("small MLP SGD", "first call", "jitgrad eager"): 3.0,
    ("MNIST MLP SGD", "compiled step", "torch"): 0.9,
    ("chain 1e5", "compiled fwd+bwd", "torch"): 0.02,
    ("chain 1e4", "first call", "jitgrad eager"): 3.0,
    ("wide tree 2e4", "compiled fwd+bwd", "torch"): 0.05,
    ("digits MLP", "compiled epoch", "torch"): 0.3,
}
# The SGD training steps (forward, loss.backward(), opt.step(), opt.zero_grad(), as
# issue 11 writes them) on two of MLP_CONFIGS' models; cross-entropy for the NLL ones.
SGD_MLPS = {"small MLP SGD": "small MLP", "MNIST MLP SGD": "MNIST MLP"}
SGD_LR = 0.01
# Steps of a microsecond-scale workload per timed run (the time reported is per step).
CALLS = 10

# Training workloads (model + loss + optimizer, as a user writes them).
# digits MLP: one epoch of jitgrad/examples/digits.py (sklearn's 8x8 digits,
# 1437 training images, 45 batches).
DIGITS_SIZES = (64, 128, 128, 10)
DIGITS_BATCH = 32
DIGITS_LR = 3e-3
# Adam 1e6: opt.step() alone over ADAM_TENSORS float32 tensors with grads set.
ADAM_TENSORS = (250_000,) * 4
# CNN: batch 32 of 1x28x28, conv(1->8, 3x3) relu conv(8->16, 3x3) relu
# flatten linear(16*24*24 -> 10), cross-entropy, Adam step.
CNN_BATCH = 32
CNN_CHANNELS = (1, 8, 16)
CNN_HW = 28
CNN_CLASSES = 10
# phases skipped when a library lacks what they need: key -> (attribute path, reason)
REQUIRES = {("CNN", "step"): ("nn.Conv2d", "skipped: no Conv2d"),
            ("jacobian 64", "reverse"): ("autograd.functional.jacobian", "skipped: no autograd.functional"),
            ("jacobian 64", "forward"): ("autograd.functional.jacobian", "skipped: no autograd.functional"),
            ("per-sample grads", "vmap(grad)"): ("func.vmap", "skipped: no func.vmap"),
            ("per-sample grads", "loop"): ("func.functional_call", "skipped: no func.functional_call"),
            ("jvp chain 1e5", "forward"): ("autograd.forward_ad.make_dual", "skipped: no forward_ad")}
# Functional workloads (issue 10):
# jacobian 64: autograd.functional.jacobian(f, x, vectorize=True) of f(x) = tanh(W x) * x + sin(x),
# 64 -> 64 in float64, with strategy "reverse-mode" and "forward-mode".
JAC_N = 64
# per-sample grads: each of 64 samples' gradient of the digits MLP's cross-entropy, as
# torch's docs write it: vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y) over
# func.functional_call; "loop": the same gradients one sample at a time with grad(loss).
PSG_BATCH = 64
# Real programs: training steps per timed run (each run trains them from the same weights),
# in full and in --quick runs; the losses of REAL_CHECK_STEPS steps are compared first.
REAL_STEPS = {("ode_demo", "dopri5 step"): 10, ("ode_demo", "adjoint step"): 5, ("small GPT", "step"): 200}
REAL_STEPS_QUICK = {("ode_demo", "dopri5 step"): 3, ("ode_demo", "adjoint step"): 2, ("small GPT", "step"): 50}
REAL_CHECK_STEPS = 3
# float32 through an adaptive solver (its step sizes follow the rounding) or 200k-parameter
# AdamW: a few steps agree to ~1e-6 relative; a wrong program is off by far more
REAL_RTOL, REAL_ATOL = 1e-4, 1e-6
MEM_TARGET = 1.2          # peak-memory ratio jitgrad/torch
STARTUP_WARM_TARGET = 1.0   # seconds
STARTUP_COLD_TARGET = 20.0  # seconds


_T0 = time.perf_counter()


def progress(msg):
    print(f"[{time.perf_counter() - _T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def load(name):
    """Import a library and make it single-threaded."""
    T = importlib.import_module(name)
    if name in LIBS:   # jitgrad follows OMP_NUM_THREADS=1 (set above) already; say it anyway
        T.set_num_threads(1)
    return T


# ------------------------------------------------------------------ workloads
# Everything below is written against ``T`` only.

def chain_leaf(T):
    return T.tensor(1.0, dtype=T.float64, requires_grad=True)


def chain_forward(T, x, n=CHAIN_N):
    y = x
    for _ in range(n // 2):
        y = y * 1.0001
        y = y + 0.0001
    return y


def wide_leaves(T, n=WIDE_N):
    vals = np.random.default_rng(0).standard_normal(n)
    return [T.tensor(float(v), dtype=T.float64, requires_grad=True)
            for v in vals]


def wide_forward(T, leaves):
    outs = [((x * 2.0).sin() + 1.0) for x in leaves]
    return T.stack(outs).sum()


def mlp_arrays(batch, sizes, dtype, loss):
    """numpy inputs, identical for both libraries."""
    rng = np.random.default_rng(0)
    params = []
    for n_in, n_out in zip(sizes[:-1], sizes[1:]):
        w = (rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(dtype)
        params.append((w, np.zeros(n_out, dtype=dtype)))
    x = rng.standard_normal((batch, sizes[0])).astype(dtype)
    if loss == "mse":
        target = rng.standard_normal((batch, sizes[-1])).astype(dtype)
    else:
        target = rng.integers(0, sizes[-1], size=batch).astype(np.int64)
    return params, x, target


def mlp_inputs(T, arrays, dtype, loss):
    params_np, x_np, target_np = arrays
    dt = getattr(T, dtype)
    params = [(T.tensor(w, dtype=dt, requires_grad=True),
               T.tensor(b, dtype=dt, requires_grad=True))
              for w, b in params_np]
    x = T.tensor(x_np, dtype=dt)
    target = T.tensor(target_np, dtype=dt) if loss == "mse" else T.tensor(target_np)
    return params, x, target, loss


def mlp_forward(T, params, x):
    h = x
    for w, b in params[:-1]:
        h = T.relu(h @ w + b)
    w, b = params[-1]
    return h @ w + b


def mlp_step(T, params, x, target, loss):
    for w, b in params:
        w.grad = None
        b.grad = None
    out = mlp_forward(T, params, x)
    if loss == "mse":
        value = ((out - target) ** 2).mean()
    else:
        logp = T.log_softmax(out, dim=1)
        value = -logp[T.arange(out.shape[0]), target].mean()
    value.backward()
    return value


def sgd_setup(T, name):
    """An SGD_MLPS model: (params, optimizer, x, target, loss name)."""
    batch, sizes, dtype, loss = MLP_CONFIGS[SGD_MLPS[name]]
    params, x, target, loss = mlp_inputs(T, mlp_arrays(batch, sizes, dtype, loss), dtype, loss)
    return params, T.optim.SGD([p for wb in params for p in wb], lr=SGD_LR), x, target, loss


def sgd_step(T, params, opt, x, target, loss):
    """One training step as issue 11 writes it (and as a user hands it to compile)."""
    out = mlp_forward(T, params, x)
    if loss == "mse":
        value = ((out - target) ** 2).mean()
    else:
        value = T.nn.functional.cross_entropy(out, target)
    value.backward()
    opt.step()
    opt.zero_grad()
    return value


# --------------------------------------------------------- training workloads

def has_attr_path(T, path):
    obj = T
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return False
    return True


_DIGITS = None


def digits_data():
    """(weights, data) of the digits example, loaded once per process."""
    global _DIGITS
    if _DIGITS is None:
        from jitgrad.examples.digits import initial_weights, load_split
        _DIGITS = (initial_weights(list(DIGITS_SIZES)), load_split())
    return _DIGITS


def digits_setup(T, seed=1):
    """Model, optimizer, loss and the epoch's batch order (not timed)."""
    from jitgrad.examples.digits import build_mlp
    weights, data = digits_data()
    model = build_mlp(T, weights)
    opt = T.optim.Adam(model.parameters(), lr=DIGITS_LR)
    order = np.random.default_rng(seed).permutation(len(data[0]))
    return model, opt, T.nn.CrossEntropyLoss(), data, order


def digits_epoch(T, model, opt, loss_fn, data, order, batch_size=DIGITS_BATCH):
    """One epoch: jitgrad.examples.digits.run_epoch, the loop the example trains with."""
    from jitgrad.examples.digits import run_epoch, train_step
    return run_epoch(T, train_step(model, opt, loss_fn), data[0], data[1], order, batch_size)


def adam_setup(T, sizes=ADAM_TENSORS, warm_steps=1):
    """Adam over float32 tensors with grads set; ``warm_steps`` steps already
    taken, so the timed step is a steady-state one (state allocated)."""
    rng = np.random.default_rng(0)
    params = []
    for n in sizes:
        p = T.tensor(rng.standard_normal(n).astype(np.float32), requires_grad=True)
        p.grad = T.tensor(rng.standard_normal(n).astype(np.float32))
        params.append(p)
    opt = T.optim.Adam(params, lr=1e-3)
    for _ in range(warm_steps):
        opt.step()
    return opt, params


def cnn_arrays(batch=CNN_BATCH, channels=CNN_CHANNELS, hw=CNN_HW, classes=CNN_CLASSES):
    """numpy weights (torch's default init bounds) and one batch, identical for both."""
    rng = np.random.default_rng(0)
    convs = []
    size = hw
    for c_in, c_out in zip(channels[:-1], channels[1:]):
        bound = 1.0 / np.sqrt(c_in * 9)
        convs.append((rng.uniform(-bound, bound, (c_out, c_in, 3, 3)).astype(np.float32),
                      rng.uniform(-bound, bound, c_out).astype(np.float32)))
        size -= 2
    n_flat = channels[-1] * size * size
    bound = 1.0 / np.sqrt(n_flat)
    fc = (rng.uniform(-bound, bound, (classes, n_flat)).astype(np.float32),
          rng.uniform(-bound, bound, classes).astype(np.float32))
    x = rng.standard_normal((batch, channels[0], hw, hw)).astype(np.float32)
    y = rng.integers(0, classes, size=batch).astype(np.int64)
    return convs, fc, x, y


def cnn_setup(T, arrays):
    convs, fc, x_np, y_np = arrays
    layers = []
    for w, b in convs:
        conv = T.nn.Conv2d(w.shape[1], w.shape[0], 3)
        with T.no_grad():
            conv.weight.copy_(T.tensor(w))
            conv.bias.copy_(T.tensor(b))
        layers += [conv, T.nn.ReLU()]
    lin = T.nn.Linear(fc[0].shape[1], fc[0].shape[0])
    with T.no_grad():
        lin.weight.copy_(T.tensor(fc[0]))
        lin.bias.copy_(T.tensor(fc[1]))
    model = T.nn.Sequential(*layers, T.nn.Flatten(), lin)
    opt = T.optim.Adam(model.parameters(), lr=1e-3)
    return model, opt, T.nn.CrossEntropyLoss(), T.tensor(x_np), T.tensor(y_np)


def cnn_step(T, model, opt, loss_fn, x, y):
    opt.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    return loss


# ------------------------------------------------------- functional workloads

def jac_setup(T):
    rng = np.random.default_rng(3)
    w = T.tensor(rng.standard_normal((JAC_N, JAC_N)) / 8, dtype=T.float64)
    x = T.tensor(rng.standard_normal(JAC_N), dtype=T.float64)
    return (lambda v: T.tanh(w @ v) * v + T.sin(v)), x


def jac_run(T, f, x, strategy):
    return T.autograd.functional.jacobian(f, x, vectorize=True, strategy=strategy)


def psg_setup(T):
    """The digits MLP's parameters (detached) and a batch of 64 samples (not timed)."""
    from jitgrad.examples.digits import build_mlp
    weights, (xs, ys) = digits_data()[0], digits_data()[1][:2]  # training images and labels
    model = build_mlp(T, weights)
    params = {k: v.detach() for k, v in model.named_parameters()}
    x = T.tensor(np.asarray(xs[:PSG_BATCH]), dtype=T.float32)
    y = T.tensor(np.asarray(ys[:PSG_BATCH]), dtype=T.int64)

    def loss(p, xi, yi):
        out = T.func.functional_call(model, p, (xi.unsqueeze(0),))
        return T.nn.functional.cross_entropy(out, yi.unsqueeze(0))
    return loss, params, x, y


def psg_vmap(T, loss, params, x, y):
    return T.func.vmap(T.func.grad(loss), in_dims=(None, 0, 0))(params, x, y)


def psg_loop(T, loss, params, x, y):
    g = T.func.grad(loss)
    return [g(params, x[i], y[i]) for i in range(x.shape[0])]


def jvp_chain(T, n=CHAIN_N):
    fw = importlib.import_module(T.__name__ + ".autograd.forward_ad")
    with fw.dual_level():
        y = fw.make_dual(T.tensor(1.0, dtype=T.float64), T.tensor(1.0, dtype=T.float64))
        return fw.unpack_dual(chain_forward(T, y, n)).tangent


def functional_phases(T):
    phases = {}
    for strategy, key in (("reverse-mode", "reverse"), ("forward-mode", "forward")):
        phases[("jacobian 64", key)] = (lambda: jac_setup(T), lambda s, st=strategy: jac_run(T, *s, st))
    phases[("per-sample grads", "vmap(grad)")] = (lambda: psg_setup(T), lambda s: psg_vmap(T, *s))
    phases[("per-sample grads", "loop")] = (lambda: psg_setup(T), lambda s: psg_loop(T, *s))
    phases[("jvp chain 1e5", "forward")] = (lambda: None, lambda _: jvp_chain(T))
    for key in list(phases):
        if not has_attr_path(T, REQUIRES[key][0]):
            phases[key] = None
    return phases


def training_phases(T):
    """The training workloads; a phase is None where ``T`` lacks what it needs."""
    phases = {}
    phases[("digits MLP", "epoch")] = (
        lambda: digits_setup(T), lambda s: digits_epoch(T, *s))
    adam_state = []

    def adam_once():
        # built once (4 x 1e6 floats per library), then stepped repeat after repeat
        if not adam_state:
            adam_state.append(adam_setup(T))
        return adam_state[0][0]

    phases[("Adam 1e6", "step")] = (adam_once, lambda opt: opt.step())
    if has_attr_path(T, REQUIRES[("CNN", "step")][0]):
        arrays = cnn_arrays()
        phases[("CNN", "step")] = (lambda: cnn_setup(T, arrays), lambda s: cnn_step(T, *s))
    else:
        phases[("CNN", "step")] = None
    return phases


# ------------------------------------------------- jitgrad.compile workloads (issue 11)
# A step is written once against T, then run eagerly, under T.compile (jitgrad.compile
# or torch.compile) or, for JAX, written again in JAX. A timed side is built and warmed
# once (the compiled ones record at their first call and replay from the second) and
# then runs again and again, its parameters training on as they would in a loop.

class Step:
    """One step (or epoch) ready to run: call() runs it; compiled is the compiled
    function inside (for plan_note); leaves are tensors whose .grad each timed run starts
    without; first_s is the first call's seconds (record, or compile, + one step)."""

    def __init__(self, call, compiled=None, leaves=()):
        self.call = call
        self.compiled = compiled
        self.leaves = leaves
        self.first_s = None

    def repeat(self, n):
        for _ in range(n):
            out = self.call()
        return out


def _wrapped(fn, wrap):
    return fn if wrap is None else wrap(fn)


def warm(step):
    """Run the step twice (a compiled one records / compiles, then replays once)."""
    t0 = time.perf_counter()
    step.call()
    step.first_s = time.perf_counter() - t0
    step.call()
    return step


def sgd_run(T, name, wrap=None):
    """The SGD_MLPS step `name` as a Step; wrap: T.compile or None (eager)."""
    params, opt, x, target, loss = sgd_setup(T, name)

    def train_step(x, target):
        return sgd_step(T, params, opt, x, target, loss)
    fn = _wrapped(train_step, wrap)
    return Step(lambda: fn(x, target), fn)


def mlp_forward_run(T):
    """The small MLP's forward alone (eager; parameters that require grad, so it records)."""
    batch, sizes, dtype, loss = MLP_CONFIGS["small MLP"]
    params, x, _, _ = mlp_inputs(T, mlp_arrays(batch, sizes, dtype, loss), dtype, loss)
    return Step(lambda: mlp_forward(T, params, x))


def chain_run(T, wrap=None, n=CHAIN_N):
    """The 1e5 chain's forward and backward as one step of the leaf x it closes over."""
    x = chain_leaf(T)

    def step():
        y = chain_forward(T, x, n)
        y.backward()
        return y
    fn = _wrapped(step, wrap)
    return Step(fn, fn, [x])


def wide_run(T, wrap=None, n=WIDE_N):
    """The wide tree's forward and backward as one step of the leaves it closes over."""
    leaves = wide_leaves(T, n)

    def step():
        loss = wide_forward(T, leaves)
        loss.backward()
        return loss
    fn = _wrapped(step, wrap)
    return Step(fn, fn, leaves)


def digits_run(T, wrap=None):
    """An epoch of the digits example, its training step wrapped."""
    from jitgrad.examples.digits import run_epoch, train_step
    model, opt, loss_fn, data, order = digits_setup(T)
    fn = _wrapped(train_step(model, opt, loss_fn), wrap)
    return Step(lambda: run_epoch(T, fn, data[0], data[1], order, DIGITS_BATCH), fn)


def load_jax():
    """jax (float64 enabled, as the small MLP is float64), or None where it is not installed."""
    try:
        jax = importlib.import_module("jax")
    except ImportError:
        return None
    jax.config.update("jax_enable_x64", True)
    return jax


def jax_sgd_run(jax, name):
    """sgd_step written in JAX: value_and_grad and the SGD update under one jax.jit."""
    batch, sizes, dtype, loss = MLP_CONFIGS[SGD_MLPS[name]]
    params_np, x_np, target_np = mlp_arrays(batch, sizes, dtype, loss)
    jnp = jax.numpy

    def loss_of(params, x, target):
        h = x
        for w, b in params[:-1]:
            h = jax.nn.relu(h @ w + b)
        w, b = params[-1]
        out = h @ w + b
        if loss == "mse":
            return ((out - target) ** 2).mean()
        return -jnp.take_along_axis(jax.nn.log_softmax(out, axis=1), target[:, None], axis=1).mean()

    @jax.jit
    def train_step(params, x, target):
        value, grads = jax.value_and_grad(loss_of)(params, x, target)
        return jax.tree_util.tree_map(lambda p, g: p - SGD_LR * g, params, grads), value

    state = [[(jnp.asarray(w), jnp.asarray(b)) for w, b in params_np]]
    x, target = jnp.asarray(x_np), jnp.asarray(target_np)

    def call():
        state[0], value = train_step(state[0], x, target)
        return value.block_until_ready()
    return Step(call)


def graph_breaks(fn):
    """(reason, where) of each graph break the signatures jitgrad.compile's `fn` recorded met."""
    return [b for e in fn.cache.values() for b in getattr(e, "breaks", ())]


def plan_note(fn):
    """Did jitgrad.compile's function `fn` replay plans, or run eagerly (graph breaks)?"""
    entries = list(fn.cache.values())
    plans = sum(type(e).__name__ == "_Entry" for e in entries)
    breaks = graph_breaks(fn)
    if not entries:
        return "not recorded"
    if not breaks:
        return f"replays {plans} plan(s)"
    return (f"NO PLAN for {len(entries) - plans} of {len(entries)} signature(s), eager: "
            f"{len(breaks)} graph break(s), first: {breaks[0][0]}")


def steady(build):
    """setup(): the Step build() makes at the first run, warmed, at every run (its leaves' .grad reset)."""
    box = []

    def setup():
        if not box:
            box.append(warm(build()))
        for t in box[0].leaves:
            t.grad = None
        return box[0]
    setup.box = box
    return setup


def fresh(build):
    """setup(): a new Step from build() at every run (the last one kept, for the note)."""
    box = []

    def setup():
        box[:] = [build()]
        return box[0]
    setup.box = box
    return setup


def compile_comparisons(jg, torch, jax, with_torch_compile):
    """The jitgrad.compile rows, as dicts: key (workload, phase), vs (what the ratio divides
    by), sides {name: (setup, timed, steps per timed run)} or skipped (why not), and note()
    (whether the compiled side replayed a plan; a compiling reference's first call)."""
    rows = []

    def row(key, vs, jitgrad_side, ref_side, skipped=None):
        def note():
            jit, ref = jitgrad_side[0].box, ref_side[0].box
            parts = [plan_note(jit[0].compiled)] if jit else []
            if vs in ("torch.compile", "jax.jit") and ref:
                parts.append(f"{vs}'s first call {ref[0].first_s:.3g} s")
            return "; ".join(parts)
        rows.append({"key": key, "vs": vs, "target": COMPILE_TARGETS.get(key + (vs,)), "note": note,
                     "skipped": skipped, "sides": None if skipped else {"jitgrad": jitgrad_side, vs: ref_side}})

    def repeated(setup):
        return setup, lambda s: s.repeat(CALLS), CALLS

    def once(setup):
        return setup, lambda s: s.call(), 1

    for name in SGD_MLPS:
        compiled = repeated(steady(lambda n=name: sgd_run(jg, n, jg.compile)))
        row((name, "compiled step"), "torch", compiled, repeated(steady(lambda n=name: sgd_run(torch, n))))
        if name != "small MLP SGD":
            continue
        row((name, "compiled step"), "torch.compile", compiled,
            repeated(steady(lambda n=name: sgd_run(torch, n, torch.compile))),
            None if with_torch_compile else "skipped: in full runs, or with --torch-compile")
        row((name, "compiled step"), "jax.jit", compiled, repeated(steady(lambda n=name: jax_sgd_run(jax, n))),
            None if jax is not None else "skipped: jax is not installed")
        row((name, "first call"), "jitgrad eager", once(fresh(lambda n=name: sgd_run(jg, n, jg.compile))),
            once(fresh(lambda n=name: sgd_run(jg, n))))
    for workload, run in (("chain 1e5", chain_run), ("wide tree 2e4", wide_run)):
        row((workload, "compiled fwd+bwd"), "torch", once(steady(lambda r=run: r(jg, jg.compile))),
            once(steady(lambda r=run: r(torch))))
    # a tenth of the chain: recording the whole one takes seconds, per run
    row(("chain 1e4", "first call"), "jitgrad eager", once(fresh(lambda: chain_run(jg, jg.compile, CHAIN_N // 10))),
        once(fresh(lambda: chain_run(jg, None, CHAIN_N // 10))))
    row(("digits MLP", "compiled epoch"), "torch", once(steady(lambda: digits_run(jg, jg.compile))),
        once(steady(lambda: digits_run(torch))))
    return rows


def check_compiled(jg, torch, jax):
    """Replay equals eager jitgrad (rtol 1e-12 float64, 1e-5 float32), and eager jitgrad
    agrees with torch and jax (as check_agreement), on small versions of the compiled rows."""
    problems = []

    def compare(what, got, want, rtol):
        got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
        if not np.allclose(got, want, rtol=rtol, atol=0 if rtol < 1e-3 else 1e-5):
            problems.append(f"{what}: {got.tolist()!r} vs {want.tolist()!r}")

    for name, mlp in SGD_MLPS.items():
        rtol = 1e-12 if MLP_CONFIGS[mlp][2] == "float64" else 1e-5
        runs = {"eager": sgd_run(jg, name), "compiled": sgd_run(jg, name, jg.compile), "torch": sgd_run(torch, name)}
        if jax is not None and name == "small MLP SGD":
            runs["jax"] = jax_sgd_run(jax, name)
        losses = {k: [r.call().item() for _ in range(4)] for k, r in runs.items()}
        compare(f"{name} losses, jitgrad.compile vs eager jitgrad", losses["compiled"], losses["eager"], rtol)
        for ref in ("torch", "jax"):
            if ref in losses:
                compare(f"{name} losses, jitgrad vs {ref}", losses["eager"], losses[ref], 1e-3)
    for what, run, n in (("chain", chain_run, 1000), ("wide tree", wide_run, 100)):
        out = {}
        for k, wrap in (("eager", None), ("compiled", jg.compile)):
            step = run(jg, wrap, n=n)
            res = []
            for _ in range(3):
                for t in step.leaves:
                    t.grad = None
                res += [step.call().item(), step.leaves[0].grad.item()]
            out[k] = res
        compare(f"{what} value and grad, jitgrad.compile vs eager jitgrad", out["compiled"], out["eager"], 1e-12)
    compare("digits epoch losses, jitgrad.compile vs eager jitgrad", digits_run(jg, jg.compile).call(),
            digits_run(jg).call(), 1e-5)
    return problems


def make_mlp_phases(T):
    """The MLP_CONFIGS' training steps, as make_phases' entries."""
    phases = {}
    for name, (batch, sizes, dtype, loss) in MLP_CONFIGS.items():
        arrays = mlp_arrays(batch, sizes, dtype, loss)
        phases[(name, "step")] = (
            # default arguments bind this iteration's values
            lambda a=arrays, d=dtype, lo=loss: mlp_inputs(T, a, d, lo),
            lambda s: mlp_step(T, *s))
    return phases


def make_phases(T):
    """(workload, phase) -> (setup(), timed(state)[, steps per timed run]); setup is not timed."""
    phases = {}

    def chain_bwd_setup():
        x = chain_leaf(T)
        return x, chain_forward(T, x)

    phases[("chain 1e5", "forward")] = (
        lambda: chain_leaf(T), lambda x: chain_forward(T, x))
    phases[("chain 1e5", "backward")] = (
        chain_bwd_setup, lambda s: s[1].backward())

    def wide_bwd_setup():
        leaves = wide_leaves(T)
        return leaves, wide_forward(T, leaves)

    phases[("wide tree 2e4", "forward")] = (
        lambda: wide_leaves(T), lambda leaves: wide_forward(T, leaves))
    phases[("wide tree 2e4", "backward")] = (
        wide_bwd_setup, lambda s: s[1].backward())

    phases.update(make_mlp_phases(T))
    phases[("small MLP", "forward")] = (steady(lambda: mlp_forward_run(T)), lambda s: s.repeat(CALLS), CALLS)
    phases[("small MLP SGD", "eager step")] = (
        steady(lambda: sgd_run(T, "small MLP SGD")), lambda s: s.repeat(CALLS), CALLS)
    phases.update(training_phases(T))
    phases.update(functional_phases(T))
    return phases


def check_agreement(libs):
    """Loss and one gradient from both libraries: catches a broken workload."""
    out = {}
    for name, T in libs.items():
        res = {}
        x = chain_leaf(T)
        y = chain_forward(T, x, 1000)
        y.backward()
        res["chain"] = (y.item(), x.grad.item())
        leaves = wide_leaves(T, 100)
        loss = wide_forward(T, leaves)
        loss.backward()
        res["wide tree"] = (loss.item(), leaves[0].grad.item())
        for mlp, (batch, sizes, dtype, lo) in MLP_CONFIGS.items():
            inputs = mlp_inputs(T, mlp_arrays(batch, sizes, dtype, lo), dtype, lo)
            value = mlp_step(T, *inputs)
            g = inputs[0][0][0].grad
            res[mlp] = (value.item(), float(np.abs(np.asarray(g.numpy())).sum()))
        res.update(check_training(T))
        out[name] = res
    problems = []
    for key, (a_loss, a_grad) in out["jitgrad"].items():
        if key not in out["torch"]:
            continue
        b_loss, b_grad = out["torch"][key]
        for what, a, b in (("loss", a_loss, b_loss), ("grad", a_grad, b_grad)):
            if not np.isclose(a, b, rtol=1e-3, atol=1e-5):
                problems.append(f"{key} {what}: jitgrad {a!r} vs torch {b!r}")
    return problems


def real_selected(only):
    """The real-program rows that --only selects."""
    return [key for key in real_programs.ROWS if selected(key, "torch", only)]


def check_real(programs, keys):
    """The first REAL_CHECK_STEPS losses of each real program, jitgrad's against torch's (the
    same weights and batches): the problems, and {row: why} for the rows that disagree."""
    problems, disagree = [], {}
    for key in keys:
        if programs.skipped(key):
            continue
        progress(f"  {key[0]} {key[1]}: {REAL_CHECK_STEPS} steps on each library ...")
        losses = {lib: programs.losses(key, lib, REAL_CHECK_STEPS) for lib in LIBS}
        if not np.allclose(losses["jitgrad"], losses["torch"], rtol=REAL_RTOL, atol=REAL_ATOL):
            disagree[key] = (f"losses disagree with torch's: jitgrad {losses['jitgrad']!r} "
                             f"vs torch {losses['torch']!r}")
            problems.append(f"{key[0]} {key[1]}: {disagree[key]}")
    return problems, disagree


def real_comparisons(programs, keys, steps, disagree):
    """The real-program rows, as compile_comparisons' dicts; a row whose losses disagreed
    is timed but fails, its note says why."""
    rows = []
    for key in keys:
        skipped = programs.skipped(key)
        n = steps[key]
        why = disagree.get(key)
        rows.append({"key": key, "vs": "torch", "target": TIME_TARGETS[key], "skipped": skipped,
                     "disagree": why,
                     "note": lambda n=n, why=why: why or f"per step; {n} steps from the same weights per run",
                     "sides": None if skipped else {
                         lib: (programs.setup(key, lib, n), programs.timed(key), n) for lib in LIBS}})
    return rows


def _abs_sum(t):
    return float(np.abs(np.asarray(t.detach().numpy(), dtype=np.float64)).sum())


def check_training(T):
    """(loss-like, parameter- or grad-like) per training workload, as check_agreement."""
    res = {}
    model, opt, loss_fn, data, order = digits_setup(T)
    losses = digits_epoch(T, model, opt, loss_fn, data, order)
    res["digits MLP epoch"] = (float(np.mean(losses)), _abs_sum(model[0].weight))
    opt, params = adam_setup(T, sizes=(1000, 1000), warm_steps=3)
    res["Adam steps"] = (float(np.asarray(params[0].detach().numpy(), dtype=np.float64).sum()),
                         _abs_sum(params[1]))
    if has_attr_path(T, REQUIRES[("CNN", "step")][0]):
        model, opt, loss_fn, x, y = cnn_setup(T, cnn_arrays())
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        res["CNN step"] = (loss.item(), _abs_sum(model[0].weight.grad))
    return res


# ------------------------------------------------------------------- timing

def _run_once(setup, timed):
    state = setup()
    gc.collect()
    t0 = time.perf_counter()
    timed(state)
    t1 = time.perf_counter()
    del state
    return t1 - t0


def measure_phase(phases, warmup, repeats, min_time, max_wall):
    """Median time of ``timed(setup())`` per side (divided by the steps a timed run
    takes, where a phase names them as a third element).

    The sides take turns run by run, so a background load drifting in or
    out biases neither. After ``warmup`` runs each, at least ``repeats`` runs;
    for fast phases more (up to 100), while a side's timed total is under
    ``min_time`` seconds and the phase has used less than ``max_wall`` seconds
    of wall time (setup included).
    """
    times = {name: [] for name in phases}
    for _ in range(warmup):
        for setup, timed, *_ in phases.values():
            _run_once(setup, timed)
    start = time.perf_counter()
    while True:
        for name, (setup, timed, *_) in phases.items():
            times[name].append(_run_once(setup, timed))
        n = len(times[next(iter(times))])
        if n >= repeats and (
                n >= 100
                or min(sum(t) for t in times.values()) >= min_time
                or time.perf_counter() - start >= max_wall):
            break
    return {name: statistics.median(t) / (phases[name][2] if len(phases[name]) > 2 else 1)
            for name, t in times.items()}


def selected(key, vs, only):
    """Does the row match one of the ``--only`` substrings (or no filter)?"""
    return not only or any(o.lower() in f"{key[0]} {key[1]} {vs}".lower() for o in only)


def comparisons(libs, jax, with_torch_compile, real=()):
    """Every row to time: make_phases' jitgrad-vs-torch rows, the compiled ones, the CUDA
    ones, then ``real``'s (real_comparisons' rows)."""
    phases = {name: make_phases(T) for name, T in libs.items()}
    rows = []
    for key in phases[LIBS[0]]:
        skipped = None
        if any(phases[name][key] is None for name in LIBS):
            skipped = REQUIRES.get(key, (None, "skipped"))[1]
        rows.append({"key": key, "vs": "torch", "target": TIME_TARGETS.get(key), "note": None,
                     "skipped": skipped, "sides": None if skipped else {n: phases[n][key] for n in LIBS}})
    return (rows + compile_comparisons(libs["jitgrad"], libs["torch"], jax, with_torch_compile)
            + cuda_workloads.cuda_comparisons(libs["jitgrad"], libs["torch"]) + list(real))


def run_timings(libs, warmup, repeats, min_time, max_wall, only=None, jax=None, with_torch_compile=False,
                real=()):
    todo = comparisons(libs, jax, with_torch_compile, real)
    # Objects alive now (the libraries, numpy inputs) are moved out of the
    # collector's reach: the gc.collect() before each run stays cheap.
    gc.collect()
    gc.freeze()
    rows = []
    for c in todo:
        key, vs = c["key"], c["vs"]
        if not selected(key, vs, only):
            continue
        row = {"workload": key[0], "phase": key[1], "vs": vs, "target": c["target"], "pass": None}
        rows.append(row)
        if c["skipped"]:
            row["skipped"] = c["skipped"]
            progress(f"  {key[0]} {key[1]} vs {vs}: {c['skipped']}")
            continue
        res = measure_phase(c["sides"], warmup, repeats, min_time, max_wall)
        ratio = res["jitgrad"] / res[vs]
        row.update({"jitgrad_s": res["jitgrad"], "ref_s": res[vs], "ratio": ratio,
                    "pass": None if c["target"] is None else ratio <= c["target"]})
        if c.get("disagree"):
            row["pass"] = False
        if c["note"]:
            row["note"] = c["note"]()
        progress(f"  {key[0]} {key[1]}: jitgrad {res['jitgrad']:.4g} s, {vs} {res[vs]:.4g} s"
                 + (f" ({row['note']})" if row.get("note") else ""))
    return rows


def run_default_threads(repeats, only=None):
    """The MLP steps with both libraries at their default thread counts (the rows above run
    at one thread), in a child process that sets no thread variable (benchmarks/blas.py)."""
    keys = [k for k in (("MNIST MLP", "step"), ("large MLP", "step"))
            if selected((k[0], "step, default"), "torch", only)]
    if not keys:
        return []
    progress("default thread counts (child process) ...")
    rows = []
    for r in blas_rows.run_child("default", repeats=max(repeats, 5), workloads=keys):
        key = (r["workload"], "step, default")
        ratio = r["jitgrad_s"] / r["torch_s"]
        note = (f"threads: jitgrad {r['threads']['jitgrad']}, torch {r['threads']['torch']}; "
                f"jitgrad's BLAS {r['blas']}")
        rows.append({"workload": key[0], "phase": key[1], "vs": "torch", "target": TIME_TARGETS[key],
                     "jitgrad_s": r["jitgrad_s"], "ref_s": r["torch_s"], "ratio": ratio,
                     "pass": ratio <= TIME_TARGETS[key], "note": note})
        progress(f"  {key[0]} {key[1]}: jitgrad {r['jitgrad_s']:.4g} s, torch {r['torch_s']:.4g} s ({note})")
    return rows


# ------------------------------------------------------------------- memory

def _proc_status_kb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def _reset_peak_rss():
    """Reset the kernel's peak-RSS counter (Linux >= 4.0); False if we can't."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        _proc_status_kb("VmHWM")
        return True
    except (OSError, KeyError):
        return False


def _current_rss():
    try:
        return _proc_status_kb("VmRSS") * 1024
    except (OSError, KeyError):
        import psutil
        return psutil.Process().memory_info().rss


def peak_added(fn):
    """Bytes of peak RSS above the RSS just before ``fn()`` runs."""
    gc.collect()
    if _reset_peak_rss():
        before = _current_rss()
        fn()
        return _proc_status_kb("VmHWM") * 1024 - before
    # Fallback: sample RSS from a thread.
    before = _current_rss()
    peak = [before]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], _current_rss())
            time.sleep(0.0005)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    fn()
    done.set()
    thread.join()
    peak[0] = max(peak[0], _current_rss())
    return peak[0] - before


def memory_child(lib, workload):
    """Runs in a fresh process: peak memory added by one forward+backward."""
    T = load(lib)
    if workload == "chain 1e5":
        # warm up on a short chain (kernels, lazy init) ...
        x = chain_leaf(T)
        chain_forward(T, x, 1000).backward()
        del x
        x = chain_leaf(T)
        # ... then measure the full one
        return peak_added(lambda: chain_forward(T, x).backward())
    batch, sizes, dtype, loss = MLP_CONFIGS[workload]
    inputs = mlp_inputs(T, mlp_arrays(batch, sizes, dtype, loss), dtype, loss)
    mlp_step(T, *inputs)          # warm-up step
    for w, b in inputs[0]:        # measured step allocates the grads again
        w.grad = None
        b.grad = None
    return peak_added(lambda: mlp_step(T, *inputs))


def run_memory():
    env = dict(os.environ)
    # A fixed mmap threshold keeps glibc from raising it after the warm-up
    # step, so large blocks freed by the warm-up go back to the OS and the
    # measured step has to map them again (same for both libraries).
    env["MALLOC_MMAP_THRESHOLD_"] = str(128 * 1024)
    rows = []
    for workload in ("large MLP", "chain 1e5"):
        res = {}
        for lib in LIBS:
            proc = subprocess.run(
                [sys.executable, os.path.abspath(__file__), "--mem-child", lib, workload],
                env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"memory child {lib} / {workload} failed:\n{proc.stderr}")
            res[lib] = json.loads(proc.stdout.strip().splitlines()[-1])["peak_bytes"]
        ratio = res["jitgrad"] / res["torch"] if res["torch"] > 0 else float("inf")
        rows.append({
            "workload": workload, "phase": "forward+backward",
            "jitgrad_bytes": res["jitgrad"], "torch_bytes": res["torch"],
            "ratio": ratio, "target": MEM_TARGET, "pass": ratio <= MEM_TARGET,
        })
        progress(f"  memory {workload}: jitgrad {res['jitgrad'] / 2**20:.1f} MiB, "
                 f"torch {res['torch'] / 2**20:.1f} MiB")
    return rows


# ------------------------------------------------------------------ start-up

STARTUP_CODE = """\
import time
t0 = time.perf_counter()
import {lib} as T
x = T.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], requires_grad=True)
w = T.tensor([[0.5, -0.5], [1.0, 0.0], [0.0, 1.0]], requires_grad=True)
y = T.relu(x @ w).exp().sum()
y.backward()
assert x.grad is not None
print(time.perf_counter() - t0)
"""


def startup_once(lib, cache_dir=None):
    """(wall time of the whole child, time inside it for import + backward)."""
    env = dict(os.environ)
    if cache_dir is not None:
        # cold: numba's cache and jitgrad's generated engine both start empty
        env["NUMBA_CACHE_DIR"] = os.path.join(cache_dir, "numba")
        env["JITGRAD_CACHE_DIR"] = os.path.join(cache_dir, "jitgrad")
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", STARTUP_CODE.format(lib=lib)],
                          env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"start-up child ({lib}) failed:\n{proc.stderr}")
    return wall, float(proc.stdout.strip().splitlines()[-1])


def startup_median(lib, repeats, cold=False):
    walls, inner = [], []
    for _ in range(repeats):
        if cold:
            with tempfile.TemporaryDirectory(prefix="jitgrad-cold-start-") as d:
                w, i = startup_once(lib, cache_dir=d)
        else:
            w, i = startup_once(lib)
        walls.append(w)
        inner.append(i)
    return statistics.median(walls), statistics.median(inner)


def run_startup(repeats, cold_repeats):
    rows = []
    startup_once("jitgrad")  # fills the default caches if they are empty
    wall, inner = startup_median("jitgrad", repeats)
    rows.append({"what": "jitgrad, warm cache", "wall_s": wall, "inner_s": inner,
                 "target": STARTUP_WARM_TARGET, "pass": wall < STARTUP_WARM_TARGET})
    if cold_repeats:
        wall, inner = startup_median("jitgrad", cold_repeats, cold=True)
        rows.append({"what": "jitgrad, cold cache", "wall_s": wall, "inner_s": inner,
                     "target": STARTUP_COLD_TARGET, "pass": wall < STARTUP_COLD_TARGET})
    wall, inner = startup_median("torch", repeats)
    rows.append({"what": "torch (reference)", "wall_s": wall, "inner_s": inner,
                 "target": None, "pass": None})
    for r in rows:
        progress(f"  start-up {r['what']}: {r['wall_s']:.3g} s")
    return rows


# ------------------------------------------------------------------- report

def _verdict(row):
    return "-" if row["pass"] is None else ("PASS" if row["pass"] else "FAIL")


def print_report(results):
    print()
    print(f"{'workload':<15} {'phase':<17} {'vs':<13} {'jitgrad':>11} {'vs':>11} "
          f"{'ratio':>8} {'target':>9}  result")
    print("-" * 96)
    for r in results["timings"]:
        target = "-" if r["target"] is None else f"<= {r['target']:g}"
        head = f"{r['workload']:<15} {r['phase']:<17} {r['vs']:<13}"
        if r.get("skipped"):
            print(f"{head} {r['skipped']:>41} {target:>9}  -")
            continue
        print(f"{head} {r['jitgrad_s'] * 1e3:>9.3f}ms {r['ref_s'] * 1e3:>9.3f}ms {r['ratio']:>8.3f} "
              f"{target:>9}  {_verdict(r)}")
        if r.get("note"):
            print(f"{'':<15} note: {r['note']}")
    for r in results["memory"]:
        print(f"{r['workload']:<15} {'peak mem fwd+bwd':<17} {'torch':<13} "
              f"{r['jitgrad_bytes'] / 2**20:>8.1f}MiB {r['torch_bytes'] / 2**20:>8.1f}MiB "
              f"{r['ratio']:>8.3f} {'<= ' + format(r['target'], 'g'):>9}  {_verdict(r)}")
    if results["startup"]:
        print()
        print(f"{'start-up (import + first backward)':<36} {'wall':>9} {'in-process':>11} "
              f"{'target':>9}  result")
        print("-" * 96)
    for r in results["startup"]:
        target = "-" if r["target"] is None else f"< {r['target']:g} s"
        print(f"{r['what']:<36} {r['wall_s']:>8.3f}s {r['inner_s']:>10.3f}s "
              f"{target:>9}  {_verdict(r)}")
    if results["agreement_problems"]:
        print("\nWARNING: results disagree:")
        for p in results["agreement_problems"]:
            print("  " + p)
    checked = [r["pass"] for k in ("timings", "memory", "startup")
               for r in results[k] if r["pass"] is not None]
    print(f"\n{sum(checked)}/{len(checked)} targets met")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="fewer repeats, no cold start (< 1 minute)")
    parser.add_argument("--json", metavar="PATH", help="also dump the results as JSON")
    parser.add_argument("--only", metavar="NAME", action="append",
                        help="time only workloads whose 'workload phase vs' contains NAME "
                             "(case-insensitive, repeatable; e.g. --only digits --only adam "
                             "--only cnn --only compiled --only jax); skips the memory and "
                             "start-up sections")
    parser.add_argument("--torch-compile", action="store_true",
                        help="time torch.compile of the small MLP step in --quick runs too "
                             "(its first call compiles for ~10 s; full runs always do)")
    parser.add_argument("--mem-child", nargs=2, metavar=("LIB", "WORKLOAD"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.mem_child:
        print(json.dumps({"peak_bytes": memory_child(*args.mem_child)}))
        return 0

    if args.quick:
        # the agreement check has already run every workload once (kernels
        # compiled), so quick mode does without separate warm-up runs
        warmup, repeats, min_time, max_wall = 0, 3, 0.05, 2.0
        startup_repeats, cold_repeats = 3, 0
    else:
        warmup, repeats, min_time, max_wall = 2, 7, 0.5, 20.0
        startup_repeats, cold_repeats = 5, 2

    libs = {name: load(name) for name in LIBS}
    jax = load_jax()
    progress("checking that jitgrad and torch agree, and jitgrad.compile's replay and eager ...")
    problems = check_agreement(libs) + check_compiled(libs["jitgrad"], libs["torch"], jax)
    real = []
    real_keys = real_selected(args.only)
    if real_keys:
        progress("checking the real programs' losses (torchdiffeq's ode_demo, small GPT) ...")
        programs = real_programs.Programs(libs["jitgrad"], libs["torch"])
        real_problems, disagree = check_real(programs, real_keys)
        problems += real_problems
        real = real_comparisons(programs, real_keys, REAL_STEPS_QUICK if args.quick else REAL_STEPS, disagree)
    no_gpu = cuda_workloads.not_on_gpu(libs["jitgrad"], libs["torch"])
    if no_gpu is None and any(selected(k, "torch cuda", args.only) for k in cuda_workloads.TARGETS):
        progress("checking the CUDA workloads against PyTorch CUDA (compiles jitgrad's kernels) ...")
        problems += cuda_workloads.check(libs["jitgrad"], libs["torch"])
    else:
        progress(f"CUDA rows: {no_gpu or 'not selected'}")
    progress("timing ...")
    results = {
        "meta": {
            "quick": args.quick, "warmup": warmup, "repeats": repeats,
            "min_time": min_time, "max_wall": max_wall,
            "python": platform.python_version(), "machine": platform.machine(),
            "processor": platform.processor(), "cpu_count": os.cpu_count(),
            "versions": {name: getattr(T, "__version__", "?")
                         for name, T in {**libs, "jax": jax}.items() if T is not None},
            "numpy": np.__version__,
        },
        "agreement_problems": problems,
        "timings": run_timings(libs, warmup, repeats, min_time, max_wall, args.only, jax,
                               with_torch_compile=args.torch_compile or not args.quick, real=real),
    }
    results["timings"] += run_default_threads(repeats, args.only)
    if args.only:
        results["memory"], results["startup"] = [], []
    else:
        progress("memory ...")
        results["memory"] = run_memory()
        progress("start-up ...")
        results["startup"] = run_startup(startup_repeats, cold_repeats)

    print_report(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
