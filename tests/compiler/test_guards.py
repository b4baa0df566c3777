"""jitgrad.compile's guards: a call whose guard fails re-records, and gives eager's results.

Each test counts how often the step's Python body runs (a Python side effect runs only
while recording, or on an eager fallback): replays do not run it. The guards are the
call's signature (arguments' shapes, dtypes, requires_grad, Python-number values, grad
mode) and what the signature cannot see (a parameter's array and requires_grad, the
modules' train/eval mode). What the step reaches by name (globals, closures, modules,
optimizers, objects' attributes): test_guards_rebind.py.
"""
import warnings

import numpy as np
import pytest
from compile_helpers import assert_plan, close, entries
from conftest import gen_array

import jitgrad
from jitgrad.compiler import config


def ten(a, dtype="float64", rg=False):
    return jitgrad.tensor(np.asarray(a), dtype=getattr(jitgrad, dtype), requires_grad=rg)


class Counted:
    """A compiled step and its eager twin over parameters `w` (one per twin); `runs` counts
    the compiled one's Python executions."""

    def __init__(self, body, w0):
        self.we, self.wc = ten(w0, rg=True), ten(w0, rg=True)
        self.runs = 0
        self.body = body
        self.eager = lambda *a: body(self.we, *a)

        def step(*a):
            self.runs += 1
            return body(self.wc, *a)
        self.c = jitgrad.compile(step)

    def call(self, *args, dtype="float64"):
        """Call both on copies of args; compare results and the parameters' .grad."""
        ca, ea = _copies(args), _copies(args)
        got, want = self.c(*ca), self.eager(*ea)
        close(got, want, dtype)
        if self.we.grad is not None:
            close(self.wc.grad, self.we.grad, dtype, ".grad")
        for a, b in zip(ca, ea):
            if isinstance(b, jitgrad.Tensor) and b.grad is not None:
                close(a.grad, b.grad, dtype, "argument .grad")
        return got


def _copies(args):
    return [a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, jitgrad.Tensor) else a for a in args]


def loss_body(w, x, scale=1.0):
    loss = ((x * w).tanh() * scale).sum()
    if jitgrad.is_grad_enabled():
        loss.backward()
    return loss


def replays(cs, args, runs, **kw):
    """Two more calls with args: both replay (the body does not run again)."""
    for _ in range(2):
        cs.call(*args, **kw)
    assert cs.runs == runs, f"the body ran {cs.runs} times, expected {runs}"


def test_argument_shape(rng):
    cs = Counted(loss_body, [0.5, -1.0, 2.0])
    replays(cs, (ten(gen_array(rng, (2, 3))),), 1)
    replays(cs, (ten(gen_array(rng, (4, 3))),), 2)
    replays(cs, (ten(gen_array(rng, (3,))),), 3)
    replays(cs, (ten(gen_array(rng, (2, 3))),), 3)  # the first signature's plan is still there
    assert len(entries(cs.c)) == 3
    assert_plan(cs.c)


def test_argument_dtype(rng):
    cs = Counted(lambda w, x: (x * 2.0).tanh().sum(), [0.5])
    x = gen_array(rng, (2, 3))
    replays(cs, (ten(x),), 1)
    replays(cs, (ten(x, "float32"),), 2)
    assert len(entries(cs.c)) == 2


def test_argument_requires_grad(rng):
    cs = Counted(loss_body, [0.5, -1.0, 2.0])
    x = gen_array(rng, (2, 3))
    replays(cs, (ten(x),), 1)
    replays(cs, (ten(x, rg=True),), 2)  # the argument's .grad is compared too
    replays(cs, (ten(x),), 2)
    assert_plan(cs.c)


def test_python_number_argument_value(rng):
    cs = Counted(loss_body, [0.5, -1.0, 2.0])
    x = ten(gen_array(rng, (2, 3)))
    replays(cs, (x, 2.0), 1)
    replays(cs, (x, 3.0), 2)
    replays(cs, (x, 3), 3)       # an int is not the float of the same value
    replays(cs, (x, True), 4)
    replays(cs, (x, 2.0), 4)
    assert_plan(cs.c)


def test_grad_mode(rng):
    cs = Counted(loss_body, [0.5, -1.0, 2.0])
    x = ten(gen_array(rng, (2, 3)))
    replays(cs, (x,), 1)
    with jitgrad.no_grad():
        replays(cs, (x,), 2)
        assert not cs.c(x).requires_grad
    with jitgrad.inference_mode():
        replays(cs, (x,), 2)
    replays(cs, (x,), 2)
    assert_plan(cs.c)


def test_a_parameters_data_replaced(rng):
    cs = Counted(loss_body, [0.5, -1.0, 2.0])
    x = ten(gen_array(rng, (2, 3)))
    replays(cs, (x,), 1)
    for w in (cs.we, cs.wc):
        w.data = ten([3.0, 1.0, -0.5])
    replays(cs, (x,), 2)
    for w in (cs.we, cs.wc):  # another shape: the new plan reads the new array
        w.data = ten([[3.0, 1.0, -0.5]])
        w.grad = None
    replays(cs, (x,), 3)
    assert_plan(cs.c)


def test_a_parameters_requires_grad_changed(rng):
    cs = Counted(loss_body, [0.5, -1.0, 2.0])
    x = ten(gen_array(rng, (2, 3)), rg=True)
    replays(cs, (x,), 1)
    for w in (cs.we, cs.wc):
        w.requires_grad_(False)
        w.grad = None
    replays(cs, (x,), 2)
    assert cs.wc.grad is None
    for w in (cs.we, cs.wc):
        w.requires_grad_(True)
    replays(cs, (x,), 3)
    assert_plan(cs.c)


class Gate(jitgrad.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = jitgrad.nn.Parameter(ten([0.5, -1.0, 2.0]))

    def forward(self, x):
        return (x * self.w).tanh() if self.training else x * self.w * 0.5


def test_module_train_eval_mode_in_a_step(rng):
    m1, m2 = Gate(), Gate()
    runs = []

    def make(m, count):
        def step(x):
            count.append(1)
            loss = m(x).sum()
            loss.backward()
            return loss
        return step

    eager, c = make(m1, []), jitgrad.compile(make(m2, runs))
    x = gen_array(rng, (2, 3))
    for mode, n_runs in (("train", 1), ("eval", 2), ("train", 3)):
        for m in (m1, m2):
            getattr(m, mode)()
        for _ in range(3):
            close(c(ten(x)), eager(ten(x)), msg=mode)
            close(m2.w.grad, m1.w.grad, msg=f"{mode}: .grad")
        assert len(runs) == n_runs
    assert_plan(c)


def test_compiled_module_eval_and_train(rng):
    m1, m2 = Gate(), Gate()
    om = jitgrad.compile(m2)
    x = ten(gen_array(rng, (2, 3)))
    with jitgrad.no_grad():
        for mode in ("eval", "train", "eval"):
            getattr(m1, mode)()
            getattr(om, mode)()
            assert m2.training == (mode == "train")
            for _ in range(2):
                close(om(x), m1(x), msg=mode)
    assert_plan(om._compiled)


def test_a_submodules_mode_is_guarded_too(rng):
    m1 = jitgrad.nn.Sequential(Gate(), Gate())
    m2 = jitgrad.nn.Sequential(Gate(), Gate())
    om = jitgrad.compile(m2)
    x = ten(gen_array(rng, (2, 3)))
    with jitgrad.no_grad():
        for flip in (None, 1, 0):
            if flip is not None:
                m1[flip].eval()
                m2[flip].eval()
            for _ in range(2):
                close(om(x), m1(x), msg=f"submodule {flip} in eval")
    assert_plan(om._compiled)


@pytest.fixture
def small_cache():
    old = config.cache_size_limit
    config.cache_size_limit = 3
    yield
    config.cache_size_limit = old


def test_cache_size_limit_warns_once_and_runs_new_signatures_eagerly(rng, small_cache):
    cs = Counted(loss_body, [0.5])
    for n in (1, 2, 3):
        replays(cs, (ten(gen_array(rng, (n, 1))),), n)
    with pytest.warns(UserWarning, match=r"cache_size_limit \(3\)"):
        cs.call(ten(gen_array(rng, (4, 1))))
    assert cs.runs == 4 and len(entries(cs.c)) == 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once only
        for n in (4, 5, 6):
            cs.call(ten(gen_array(rng, (n, 1))))  # eagerly: the body runs every call
    assert cs.runs == 7
    replays(cs, (ten(gen_array(rng, (2, 1))),), 7)  # the plans it holds still replay
    assert_plan(cs.c)


def test_a_guard_failure_replaces_the_plan_not_adds_one(rng):
    cs = Counted(loss_body, [0.5, -1.0, 2.0])
    x = ten(gen_array(rng, (2, 3)))
    replays(cs, (x,), 1)
    for k in range(5):
        new = gen_array(rng, (3,))
        for w in (cs.we, cs.wc):
            w.data = ten(new)
        replays(cs, (x,), 2 + k)
    assert len(entries(cs.c)) == 1


def test_a_module_parameter_assigned_anew(rng):
    """model.w = Parameter(...) makes another tensor: the plan read the old one."""
    m1, m2 = Gate(), Gate()
    runs = []

    def make(m, count):
        def step(x):
            count.append(1)
            loss = m(x).sum()
            loss.backward()
            return loss
        return step

    eager, c = make(m1, []), jitgrad.compile(make(m2, runs))
    x = gen_array(rng, (2, 3))
    for k, n_runs in ((0, 1), (1, 2), (2, 3)):
        if k:
            new = gen_array(rng, (3,))
            m1.w = jitgrad.nn.Parameter(ten(new))
            m2.w = jitgrad.nn.Parameter(ten(new))
        for _ in range(3):
            close(c(ten(x)), eager(ten(x)), msg=f"parameter {k}")
            close(m2.w.grad, m1.w.grad, msg=f"parameter {k}: .grad")
        assert len(runs) == n_runs
    assert_plan(c)


def test_a_numpy_array_argument_is_keyed_by_its_values(rng):
    """Array data used as an operand is a constant of the plan: new values re-record, even
    written into the same array."""
    cs = Counted(lambda w, x, arr: loss_body(w, x * arr), [0.5, -1.0, 2.0])
    x = ten(gen_array(rng, (2, 3)))
    buf = np.ones(3)
    replays(cs, (x, buf), 1)
    buf[:] = [2.0, 0.5, -1.0]
    replays(cs, (x, buf), 2)
    replays(cs, (x, np.array([2.0, 0.5, -1.0])), 2)
    assert_plan(cs.c)


class Config:
    def __init__(self, scale):
        self.scale = scale


def test_another_argument_is_keyed_by_identity_and_held(rng):
    """An object's attributes the step reads are constants of the plan: another object
    re-records. The key holds the object, so a new one never takes its id."""
    cs = Counted(lambda w, x, cfg: loss_body(w, x, cfg.scale), [0.5, -1.0, 2.0])
    x = ten(gen_array(rng, (2, 3)))
    cfg = Config(2.0)
    replays(cs, (x, cfg), 1)
    for k in range(4):
        replays(cs, (x, Config(float(k))), 2 + k)
    replays(cs, (x, cfg), 5)
    assert_plan(cs.c)
