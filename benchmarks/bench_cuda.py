"""asv benchmarks for the CUDA target (issue 12), with ``T = jitgrad`` on ``device="cuda"``.

The workloads are cuda_workloads.py's (float32, each timed call synchronized):

* ChainBackward: backward of a 1e4-node scalar chain.
* WideTreeBackward: backward of a 2e4-leaf wide tree.
* MLPStep: zero grads, forward, cross-entropy, backward: batch 64 of 784-512-512-10
  ("MNIST MLP") and batch 256 of 2048-2048-2048-10 ("large MLP").
* DigitsCNNStep: a training step (Adam) of the digits example's CNN, batch 256 (needs
  scikit-learn).

Every benchmark skips itself (NotImplementedError in ``setup``) without a real GPU: no
device, or NUMBA_ENABLE_CUDASIM set (the simulator is no GPU to time). As in
``bench_autograd.py``, ``number = 1`` and asv re-runs ``setup`` before every timed call,
so each backward has a freshly recorded graph; a workload's kernels are compiled once
per process, outside the timings.
"""
import jitgrad

from .cuda_workloads import MLPS, no_gpu, run_once, workloads

_warmed = set()


def _state(key):
    """(timed, a fresh setup()) of the workload `key` on the GPU, its kernels compiled first."""
    reason = no_gpu(jitgrad)
    if reason is not None:
        raise NotImplementedError(reason)
    if key[0].startswith("digits"):
        try:
            import sklearn.datasets  # noqa: F401
        except ImportError:
            raise NotImplementedError("scikit-learn is not installed (digits data)") from None
    work = workloads(jitgrad)[key]
    if key not in _warmed:
        run_once(work)
        _warmed.add(key)
    return work[1], work[0]()


class ChainBackward:
    """Backward of the 1e4-node scalar chain on the GPU."""
    number = 1
    repeat = (5, 20, 20.0)
    timeout = 300

    def setup(self):
        self.timed, self.state = _state(("chain 1e4", "cuda backward"))

    def time_backward(self):
        self.timed(self.state)


class WideTreeBackward:
    """Backward of the 2e4-leaf wide tree on the GPU."""
    number = 1
    repeat = (5, 20, 60.0)
    timeout = 600

    def setup(self):
        self.timed, self.state = _state(("wide tree 2e4", "cuda backward"))

    def time_backward(self):
        self.timed(self.state)


class MLPStep:
    """Zero grads, forward, cross-entropy, backward of an MLP on the GPU."""
    params = [list(MLPS)]
    param_names = ["model"]
    number = 1
    repeat = (5, 20, 20.0)
    timeout = 300

    def setup(self, model):
        self.timed, self.state = _state((model, "cuda step"))

    def time_step(self, model):
        self.timed(self.state)


class DigitsCNNStep:
    """A training step of the digits CNN, batch 256, on the GPU."""
    number = 1
    repeat = (5, 20, 20.0)
    timeout = 300

    def setup(self):
        self.timed, self.state = _state(("digits CNN b256", "cuda step"))

    def time_step(self):
        self.timed(self.state)
