"""func.stack_module_state against torch.func.stack_module_state: the stacked parameters and
buffers (values, names, order, requires_grad, new leaves unrelated to the models'), vmap of
functional_call over them equal to running each model, gradients reaching the stacked
leaves only, and torch's errors."""
import copy
import importlib

import numpy as np
import pytest
import torch
from conftest import assert_close, err_of, make_mlp, mlp_arrays, same

import jitgrad


def fn_(T):
    return importlib.import_module(T.__name__ + ".func")


def both(run):
    j, t = run(jitgrad), run(torch)
    same(j, t, "jitgrad vs torch")
    return j


def bn_net(T, seed):
    """Linear + BatchNorm1d (buffers: running_mean, running_var, num_batches_tracked), set from seed."""
    r = np.random.default_rng(seed)
    m = T.nn.Sequential(T.nn.Linear(3, 4), T.nn.BatchNorm1d(4)).double()
    with T.no_grad():
        for name, t in list(m.named_parameters()) + list(m.named_buffers()):
            if t.is_floating_point():
                t.copy_(T.tensor(r.uniform(0.5, 1.5, tuple(t.shape))))
    return m


def test_stacks_parameters_and_buffers():
    def run(T):
        models = [bn_net(T, s) for s in range(3)]
        params, buffers = fn_(T).stack_module_state(models)
        return (list(params), list(buffers), params, buffers,
                [(p.requires_grad, p.is_leaf, p.grad_fn is None) for p in params.values()],
                [(b.requires_grad, str(b.dtype).split(".")[-1]) for b in buffers.values()])
    both(run)


def test_stacked_leaves_are_new_and_take_the_gradient():
    def run(T):
        models = [make_mlp(T, mlp_arrays(s)) for s in range(4)]
        params, buffers = fn_(T).stack_module_state(models)
        x = T.tensor(np.random.default_rng(9).standard_normal((4, 5, 4)))

        def f(p, b, xb):
            return fn_(T).functional_call(models[0], (p, b), (xb,))

        out = T.vmap(f)(params, buffers, x)
        loop = T.stack([m(xi) for m, xi in zip(models, x)])
        out.pow(2).sum().backward()
        shared = [p.data_ptr() == q.data_ptr() for p, q in zip(params.values(), models[0].parameters())]
        return (out, loop, [p.grad for p in params.values()], [p.grad is None for p in models[0].parameters()],
                shared)
    j = both(run)
    assert not any(j[4])


def test_vmap_with_the_minibatch_shared():
    def run(T):
        models = [make_mlp(T, mlp_arrays(s)) for s in range(3)]
        params, buffers = fn_(T).stack_module_state(models)
        base = copy.deepcopy(models[0]).to("meta")
        x = T.tensor(np.random.default_rng(3).standard_normal((6, 4)))
        out = T.vmap(lambda p, b, xb: fn_(T).functional_call(base, (p, b), (xb,)), in_dims=(0, 0, None))(
            params, buffers, x)
        return out, T.stack([m(x) for m in models])
    j = both(run)
    assert_close(j[0], j[1])


def test_requires_grad_follows_the_models():
    def run(T):
        models = [make_mlp(T, mlp_arrays(s)) for s in range(2)]
        for m in models:
            m[0].weight.requires_grad_(False)
        params, _ = fn_(T).stack_module_state(models)
        return {k: (v.requires_grad, v.is_leaf) for k, v in params.items()}
    both(run)


def test_a_module_list_and_a_single_model():
    def run(T):
        ms = T.nn.ModuleList([make_mlp(T, mlp_arrays(s)) for s in range(2)])
        two = fn_(T).stack_module_state(ms)
        one = fn_(T).stack_module_state([make_mlp(T, mlp_arrays(5))])
        return two, one
    both(run)


@pytest.mark.parametrize("case", ["empty", "modes", "classes", "requires_grad"])
def test_errors(case):
    def run(T):
        models = [make_mlp(T, mlp_arrays(s)) for s in range(2)]
        if case == "empty":
            models = []
        elif case == "modes":
            models[1].eval()
        elif case == "classes":
            models[1] = T.nn.Sequential(T.nn.Linear(4, 8))
            models[1].__class__ = type("Other", (T.nn.Module,), {})
        else:
            models[1][2].bias.requires_grad_(False)
        return err_of(fn_(T).stack_module_state, models)
    j = both(run)
    assert j is not None and j[0] == "RuntimeError"
