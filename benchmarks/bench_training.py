"""asv benchmarks for training with jitgrad: model + loss + optimizer.

The workloads are those of ``side_by_side.py`` (defined there once, against a module
parameter ``T``), run here with ``T = jitgrad``:

* DigitsEpoch: one epoch of ``jitgrad/examples/digits.py`` (MLP 64-128-128-10 on
  scikit-learn's 8x8 digits, 1437 training images, Adam lr 3e-3, batch 32: 45 steps).
  Needs scikit-learn; skipped without it.
* AdamStep: ``opt.step()`` alone, Adam over 4 float32 tensors of 250k elements
  (1e6 parameters) with grads set, state already allocated by one earlier step.
* CNNStep: one step (zero_grad, forward, cross-entropy, backward, Adam) of a CNN on a
  batch of 32 1x28x28 images: conv(1->8, 3x3) relu conv(8->16, 3x3) relu flatten
  linear(9216 -> 10). Skipped while ``jitgrad.nn.Conv2d`` does not exist.
* ODEDemoSteps: training steps of torchdiffeq's examples/ode_demo.py on jitgrad through
  the import shim (``benchmarks/real_programs.py``), dopri5 with ``odeint`` or
  ``odeint_adjoint``. Skipped without torchdiffeq.
* SmallGPTSteps: 50 training steps (AdamW, grad clipping) of the 2-layer nanoGPT of
  ``benchmarks/real_programs.py``.

A benchmark is skipped by raising NotImplementedError in ``setup``. As in
``bench_autograd.py``, ``number = 1`` and asv re-runs ``setup`` before every timed
call, so each epoch/step starts from a freshly built model and optimizer.
"""
import jitgrad

from . import real_programs
from .side_by_side import (
    REQUIRES,
    adam_setup,
    cnn_arrays,
    cnn_setup,
    cnn_step,
    digits_data,
    digits_epoch,
    digits_setup,
    has_attr_path,
)

_warmed = set()
_PROGRAMS = []


def _programs():
    """real_programs' setups for jitgrad alone (torchdiffeq imported once per process)."""
    if not _PROGRAMS:
        _PROGRAMS.append(real_programs.Programs(jitgrad))
    return _PROGRAMS[0]


def _require_sklearn():
    try:
        import sklearn.datasets  # noqa: F401
    except ImportError:
        raise NotImplementedError("scikit-learn is not installed (digits data)") from None


def _require(key):
    path, reason = REQUIRES[key]
    if not has_attr_path(jitgrad, path):
        raise NotImplementedError(reason)


def _warm(name, fn):
    """Compile/load the kernels a workload uses, once per process, outside the timings."""
    if name not in _warmed:
        fn()
        _warmed.add(name)


def _digits_warm():
    digits_epoch(jitgrad, *digits_setup(jitgrad))


def _adam_warm():
    adam_setup(jitgrad, sizes=(1000, 1000), warm_steps=2)


def _cnn_warm(batch):
    # same shapes as the timed step: a smaller batch leaves first-call costs in it
    state = cnn_setup(jitgrad, cnn_arrays(batch=batch))
    cnn_step(jitgrad, *state)
    cnn_step(jitgrad, *state)


# --------------------------------------------------------------- benchmarks

class DigitsEpoch:
    """One epoch (45 Adam steps, batch 32) of the digits MLP example."""
    number = 1
    repeat = (3, 10, 30.0)
    timeout = 300

    def setup(self):
        _require_sklearn()
        digits_data()                       # load the data set once per process
        _warm("digits", _digits_warm)
        self.state = digits_setup(jitgrad)

    def time_epoch(self):
        digits_epoch(jitgrad, *self.state)

    def peakmem_epoch(self):
        digits_epoch(jitgrad, *self.state)


class AdamStep:
    """Adam.step() over 4 x 250k float32 parameters (grads set, state allocated)."""
    params = [[4]]
    param_names = ["tensors_of_250k"]
    number = 1
    repeat = (5, 20, 20.0)
    timeout = 300

    def setup(self, n):
        _warm("adam", _adam_warm)
        self.opt, self.tensors = adam_setup(jitgrad, sizes=(250_000,) * n, warm_steps=1)

    def time_step(self, n):
        self.opt.step()


class CNNStep:
    """One CNN training step, batch 32 of 1x28x28, two conv layers."""
    params = [[32]]
    param_names = ["batch"]
    number = 1
    repeat = (3, 10, 30.0)
    timeout = 300

    def setup(self, batch):
        _require(("CNN", "step"))
        _warm(("cnn", batch), lambda: _cnn_warm(batch))
        self.state = cnn_setup(jitgrad, cnn_arrays(batch=batch))

    def time_step(self, batch):
        cnn_step(jitgrad, *self.state)

    def peakmem_step(self, batch):
        cnn_step(jitgrad, *self.state)


class ODEDemoSteps:
    """Training steps (batch 20 of 10 time points, dopri5, RMSprop) of torchdiffeq's ode_demo."""
    params = [["odeint", "odeint_adjoint"]]
    param_names = ["solver"]
    number = 1
    repeat = (3, 10, 60.0)
    timeout = 600
    steps = 3

    def setup(self, solver):
        key = ("ode_demo", "dopri5 step" if solver == "odeint" else "adjoint step")
        programs = _programs()
        if programs.skipped(key):
            raise NotImplementedError(programs.skipped(key))
        self.run = programs.timed(key)
        setup = programs.setup(key, "jitgrad", self.steps)
        _warm(key, lambda: self.run(setup()))
        self.state = setup()

    def time_steps(self, solver):
        self.run(self.state)


class SmallGPTSteps:
    """50 training steps of a 2-layer nanoGPT (n_embd 32, block 16, batch 8)."""
    number = 1
    repeat = (3, 10, 60.0)
    timeout = 600
    steps = 50

    def setup(self):
        key = ("small GPT", "step")
        programs = _programs()
        self.run = programs.timed(key)
        setup = programs.setup(key, "jitgrad", self.steps)
        _warm(key, lambda: self.run(setup()))
        self.state = setup()

    def time_steps(self):
        self.run(self.state)
