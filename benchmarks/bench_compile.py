"""asv benchmarks for jitgrad.compile (issue 11), with ``T = jitgrad``; the workloads are
side_by_side.py's (defined there once, against a module parameter ``T``):

* CompiledStep: a training step (forward, loss.backward(), SGD step, zero_grad) of the
  small MLP (16 x 32-32-32-1, float64, MSE) and of the MNIST-size one (64 x
  784-512-512-10, float32, cross-entropy), replayed by ``jitgrad.compile``; the same step
  eagerly beside it.
* CompiledChain / CompiledWideTree: the 1e5-node scalar chain and the 2e4-leaf wide tree,
  forward and backward as one compiled step of the leaves they close over.
* CompiledDigitsEpoch: an epoch of the digits example with its step compiled (needs
  scikit-learn).
* FirstCall: the first call of a compiled step (recording + plan building), and one
  eager step for scale: the small MLP's, and a 1e4-node chain's.
* EagerForward: the small MLP's forward alone, eagerly (issue 11's eager target).

Each ``track_graph_breaks`` counts the graph breaks the compiled step met: while it is
not 0, the step runs eagerly and its ``time_*`` is eager jitgrad's.

A compiled step is recorded once per process (the first setup; warm-up calls included)
and then replayed by every timed call, its parameters training on.
"""
import jitgrad

from .side_by_side import (
    CHAIN_N,
    SGD_MLPS,
    chain_run,
    digits_data,
    digits_run,
    graph_breaks,
    mlp_forward_run,
    sgd_run,
    warm,
    wide_run,
)

_steps = {}


def _steady(key, build):
    """The warmed Step build() makes, once per process; its leaves' .grad reset."""
    if key not in _steps:
        _steps[key] = warm(build())
    step = _steps[key]
    for t in step.leaves:
        t.grad = None
    return step


class CompiledStep:
    """A training step with SGD, compiled (replayed) and eager."""
    params = [list(SGD_MLPS)]
    param_names = ["model"]
    number = 1
    repeat = (5, 20, 20.0)
    timeout = 300

    def setup(self, model):
        self.compiled = _steady(("compiled", model), lambda: sgd_run(jitgrad, model, jitgrad.compile))
        self.eager = _steady(("eager", model), lambda: sgd_run(jitgrad, model))

    def time_compiled(self, model):
        self.compiled.call()

    def time_eager(self, model):
        self.eager.call()

    def track_graph_breaks(self, model):
        return len(graph_breaks(self.compiled.compiled))


class CompiledChain:
    """1e5 scalar ops and their backward, replayed."""
    number = 1
    repeat = (3, 10, 30.0)
    timeout = 600

    def setup(self):
        self.step = _steady("chain", lambda: chain_run(jitgrad, jitgrad.compile))

    def time_forward_backward(self):
        self.step.call()

    def track_graph_breaks(self):
        return len(graph_breaks(self.step.compiled))


class CompiledWideTree:
    """2e4 leaves -> 3 scalar ops each -> stack -> sum, and its backward, replayed."""
    number = 1
    repeat = (3, 10, 30.0)
    timeout = 600

    def setup(self):
        self.step = _steady("wide", lambda: wide_run(jitgrad, jitgrad.compile))

    def time_forward_backward(self):
        self.step.call()

    def track_graph_breaks(self):
        return len(graph_breaks(self.step.compiled))


class CompiledDigitsEpoch:
    """One epoch (45 Adam steps, batch 32) of the digits MLP example, its step compiled."""
    number = 1
    repeat = (3, 10, 30.0)
    timeout = 300

    def setup(self):
        try:
            import sklearn.datasets  # noqa: F401
        except ImportError:
            raise NotImplementedError("scikit-learn is not installed (digits data)") from None
        digits_data()
        self.step = _steady("digits", lambda: digits_run(jitgrad, jitgrad.compile))

    def time_epoch(self):
        self.step.call()

    def track_graph_breaks(self):
        return len(graph_breaks(self.step.compiled))


class FirstCall:
    """The first call of a freshly compiled step (recording + plan building), beside one
    eager step of the same function."""
    params = [["small MLP SGD", "chain 1e4"]]
    param_names = ["step"]
    number = 1
    repeat = (3, 10, 30.0)
    timeout = 600

    def _build(self, which, wrap):
        if which == "chain 1e4":
            return chain_run(jitgrad, wrap, CHAIN_N // 10)
        return sgd_run(jitgrad, which, wrap)

    def setup(self, which):
        _steady(("first", which), lambda: self._build(which, jitgrad.compile))  # kernels compiled, once
        self.compiled = self._build(which, jitgrad.compile)
        self.eager = self._build(which, None)

    def time_first_call(self, which):
        self.compiled.call()

    def time_eager_step(self, which):
        self.eager.call()


class EagerForward:
    """The small MLP's forward, eagerly (parameters that require grad)."""
    number = 1
    repeat = (5, 20, 20.0)

    def setup(self):
        self.step = _steady("forward", lambda: mlp_forward_run(jitgrad))

    def time_small_mlp_forward(self):
        self.step.call()
