"""Optimizers inside a compiled step: the update replays to eager's, option by option.

A training step (forward, loss.backward(), opt.step(), opt.zero_grad()) is compiled on
one of two identical models and run eagerly on the other; after each of several calls
the loss, the parameters, their .grads and the optimizer's state must agree (rtol 1e-12
in float64, 1e-5 in float32). The model is elementwise (a plan is made on every branch);
an nn.Linear model checks eager's results whether or not its kernels exist.
"""
import copy

import numpy as np
import pytest
from compile_helpers import assert_plan, close, close_params
from conftest import gen_array

import jitgrad
import jitgrad.nn.functional as F
from jitgrad.optim import SGD, Adadelta, Adam, AdamW, RMSprop
from jitgrad.optim.lr_scheduler import CosineAnnealingLR, StepLR

SGD_OPTIONS = [
    {},
    {"momentum": 0.9},
    {"momentum": 0.9, "dampening": 0.5},
    {"momentum": 0.9, "nesterov": True},
    {"weight_decay": 0.1},
    {"maximize": True},
    {"momentum": 0.8, "nesterov": True, "weight_decay": 0.05, "maximize": True},
    {"momentum": 0.9, "dampening": 0.3, "weight_decay": 0.1, "maximize": True},
]
ADAM_OPTIONS = [
    {},
    {"amsgrad": True},
    {"weight_decay": 0.1},
    {"maximize": True},
    {"betas": (0.8, 0.95), "eps": 1e-6},
    {"amsgrad": True, "weight_decay": 0.05, "maximize": True},
]
CASES = ([(SGD, dict(lr=0.05, **o)) for o in SGD_OPTIONS]
         + [(Adam, dict(lr=0.01, **o)) for o in ADAM_OPTIONS]
         + [(AdamW, dict(lr=0.01, **o)) for o in ADAM_OPTIONS]
         + [(RMSprop, dict(lr=0.01, **o)) for o in ({}, {"centered": True, "momentum": 0.5, "weight_decay": 0.1})]
         + [(Adadelta, dict(lr=0.5, **o)) for o in ({}, {"rho": 0.8, "weight_decay": 0.1, "maximize": True})])
CASE_IDS = [f"{cls.__name__}-" + ("-".join(f"{k}={v}" for k, v in o.items() if k != "lr") or "plain")
            for cls, o in CASES]


def ten(a, dtype="float64", rg=False):
    return jitgrad.tensor(np.asarray(a), dtype=getattr(jitgrad, dtype), requires_grad=rg)


def params(dtype, seed=0):
    r = np.random.default_rng(seed)
    return [ten(r.normal(size=(3, 4)) * 0.5, dtype, True), ten(r.normal(size=(4,)) * 0.3, dtype, True)]


def loss_of(ps, x, y):
    w, b = ps
    h = (x * w + b).tanh()
    return ((h.sum(0) - y) ** 2).mean() + 0.01 * (w * w).sum()


def make_step(ps, opt, zero_first=False, set_to_none=True):
    def step(x, y):
        if zero_first:
            opt.zero_grad(set_to_none)
        loss = loss_of(ps, x, y)
        loss.backward()
        opt.step()
        if not zero_first:
            opt.zero_grad(set_to_none)
        return loss
    return step


def data(rng, n, dtype):
    return [(gen_array(rng, (3, 4)), gen_array(rng, (4,))) for _ in range(n)]


def state_close(got, want, dtype):
    """Two optimizers' state_dicts: per-parameter state and param groups."""
    gs, ws = got.state_dict(), want.state_dict()
    assert gs["param_groups"] == ws["param_groups"]
    assert set(gs["state"]) == set(ws["state"])
    for k in ws["state"]:
        assert set(gs["state"][k]) == set(ws["state"][k])
        for name, v in ws["state"][k].items():
            close(gs["state"][k][name], v, dtype, f"state {k} {name}")


def run(cls, opts, dtype, rng, n_calls=6, schedule=None, **step_kw):
    """The step on twin parameters, eager and compiled, n_calls calls; schedule((eager
    optimizer, compiled optimizer)) -> between(k), run after call k (schedulers, lr
    changes). Returns the compiled function."""
    (pe, oe), (pc, oc) = [(ps, cls(ps, **opts)) for ps in (params(dtype), params(dtype))]
    between = None if schedule is None else schedule((oe, oc))
    eager, c = make_step(pe, oe, **step_kw), jitgrad.compile(make_step(pc, oc, **step_kw))
    for k, (x, y) in enumerate(data(rng, n_calls, dtype)):
        close(c(ten(x, dtype), ten(y, dtype)), eager(ten(x, dtype), ten(y, dtype)), dtype, f"call {k}: loss")
        close_params(pc, pe, dtype, f"call {k}: parameter")
        state_close(oc, oe, dtype)
        if between is not None:
            between(k)
    return c


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("cls,opts", CASES, ids=CASE_IDS)
def test_optimizer_options_replay_like_eager(cls, opts, dtype, rng):
    assert_plan(run(cls, opts, dtype, rng))


@pytest.mark.parametrize("cls,opts", [(SGD, {"lr": 0.1, "momentum": 0.9}), (Adam, {"lr": 0.05, "amsgrad": True}),
                                      (AdamW, {"lr": 0.05})], ids=["SGD", "Adam", "AdamW"])
@pytest.mark.parametrize("sched", ["step", "cosine", "manual"])
def test_the_learning_rate_changed_between_replays(cls, opts, sched, rng):
    def schedule(pair):
        if sched == "step":
            made = [StepLR(o, step_size=2, gamma=0.5) for o in pair]
        elif sched == "cosine":
            made = [CosineAnnealingLR(o, T_max=4, eta_min=0.001) for o in pair]

        def between(k):
            if sched == "manual":
                for o in pair:
                    o.param_groups[0]["lr"] = 0.1 / (k + 2)
            else:
                for s in made:
                    s.step()
            lrs = [o.param_groups[0]["lr"] for o in pair]
            assert lrs[0] == lrs[1]
            seen.add(lrs[0])
        return between

    seen = set()
    assert_plan(run(cls, opts, "float64", rng, n_calls=7, schedule=schedule))
    assert len(seen) >= 3


@pytest.mark.parametrize("zero_first,set_to_none", [(True, True), (True, False), (False, False)],
                         ids=["zero_first", "zero_first_keep", "zero_last_keep"])
def test_where_and_how_grads_are_zeroed(zero_first, set_to_none, rng):
    assert_plan(run(SGD, {"lr": 0.05, "momentum": 0.9}, "float64", rng, zero_first=zero_first,
                    set_to_none=set_to_none))


def test_grads_accumulated_across_calls_and_zeroed_outside(rng):
    """No zero_grad in the step: every replay adds into .grad; the user zeroes it every
    other call, outside."""
    pe, pc = params("float64"), params("float64")
    oe, oc = SGD(pe, lr=0.05), SGD(pc, lr=0.05)

    def make(ps, opt):
        def step(x, y):
            loss = loss_of(ps, x, y)
            loss.backward()
            opt.step()
            return loss
        return step

    eager, c = make(pe, oe), jitgrad.compile(make(pc, oc))
    for k, (x, y) in enumerate(data(rng, 6, "float64")):
        close(c(ten(x), ten(y)), eager(ten(x), ten(y)), msg=f"call {k}")
        close_params(pc, pe, msg=f"call {k}")
        if k % 2:
            oe.zero_grad()
            oc.zero_grad()
    assert_plan(c)


def test_parameter_groups_with_their_own_options(rng):
    def make(ps):
        return Adam([{"params": [ps[0]], "lr": 0.02, "amsgrad": True}, {"params": [ps[1]], "weight_decay": 0.1}],
                    lr=0.01)

    pe, pc = params("float64"), params("float64")
    oe, oc = make(pe), make(pc)
    eager, c = make_step(pe, oe), jitgrad.compile(make_step(pc, oc))
    for k, (x, y) in enumerate(data(rng, 5, "float64")):
        close(c(ten(x), ten(y)), eager(ten(x), ten(y)), msg=f"call {k}")
        close_params(pc, pe, msg=f"call {k}")
        state_close(oc, oe, "float64")
    assert_plan(c)


def test_module_zero_grad_and_an_optimizer_over_a_module(rng):
    class Model(jitgrad.nn.Module):
        def __init__(self):
            super().__init__()
            self.w, self.b = (jitgrad.nn.Parameter(p.detach()) for p in params("float64"))

        def forward(self, x):
            return (x * self.w + self.b).tanh().sum(0)

    def make():
        m = Model()
        opt = AdamW(m.parameters(), lr=0.02, amsgrad=True)

        def step(x, y):
            m.zero_grad()
            loss = ((m(x) - y) ** 2).mean()
            loss.backward()
            opt.step()
            return loss
        return m, opt, step

    (me, oe, eager), (mc, oc, step) = make(), make()
    c = jitgrad.compile(step)
    for k, (x, y) in enumerate(data(rng, 5, "float64")):
        close(c(ten(x), ten(y)), eager(ten(x), ten(y)), msg=f"call {k}")
        close_params(list(mc.parameters()), list(me.parameters()), msg=f"call {k}")
        state_close(oc, oe, "float64")
    assert_plan(c)


@pytest.mark.parametrize("cls,opts", [(SGD, {"lr": 0.05, "momentum": 0.9, "nesterov": True}),
                                      (Adam, {"lr": 0.01, "amsgrad": True}), (AdamW, {"lr": 0.01})],
                         ids=["SGD", "Adam", "AdamW"])
def test_an_nn_training_step_equals_eager(cls, opts, rng):
    """nn.Linear, ReLU and cross_entropy in float32: a plan, with eager's results."""
    def make():
        jitgrad.manual_seed(0)
        model = jitgrad.nn.Sequential(jitgrad.nn.Linear(6, 16), jitgrad.nn.ReLU(), jitgrad.nn.Linear(16, 3))
        opt = cls(model.parameters(), **opts)

        def step(x, y):
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss
        return model, opt, step

    (me, oe, eager), (mc, oc, step) = make(), make()
    c = jitgrad.compile(step)
    for k in range(5):
        x = gen_array(rng, (8, 6)).astype(np.float32)
        y = rng.integers(0, 3, size=8)
        close(c(jitgrad.tensor(x), jitgrad.tensor(y)), eager(jitgrad.tensor(x), jitgrad.tensor(y)), "float32",
              f"call {k}: loss")
        close_params(list(mc.parameters()), list(me.parameters()), "float32", f"call {k}")
        state_close(oc, oe, "float32")
    assert_plan(c)


def _set(key, value):
    def change(pair, params):
        for o in pair:
            o.param_groups[0][key] = value
    return change


def _load_state_dict(pair, params):
    for o in pair:
        o.load_state_dict(copy.deepcopy(o.state_dict()))
        o.param_groups[0]["lr"] *= 0.5


def _clear_state(pair, params):
    for o in pair:
        o.state.clear()


def _scale_state(pair, params):
    for o, ps in zip(pair, params):
        for p in ps:
            st = o.state[p]
            for k in [k for k in st if k != "step"]:
                st[k] = st[k] * 0.5


def _replace_groups(pair, params):
    for o in pair:
        o.param_groups = [dict(g, lr=g["lr"] * 3) for g in o.param_groups]


def _params_in_place(pair, params):
    for ps in params:
        with jitgrad.no_grad():
            ps[0].mul_(0.5)


CHANGES = [
    (SGD, {"lr": 0.05, "momentum": 0.9}, "momentum", _set("momentum", 0.5)),
    (SGD, {"lr": 0.05, "momentum": 0.9}, "nesterov", _set("nesterov", True)),
    (SGD, {"lr": 0.05, "momentum": 0.9}, "dampening", _set("dampening", 0.5)),
    (SGD, {"lr": 0.05, "momentum": 0.9}, "weight_decay", _set("weight_decay", 0.1)),
    (SGD, {"lr": 0.05, "momentum": 0.9}, "maximize", _set("maximize", True)),
    (SGD, {"lr": 0.05}, "momentum_from_zero", _set("momentum", 0.9)),
    (Adam, {"lr": 0.01}, "betas", _set("betas", (0.5, 0.9))),
    (Adam, {"lr": 0.01}, "eps", _set("eps", 0.1)),
    (Adam, {"lr": 0.01}, "amsgrad", _set("amsgrad", True)),
    (Adam, {"lr": 0.01}, "maximize", _set("maximize", True)),
    (AdamW, {"lr": 0.01}, "weight_decay", _set("weight_decay", 0.5)),
    (Adam, {"lr": 0.01, "amsgrad": True}, "load_state_dict", _load_state_dict),
    (SGD, {"lr": 0.05, "momentum": 0.9}, "load_state_dict", _load_state_dict),
    (Adam, {"lr": 0.01}, "state_cleared", _clear_state),
    (SGD, {"lr": 0.05, "momentum": 0.9}, "state_cleared", _clear_state),
    (Adam, {"lr": 0.01, "amsgrad": True}, "state_replaced", _scale_state),
    (SGD, {"lr": 0.05, "momentum": 0.9}, "state_replaced", _scale_state),
    (SGD, {"lr": 0.05, "momentum": 0.9}, "param_groups_replaced", _replace_groups),
    (Adam, {"lr": 0.01}, "param_groups_replaced", _replace_groups),
    (Adam, {"lr": 0.01}, "parameters_changed_in_place", _params_in_place),
]


@pytest.mark.parametrize("cls,opts,what,change", CHANGES, ids=[f"{c[0].__name__}-{c[2]}" for c in CHANGES])
def test_the_optimizer_changed_between_replays(cls, opts, what, change, rng):
    """What the user changes in the optimizer (options, state, groups) or the parameters
    between calls: the next replays update as eager's step() does."""
    (pe, oe), (pc, oc) = [(ps, cls(ps, **opts)) for ps in (params("float64"), params("float64"))]
    eager, c = make_step(pe, oe), jitgrad.compile(make_step(pc, oc))
    for k, (x, y) in enumerate(data(rng, 7, "float64")):
        if k == 3:
            change((oe, oc), (pe, pc))
        close(c(ten(x), ten(y)), eager(ten(x), ten(y)), msg=f"call {k}: loss")
        close_params(pc, pe, msg=f"call {k}: parameter")
        state_close(oc, oe, "float64")
    assert_plan(c)
