"""asv benchmarks for jitgrad's autograd engine.

The workloads are those of ``side_by_side.py`` (defined there once, against a module
parameter ``T``), run here with ``T = jitgrad``:

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

import jitgrad

from .side_by_side import (
    CHAIN_N,
    MLP_CONFIGS,
    WIDE_N,
    chain_forward,
    mlp_arrays,
    mlp_inputs,
    mlp_step,
    wide_forward,
    wide_leaves,
)

_warmed = False


def _warmup():
    """Compile/load the numba kernels once per process, outside the timings."""
    global _warmed
    if _warmed:
        return
    x = jitgrad.tensor(1.0, dtype=jitgrad.float64, requires_grad=True)
    _chain(x, 10).backward()
    _wide_loss(_wide_leaves(10)).backward()
    for batch, sizes, dtype, loss in MLP_CONFIGS.values():
        _mlp_step(*_mlp_tensors((4, (sizes[0], 8, 8, sizes[-1]), dtype, loss)))
    _warmed = True


def _chain(x, n):
    return chain_forward(jitgrad, x, n)


def _wide_leaves(n):
    return wide_leaves(jitgrad, n)


def _wide_loss(leaves):
    return wide_forward(jitgrad, leaves)


@functools.lru_cache(maxsize=None)
def _mlp_arrays(batch, sizes, dtype, loss):
    """numpy inputs for an MLP, generated once per process."""
    return mlp_arrays(batch, sizes, dtype, loss)


def _mlp_tensors(config):
    batch, sizes, dtype, loss = config
    return mlp_inputs(jitgrad, _mlp_arrays(batch, sizes, dtype, loss), dtype, loss)


def _mlp_step(params, x, target, loss):
    return mlp_step(jitgrad, params, x, target, loss)


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
