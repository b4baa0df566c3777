"""Issue 8, class 3 (and the optimizer part of class 12): every array the compiled optimizer
step reads or writes has the parameter's shape and dtype, checked where the addresses are
cached, and the cache notices when any of those arrays is replaced. Against torch 2.13:
load_state_dict from another model or another dtype, p.data replaced after the state
exists, gradients assigned through .data, and optimizer-in-backward (step and zero_grad
from post-accumulate-grad hooks)."""
import numpy as np
import pytest
from conftest import both

torch = pytest.importorskip("torch")

OPTS = [("SGD", {"lr": 0.1, "momentum": 0.9}), ("Adam", {"lr": 0.05}),
        ("AdamW", {"lr": 0.05, "weight_decay": 0.1, "amsgrad": True})]
IDS = [n for n, _ in OPTS]


def _err(e):
    """(type name, message) of a raised exception, or None."""
    return None if e is None else (type(e).__name__, str(e))


# -- optimizer-in-backward (class 12) -------------------------------------------------------

@pytest.mark.parametrize("name,kw", OPTS[:2], ids=IDS[:2])
def test_step_and_zero_grad_from_post_accumulate_grad_hooks(name, kw):
    """torch's optimizer-in-backward pattern, one optimizer per parameter, over a small MLP.
    A leaf's hook runs while the sweep is still going: the rows next to it (W.t(), the
    matmul) are not leaves and must not be taken for ones."""
    r = np.random.default_rng(8)
    w1, b1, w2, x = r.normal(size=(4, 3)), r.normal(size=4), r.normal(size=(2, 4)), r.normal(size=(5, 3))

    def run(T):
        ps = [T.tensor(a, requires_grad=True) for a in (w1, b1, w2)]
        opts = {p: getattr(T.optim, name)([p], **kw) for p in ps}

        def hook(p):
            opts[p].step()
            opts[p].zero_grad()

        for p in ps:
            p.register_post_accumulate_grad_hook(hook)
        out = []
        for _ in range(3):
            loss = (T.tanh(T.tensor(x) @ ps[0].t() + ps[1]) @ ps[2].t()).pow(2).sum()
            loss.backward()
            out.append([p.detach().clone() for p in ps] + [[p.grad for p in ps]])
        return out

    both(run)
