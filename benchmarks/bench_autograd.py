"""asv benchmarks for jitgrad's autograd engine.

Workloads (the same ones as ``side_by_side.py``, written directly against
jitgrad here):

* ScalarChain*: a chain of 1e5 nodes on a 0-d float64 tensor
  (N//2 multiplications and N//2 additions).
* WideTree*: 2e4 0-d float64 leaves, each through 3 scalar ops, stacked and
  summed into a loss.
* MLPStep: one training step (grads reset, forward, backward) of three MLPs:
  small (16 x 32-32-32-1, float64, MSE), mnist (64 x 784-512-512-10, float32,
  NLL of log_softmax) and large (256 x 2048-2048-2048-10, float32, same loss).

The asv_runner in use re-runs ``setup`` before every timed call, and
``number = 1`` keeps it that way, so a backward benchmark always sees a
freshly built graph.
"""
import functools

import numpy as np

import jitgrad

CHAIN_N = 100_000
WIDE_N = 20_000

# name: (batch, layer sizes, dtype name, loss)
MLP_CONFIGS = {
    "small": (16, (32, 32, 32, 1), "float64", "mse"),
    "mnist": (64, (784, 512, 512, 10), "float32", "nll"),
    "large": (256, (2048, 2048, 2048, 10), "float32", "nll"),
}

_warmed = False


def _warmup():
    """Compile/load the numba kernels once per process, outside the timings."""
    global _warmed
    if _warmed:
        return
    x = jitgrad.tensor(1.0, dtype=jitgrad.float64, requires_grad=True)
    _chain(x, 10).backward()
    _wide_loss(_wide_leaves(10)).backward()
    for config in MLP_CONFIGS:
        batch, sizes, dtype, loss = MLP_CONFIGS[config]
        small = (4, (sizes[0], 8, 8, sizes[-1]), dtype, loss)
        _mlp_step(*_mlp_tensors(small))
    _warmed = True


# ---------------------------------------------------------------- workloads

def _chain(x, n):
    y = x
    for _ in range(n // 2):
        y = y * 1.0001
        y = y + 0.0001
    return y


def _wide_leaves(n):
    vals = np.random.default_rng(0).standard_normal(n)
    return [jitgrad.tensor(float(v), dtype=jitgrad.float64, requires_grad=True)
            for v in vals]


def _wide_loss(leaves):
    outs = [((x * 2.0).sin() + 1.0) for x in leaves]
    return jitgrad.stack(outs).sum()


@functools.lru_cache(maxsize=None)
def _mlp_arrays(batch, sizes, dtype, loss):
    """numpy inputs for an MLP, generated once per process."""
    rng = np.random.default_rng(0)
    params = []
    for n_in, n_out in zip(sizes[:-1], sizes[1:]):
        w = (rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(dtype)
        b = np.zeros(n_out, dtype=dtype)
        params.append((w, b))
    x = rng.standard_normal((batch, sizes[0])).astype(dtype)
    if loss == "mse":
        target = rng.standard_normal((batch, sizes[-1])).astype(dtype)
    else:
        target = rng.integers(0, sizes[-1], size=batch).astype(np.int64)
    return params, x, target


def _mlp_tensors(config):
    batch, sizes, dtype, loss = config
    params_np, x_np, target_np = _mlp_arrays(batch, sizes, dtype, loss)
    dt = getattr(jitgrad, dtype)
    params = [(jitgrad.tensor(w, dtype=dt, requires_grad=True),
               jitgrad.tensor(b, dtype=dt, requires_grad=True))
              for w, b in params_np]
    x = jitgrad.tensor(x_np, dtype=dt)
    if loss == "mse":
        target = jitgrad.tensor(target_np, dtype=dt)
    else:
        target = jitgrad.tensor(target_np)
    return params, x, target, loss


def _mlp_step(params, x, target, loss):
    for w, b in params:
        w.grad = None
        b.grad = None
    h = x
    for w, b in params[:-1]:
        h = jitgrad.relu(h @ w + b)
    w, b = params[-1]
    out = h @ w + b
    if loss == "mse":
        value = ((out - target) ** 2).mean()
    else:
        logp = jitgrad.log_softmax(out, dim=1)
        value = -logp[jitgrad.arange(out.shape[0]), target].mean()
    value.backward()
    return value


# --------------------------------------------------------------- benchmarks

class ScalarChainForward:
    """Build a 1e5-node scalar chain (forward only)."""
    number = 1
    repeat = (3, 10, 30.0)
    timeout = 300

    def setup(self):
        _warmup()
        self.x = jitgrad.tensor(1.0, dtype=jitgrad.float64, requires_grad=True)

    def time_forward(self):
        _chain(self.x, CHAIN_N)

    def peakmem_forward_backward(self):
        _chain(self.x, CHAIN_N).backward()


class ScalarChainBackward:
    """Backward through a prebuilt 1e5-node scalar chain."""
    number = 1
    repeat = (3, 10, 30.0)
    timeout = 300

    def setup(self):
        _warmup()
        self.x = jitgrad.tensor(1.0, dtype=jitgrad.float64, requires_grad=True)
        self.y = _chain(self.x, CHAIN_N)

    def time_backward(self):
        self.y.backward()


class WideTreeForward:
    """2e4 leaves -> 3 scalar ops each -> stack -> sum (forward only)."""
    number = 1
    repeat = (3, 10, 30.0)
    timeout = 300

    def setup(self):
        _warmup()
        self.leaves = _wide_leaves(WIDE_N)

    def time_forward(self):
        _wide_loss(self.leaves)

    def peakmem_forward_backward(self):
        _wide_loss(self.leaves).backward()


class WideTreeBackward:
    """Backward through a prebuilt wide tree."""
    number = 1
    repeat = (3, 10, 30.0)
    timeout = 300

    def setup(self):
        _warmup()
        self.leaves = _wide_leaves(WIDE_N)
        self.loss = _wide_loss(self.leaves)

    def time_backward(self):
        self.loss.backward()


class MLPStep:
    """One training step: reset grads, forward, backward."""
    params = [list(MLP_CONFIGS)]
    param_names = ["config"]
    number = 1
    repeat = (3, 10, 30.0)
    timeout = 600

    def setup(self, config):
        _warmup()
        self.inputs = _mlp_tensors(MLP_CONFIGS[config])

    def time_step(self, config):
        _mlp_step(*self.inputs)

    def peakmem_step(self, config):
        _mlp_step(*self.inputs)
