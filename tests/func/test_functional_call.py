"""func.functional_call against torch.func.functional_call: the swapped tensors are used,
the module is restored afterwards (also when the call raises), tied weights, several
dicts, buffers, strict, and torch's errors."""
import importlib

import numpy as np
import pytest
import torch
from conftest import LIBS, err_of, make_mlp, mlp_arrays, same

import jitgrad


def fn_(T):
    return importlib.import_module(T.__name__ + ".func")


def new_params(T, seed=1):
    return {k: T.tensor(v, dtype=T.float64) for k, v in mlp_arrays(seed).items()}


def x_of(T):
    return T.tensor(np.random.default_rng(2).standard_normal((5, 4)), dtype=T.float64)


def both(run):
    j, t = run(jitgrad), run(torch)
    same(j, t, "jitgrad vs torch")
    return j


@LIBS
def test_uses_the_given_tensors_and_restores_the_module(T):
    m = make_mlp(T, mlp_arrays(0))
    before = {k: v for k, v in m.named_parameters()}
    p = new_params(T)
    out = fn_(T).functional_call(m, p, (x_of(T),))
    ref = make_mlp(T, {k: v.numpy() for k, v in p.items()})(x_of(T))
    np.testing.assert_allclose(out.detach().numpy(), ref.detach().numpy(), rtol=1e-12)
    assert {k: v for k, v in m.named_parameters()} == before
    assert all(type(v).__name__ == "Parameter" for v in m.parameters())


def test_values_and_gradients_match_torch():
    def run(T):
        m = make_mlp(T, mlp_arrays(0))
        p = {k: v.requires_grad_() for k, v in new_params(T).items()}
        out = fn_(T).functional_call(m, p, x_of(T))
        out.pow(2).sum().backward()
        return out.detach(), {k: v.grad for k, v in p.items()}, [q.grad for q in m.parameters()]
    both(run)


def test_partial_dict_and_several_dicts():
    def run(T):
        m = make_mlp(T, mlp_arrays(0))
        p = new_params(T)
        fc = fn_(T).functional_call
        return (fc(m, {"0.weight": p["0.weight"]}, (x_of(T),)),
                fc(m, ({"0.weight": p["0.weight"]}, {"2.bias": p["2.bias"]}), (x_of(T),)),
                fc(m, [dict(list(p.items())[:2]), dict(list(p.items())[2:])], x_of(T)))
    both(run)


def test_kwargs_and_buffers():
    def run(T):
        class Scaled(T.nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = T.nn.Linear(4, 2).double()
                self.register_buffer("scale", T.tensor([2.0, 3.0], dtype=T.float64))

            def forward(self, x, shift=0.0):
                return self.lin(x) * self.scale + shift

        m = Scaled()
        p = {"lin.weight": T.ones(2, 4, dtype=T.float64), "lin.bias": T.zeros(2, dtype=T.float64)}
        out = fn_(T).functional_call(m, (p, {"scale": T.tensor([-1.0, 0.5], dtype=T.float64)}), (x_of(T),),
                                     {"shift": 1.0})
        assert m.scale.tolist() == [2.0, 3.0]
        return out
    both(run)


@LIBS
def test_restored_when_the_call_raises(T):
    class Boom(T.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = T.nn.Linear(4, 2)

        def forward(self, x):
            self.lin(x)
            raise KeyError("boom")

    m = Boom()
    w = m.lin.weight
    with pytest.raises(KeyError):
        fn_(T).functional_call(m, {"lin.weight": T.zeros(2, 4)}, (T.ones(1, 4),))
    assert m.lin.weight is w


def test_tied_weights():
    def run(T):
        class Tied(T.nn.Module):
            def __init__(self):
                super().__init__()
                self.a = T.nn.Linear(3, 3, bias=False).double()
                self.b = T.nn.Linear(3, 3, bias=False).double()
                self.b.weight = self.a.weight
                with T.no_grad():
                    self.a.weight.copy_(T.tensor(np.eye(3) - 0.25, dtype=T.float64))

            def forward(self, x):
                return self.b(self.a(x))

        m = Tied()
        w = T.tensor(np.arange(9.0).reshape(3, 3) / 10, dtype=T.float64)
        x = T.ones(1, 3, dtype=T.float64)
        fc = fn_(T).functional_call
        return (fc(m, {"a.weight": w}, x), fc(m, {"a.weight": w}, x, tie_weights=False),
                fc(m, {"a.weight": w, "b.weight": w}, x),
                err_of(fc, m, {"a.weight": w, "b.weight": w * 2}, x))
    both(run)


def test_strict_and_errors():
    def run(T):
        m = make_mlp(T, mlp_arrays(0))
        p = new_params(T)
        fc = fn_(T).functional_call
        x = x_of(T)
        return [
            err_of(fc, m, {"0.weight": p["0.weight"]}, x, strict=True),
            err_of(fc, m, dict(p, extra=p["2.bias"]), x, strict=True),
            err_of(fc, m, {"0.weight": p["0.weight"], "nope": p["2.bias"]}, x, strict=True),
            err_of(fc, m, ({"0.weight": p["0.weight"]}, {"0.weight": p["0.weight"]}), x),
            err_of(fc, m, ({"0.weight": p["0.weight"]}, 3), x),
            err_of(fc, m, 3, x),
            err_of(fc, m, {"9.weight": p["0.weight"]}, x),
            err_of(fc, m, {"0.weight": 3}, x),
            fc(m, p, x, strict=True),
        ]
    both(run)


def test_with_grad_transform():
    """The per-sample recipe's inner part: grad of a loss over functional_call."""
    def run(T):
        m = make_mlp(T, mlp_arrays(0))
        p = new_params(T)
        fn = fn_(T)

        def loss(p, x):
            return fn.functional_call(m, p, (x,)).pow(2).sum()
        return fn.grad(loss)(p, x_of(T))
    both(run)
