"""asv benchmarks for the functional API (issue 10), with ``T = jitgrad``; the
workloads are side_by_side.py's (defined there once, against a module parameter ``T``):

* Jacobian64: autograd.functional.jacobian(vectorize=True) of a 64 -> 64 function
  (tanh(W x) * x + sin(x), float64), reverse-mode and forward-mode strategies.
* PerSampleGrads: each of 64 samples' gradient of the digits MLP's loss, with
  vmap(grad(loss)) over func.functional_call, and with a loop of grad(loss) per sample.
* JvpChain: one forward-mode pass (make_dual, 1e5 scalar ops, unpack_dual).

A benchmark is skipped (NotImplementedError in setup) while jitgrad lacks its API.
"""
import jitgrad

from .side_by_side import REQUIRES, has_attr_path, jac_run, jac_setup, jvp_chain, psg_loop, psg_setup, psg_vmap


def _require(key):
    path, reason = REQUIRES[key]
    if not has_attr_path(jitgrad, path):
        raise NotImplementedError(reason)


class Jacobian64:
    params = ["reverse-mode", "forward-mode"]
    param_names = ["strategy"]

    def setup(self, strategy):
        _require(("jacobian 64", strategy.split("-")[0]))
        self.f, self.x = jac_setup(jitgrad)
        jac_run(jitgrad, self.f, self.x, strategy)  # warm: first calls compile

    def time_jacobian(self, strategy):
        jac_run(jitgrad, self.f, self.x, strategy)


class PerSampleGrads:
    params = ["vmap(grad)", "loop"]
    param_names = ["how"]

    def setup(self, how):
        _require(("per-sample grads", how))
        try:
            import sklearn.datasets  # noqa: F401
        except ImportError:
            raise NotImplementedError("scikit-learn is not installed (digits data)") from None
        self.state = psg_setup(jitgrad)
        self.run = psg_vmap if how == "vmap(grad)" else psg_loop
        self.run(jitgrad, *self.state)

    def time_per_sample_grads(self, how):
        self.run(jitgrad, *self.state)


class JvpChain:
    timeout = 300

    def setup(self):
        _require(("jvp chain 1e5", "forward"))
        jvp_chain(jitgrad, 100)

    def time_jvp_chain(self):
        jvp_chain(jitgrad)
