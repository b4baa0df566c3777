"""jitgrad.compile as a whole: a compiled step replays to eager's results.

Each test runs the same code eagerly and compiled, several calls with new inputs, and
compares outputs and gradients (rtol 1e-12 in float64, 1e-5 in float32). Where a program
is built only from ops that have forward kernels on every branch (elementwise ops,
sum / mean), it also asserts that a plan was made, not an eager fallback; a program with
other ops must give eager's results either way.
"""
import sys
import threading

import numpy as np
import pytest
from compile_helpers import as_np, assert_plan, breaks, close, entries, plans
from conftest import gen_array

import jitgrad
import jitgrad.nn.functional as F
from jitgrad.compiler import OptimizedModule
from jitgrad.graph.spec import SPECS

DTYPES = ["float64", "float32"]


def ten(a, dtype="float64", rg=False):
    return jitgrad.tensor(np.asarray(a), dtype=getattr(jitgrad, dtype), requires_grad=rg)


# name -> (fn, the primitive the plan must record, input domains (conftest.gen_array))
UNARY = {
    "neg": (lambda x: -x, "neg", "any"),
    "exp": (lambda x: x.exp(), "exp", "any"),
    "log": (lambda x: x.log(), "log", "pos"),
    "log1p": (lambda x: x.log1p(), "log1p", "pos"),
    "expm1": (lambda x: x.expm1(), "expm1", "any"),
    "sqrt": (lambda x: x.sqrt(), "sqrt", "pos"),
    "sin": (lambda x: x.sin(), "sin", "any"),
    "cos": (lambda x: jitgrad.cos(x), "cos", "any"),
    "tanh": (lambda x: x.tanh(), "tanh", "any"),
    "erf": (lambda x: jitgrad.erf(x), "erf", "any"),
    "sigmoid": (lambda x: x.sigmoid(), "sigmoid", "any"),
    "relu": (lambda x: F.relu(x), "relu", "any"),
    "abs": (lambda x: x.abs(), "abs", "any"),
    "clone": (lambda x: x.clone(), "clone", "any"),
    "sign": (lambda x: x.sign() * x, "sign", "any"),
    "reciprocal": (lambda x: x.reciprocal(), "reciprocal", "any"),
    "clamp": (lambda x: x.clamp(-0.8, 0.9), "clamp", "any"),
    "clamp_min": (lambda x: x.clamp(min=-0.4), "clamp", "any"),
    "clamp_max": (lambda x: x.clamp(max=0.5), "clamp", "any"),
    "gelu": (lambda x: F.gelu(x), "gelu", "any"),
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), "gelu", "any"),
    "pow_int": (lambda x: x ** 3, "pow", "any"),
    "pow_neg": (lambda x: x ** -2, "pow", "any"),
    "pow_frac": (lambda x: x ** 1.5, "pow", "pos"),
    "rpow": (lambda x: 1.7 ** x, "rpow", "any"),
    "rsub": (lambda x: 2 - x, "rsub", "any"),
    "rdiv": (lambda x: 2.0 / x, "reciprocal", "any"),
    "add_number": (lambda x: x + 2, "add", "any"),
    "radd_number": (lambda x: 0.5 + x, "add", "any"),
    "sub_number": (lambda x: x - 0.25, "sub", "any"),
    "mul_number": (lambda x: x * 3, "mul", "any"),
    "rmul_number": (lambda x: -1.5 * x, "mul", "any"),
    "div_number": (lambda x: x / 4.0, "div", "any"),
    "masked_fill": (lambda x: x.masked_fill(x > 0.5, 0.25), "masked_fill", "any"),
    "asin": (lambda x: x.asin(), "asin", "unit"),
    "acos": (lambda x: jitgrad.acos(x), "acos", "unit"),
    "atan": (lambda x: jitgrad.arctan(x), "atan", "any"),
}

BINARY = {
    "add": (lambda a, b: a + b, "add", "any", "any"),
    "add_alpha": (lambda a, b: jitgrad.add(a, b, alpha=0.5), "add", "any", "any"),
    "sub": (lambda a, b: a - b, "sub", "any", "any"),
    "mul": (lambda a, b: a * b, "mul", "any", "any"),
    "div": (lambda a, b: a / b, "div", "any", "any"),
    "pow_tt": (lambda a, b: a ** b, "pow_tt", "pos", "any"),
    "maximum": (lambda a, b: jitgrad.maximum(a, b), "maximum", "any", "any"),
    "minimum": (lambda a, b: jitgrad.minimum(a, b), "minimum", "any", "any"),
    "masked_fill_tensor": (lambda a, b: a.masked_fill(b > 0, b.sum()), "masked_fill_tensor", "any", "any"),
    "atan2": (lambda a, b: jitgrad.atan2(a, b), "atan2", "any", "any"),
    "binary_cross_entropy": (lambda a, b: F.binary_cross_entropy(a.sigmoid(), b.sigmoid(), reduction="none"),
                             "binary_cross_entropy", "any", "any"),
}

# the elementwise primitives a step can use (fill / zero / copy are in-place: graph breaks)
IN_PLACE = {"fill", "fill_tensor", "zero", "copy"}


def run_twice(step, make_args, n_calls=3):
    """step eagerly and compiled, n_calls calls each on equal fresh arguments (make_args(k)
    -> tuple); returns (compiled fn, [(eager result, eager args, compiled result, compiled args)])."""
    c = jitgrad.compile(step)
    out = []
    for k in range(n_calls):
        ea, ca = make_args(k), make_args(k)
        out.append((step(*ea), ea, c(*ca), ca))
    return c, out


def check_runs(runs, dtype):
    for k, (er, ea, cr, ca) in enumerate(runs):
        close(cr, er, dtype, f"call {k}: result")
        for j, (e, c) in enumerate(zip(ea, ca)):
            if isinstance(e, jitgrad.Tensor) and e.requires_grad:
                close(c.grad, e.grad, dtype, f"call {k}: .grad of argument {j}")


def test_every_elementwise_primitive_with_a_forward_formula_is_covered():
    recorded = {case[1] for case in UNARY.values()} | {case[1] for case in BINARY.values()} | {"where"}
    with_fwd = {s.name for s in SPECS if s is not None and s.kind == "ew" and s.fwd is not None}
    assert with_fwd - IN_PLACE - recorded == set()


def _loss_step(f):
    def step(*xs):
        out = f(*xs)
        loss = (out * out).sum() + out.mean()
        loss.backward()
        return out, loss
    return step


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_primitive_replays_like_eager(name, dtype, rng):
    f, prim, dom = UNARY[name]
    data = [gen_array(rng, (3, 4), dom) for _ in range(3)]
    c, runs = run_twice(_loss_step(f), lambda k: (ten(data[k], dtype, rg=True),))
    check_runs(runs, dtype)
    assert_plan(c)
    assert prim in plans(c)[0].plan.names


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_primitive_replays_like_eager(name, dtype, rng):
    f, prim, da, db = BINARY[name]
    data = [(gen_array(rng, (3, 4), da), gen_array(rng, (3, 4), db)) for _ in range(3)]
    c, runs = run_twice(_loss_step(f), lambda k: (ten(data[k][0], dtype, True), ten(data[k][1], dtype, True)))
    check_runs(runs, dtype)
    assert_plan(c)
    assert prim in plans(c)[0].plan.names


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shapes", [((3, 4), (4,)), ((3, 1), (1, 4)), ((), (2, 3)), ((2, 1, 3), (4, 1)),
                                    ((2, 3), ()), ((1,), (5,))])
@pytest.mark.parametrize("name", ["add", "sub", "mul", "div", "pow_tt", "maximum"])
def test_broadcasting_binary_ops_replay_with_gradients_summed_back(name, shapes, dtype, rng):
    f, _, da, db = BINARY[name]
    data = [(gen_array(rng, shapes[0], da), gen_array(rng, shapes[1], db)) for _ in range(3)]
    c, runs = run_twice(_loss_step(f), lambda k: (ten(data[k][0], dtype, True), ten(data[k][1], dtype, True)))
    check_runs(runs, dtype)
    assert_plan(c)


@pytest.mark.parametrize("dtype", DTYPES)
def test_one_operand_without_grad_and_array_data_operands(dtype, rng):
    data = [(gen_array(rng, (2, 3)), gen_array(rng, (3,))) for _ in range(3)]
    const = np.array([0.5, -1.0, 2.0])

    def step(x, y):
        out = (x * y + const) / (y * y + 1.0) - np.array([1.0, 2.0, 3.0])
        out.sum().backward()
        return out

    c, runs = run_twice(step, lambda k: (ten(data[k][0], dtype, True), ten(data[k][1], dtype)))
    check_runs(runs, dtype)
    assert_plan(c)
    assert all(y.grad is None for _, _, _, (_, y) in runs)


@pytest.mark.parametrize("dtype", DTYPES)
def test_where_with_a_condition_argument_and_number_operands(dtype, rng):
    data = [(rng.random((3, 4)) < 0.5, gen_array(rng, (3, 4)), gen_array(rng, (4,))) for _ in range(3)]

    def step(cond, a, b):
        out = jitgrad.where(cond, a, b * 2.0) + jitgrad.where(cond, 1.5, a) * jitgrad.where(cond, b, 0.0)
        (out * out).sum().backward()
        return out

    c, runs = run_twice(step, lambda k: (jitgrad.tensor(data[k][0]), ten(data[k][1], dtype, True),
                                         ten(data[k][2], dtype, True)))
    check_runs(runs, dtype)
    assert_plan(c)
    assert "where" in plans(c)[0].plan.names


def test_where_on_a_comparison_made_in_the_step_gives_eagers_results(rng):
    data = [(gen_array(rng, (3, 4)), gen_array(rng, (4,))) for _ in range(3)]

    def step(a, b):
        out = jitgrad.where(a > b, a, b * 2.0)
        out.sum().backward()
        return out

    _, runs = run_twice(step, lambda k: (ten(data[k][0], rg=True), ten(data[k][1], rg=True)))
    check_runs(runs, "float64")


SUMS = {
    "sum": lambda x: x.sum(),
    "mean": lambda x: x.mean(),
    "sum_dim": lambda x: x.sum(1),
    "sum_neg_dim_keep": lambda x: x.sum(-1, keepdim=True),
    "sum_dims": lambda x: x.sum((0, 2)),
    "mean_dim": lambda x: jitgrad.mean(x, 0),
    "mean_dims_keep": lambda x: x.mean((1, 2), keepdim=True),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(SUMS))
def test_sum_and_mean_replay(name, dtype, rng):
    f = SUMS[name]
    data = [gen_array(rng, (2, 3, 4)) for _ in range(3)]

    def step(x):
        s = f(x.tanh() * 2.0)
        loss = (s * s).sum()
        loss.backward()
        return s, loss

    c, runs = run_twice(step, lambda k: (ten(data[k], dtype, True),))
    check_runs(runs, dtype)
    assert_plan(c)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_step_without_grad_replays(dtype, rng):
    data = [gen_array(rng, (4, 5)) for _ in range(3)]

    @jitgrad.no_grad()
    def step(x):
        h = (x * 0.5).tanh() + x.exp().mean(0)
        return h.sum(1), h.mean()

    c, runs = run_twice(step, lambda k: (ten(data[k], dtype),))
    check_runs(runs, dtype)
    assert_plan(c)
    assert not runs[-1][2][0].requires_grad


def test_scalar_graphs_and_a_backward_of_a_non_scalar_root(rng):
    data = [gen_array(rng, ()) for _ in range(3)]

    def step(x, w):
        h = x
        for _ in range(20):
            h = (h * w + 0.1).tanh() + h * 0.5
        v = h * jitgrad.tensor([1.0, 2.0, 3.0], dtype=jitgrad.float64)
        v.backward(jitgrad.tensor([0.5, 1.0, -1.0], dtype=jitgrad.float64))
        return h

    c, runs = run_twice(step, lambda k: (ten(data[k], rg=True), ten(0.7, rg=True)))
    check_runs(runs, "float64")


def test_parameters_from_outside_the_step_get_gradients_every_call(rng):
    """A tensor the step closes over (a parameter) is read in place at every replay and its
    .grad accumulates across calls, as eager's."""
    w0 = gen_array(rng, (3,))
    we, wc = ten(w0, rg=True), ten(w0, rg=True)

    def make(w):
        def step(x):
            loss = ((x * w).sin() ** 2).sum()
            loss.backward()
            return loss
        return step

    eager, c = make(we), jitgrad.compile(make(wc))
    for k in range(4):
        x = gen_array(rng, (2, 3))
        close(c(ten(x)), eager(ten(x)), msg=f"call {k}")
        close(wc.grad, we.grad, msg=f"call {k}: .grad accumulated")
    assert_plan(c)


def test_the_same_tensor_passed_twice_and_keyword_arguments(rng):
    data = [gen_array(rng, (3,)) for _ in range(3)]

    def step(a, b, *, scale, bias=None):
        out = a * b * scale + (0.0 if bias is None else bias)
        out.sum().backward()
        return {"out": out, "n": 3}

    c = jitgrad.compile(step)
    for k in range(3):
        xe, xc = ten(data[k], rg=True), ten(data[k], rg=True)
        close(c(xc, xc, scale=ten(2.0), bias=ten([1.0, 2, 3])), step(xe, xe, scale=ten(2.0), bias=ten([1.0, 2, 3])))
        close(xc.grad, xe.grad, msg=f"call {k}: .grad")
    assert_plan(c)


def test_outputs_are_fresh_tensors_every_call(rng):
    w = ten([1.0, 2.0, 3.0], rg=True)

    def step(x):
        y = x * w
        loss = y.sum()
        loss.backward()
        return y, loss

    c = jitgrad.compile(step)
    y0, l0 = c(ten([1.0, 1.0, 1.0]))
    y1, l1 = c(ten([2.0, 2.0, 2.0]))
    y2, l2 = c(ten([3.0, 3.0, 3.0]))
    assert_plan(c)
    assert len({id(y0), id(y1), id(y2)}) == 3
    np.testing.assert_array_equal(as_np(y1), [2.0, 4.0, 6.0])  # not overwritten by the third call
    np.testing.assert_array_equal(as_np(l1), 12.0)
    np.testing.assert_array_equal(as_np(y2), [3.0, 6.0, 9.0])
    y2.mul_(0.0)  # writing to an output leaves the next call alone
    np.testing.assert_array_equal(as_np(c(ten([1.0, 1.0, 1.0]))[0]), [1.0, 2.0, 3.0])


def test_non_tensor_outputs_and_nested_structures_come_back(rng):
    def step(x):
        y = (x * 2.0).sum()
        return [y, (x + 1.0, None), {"k": "v", "n": 1.5}]

    c = jitgrad.compile(step)
    for k in range(3):
        x = gen_array(rng, (2,))
        close(c(ten(x)), step(ten(x)), msg=f"call {k}")
    assert_plan(c)


def test_python_side_effects_run_only_while_recording():
    seen = []

    @jitgrad.compile
    def step(x):
        seen.append(1)
        return x * 2.0

    for k in range(4):
        close(step(ten([float(k)])), ten([2.0 * k]))
    assert seen == [1]


def test_decorator_forms_and_torch_compile_keywords():
    def f(x):
        """doc"""
        return x * 3.0

    x = ten([1.0, 2.0])
    for c in (jitgrad.compile(f), jitgrad.compile()(f), jitgrad.compile(fullgraph=True)(f),
              jitgrad.compile(f, backend="inductor", mode="reduce-overhead", dynamic=False, options={}),
              jitgrad.compiler.compile(f)):
        assert c.__name__ == "f" and c.__doc__ == "doc" and c.__wrapped__ is f
        for _ in range(2):
            close(c(x), f(x))
        assert_plan(c)
    assert jitgrad.compile(f, disable=True) is f

    @jitgrad.compile(fullgraph=True)
    def g(x):
        return x - 1.0

    close(g(x), ten([0.0, 1.0]))
    close(g(x), ten([0.0, 1.0]))
    assert_plan(g)
    with pytest.raises(RuntimeError):
        jitgrad.compile(3)


class Scale(jitgrad.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = jitgrad.nn.Parameter(ten([0.5, -1.0, 2.0]))

    def forward(self, x):
        return (x * self.w).tanh() + self.w


def test_compiled_module_is_a_module_sharing_the_original(rng):
    m = Scale()
    om = jitgrad.compile(m)
    assert isinstance(om, OptimizedModule) and isinstance(om, jitgrad.nn.Module)
    assert om._orig_mod is m and om.w is m.w
    assert [n for n, _ in om.named_parameters()] == ["_orig_mod.w"]  # as torch's OptimizedModule
    assert list(om.state_dict()) == ["_orig_mod.w"]
    assert list(om.parameters()) == [m.w]


def test_compiled_module_forward_replays_for_inference_and_trains_like_eager(rng):
    m1, m2 = Scale(), Scale()
    om = jitgrad.compile(m2)
    with jitgrad.no_grad():
        for k in range(3):
            x = gen_array(rng, (4, 3))
            close(om(ten(x)), m1(ten(x)), msg=f"no-grad call {k}")
    assert_plan(om._compiled)
    opt1 = jitgrad.optim.SGD(m1.parameters(), lr=0.1)
    opt2 = jitgrad.optim.SGD(om.parameters(), lr=0.1)
    for k in range(3):  # the output's backward runs outside the compiled forward
        x = gen_array(rng, (4, 3))
        y1, y2 = m1(ten(x)), om(ten(x))
        assert y2.requires_grad and y2.grad_fn is not None
        close(y2, y1, msg=f"training call {k}")
        y1.sum().backward()
        y2.sum().backward()
        close(m2.w.grad, m1.w.grad, msg=f"training call {k}: .grad")
        opt1.step()
        opt2.step()
        opt1.zero_grad()
        opt2.zero_grad()
        close(m2.w, m1.w, msg=f"training call {k}: parameter")
    assert_plan(om._compiled)  # a graph per call, handed back (graph mode)


def test_a_module_training_step_with_nn_layers_equals_eager(rng):
    """nn.Linear, Tanh, mse_loss and SGD with momentum: a plan, with eager's results."""
    def make():
        jitgrad.manual_seed(0)
        model = jitgrad.nn.Sequential(jitgrad.nn.Linear(4, 8), jitgrad.nn.Tanh(), jitgrad.nn.Linear(8, 1))
        opt = jitgrad.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

        def step(x, y):
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss
        return model, step

    (m1, s1), (m2, s2) = make(), make()
    c = jitgrad.compile(s2)
    for k in range(4):
        x, y = gen_array(rng, (16, 4)), gen_array(rng, (16, 1))
        args = lambda: (ten(x, "float32"), ten(y, "float32"))  # noqa: E731
        close(c(*args()), s1(*args()), "float32", f"call {k}: loss")
        for (n, p1), p2 in zip(m1.named_parameters(), m2.parameters()):
            close(p2, p1, "float32", f"call {k}: {n}")
    assert_plan(c)


def test_an_error_while_recording_propagates_and_the_next_call_records_again():
    fail = [True]

    def step(x):
        y = x * 2.0
        if fail[0]:
            raise ValueError("boom")
        return y

    c = jitgrad.compile(step)
    with pytest.raises(ValueError, match="boom"):
        c(ten([1.0]))
    assert entries(c) == []
    assert not jitgrad._core.capture.state.on  # the recording switch is off again
    fail[0] = False
    close(c(ten([1.0])), ten([2.0]))
    close(c(ten([3.0])), ten([6.0]))
    assert_plan(c)


def test_ops_at_several_dtypes_or_on_ints_give_eagers_results(rng):
    def mixed(x, y):
        return (x * 2.0).sum() + (y * 3.0).sum().double()

    def ints(n, x):
        return x * (n + 1).double()

    cases = [(mixed, lambda: (ten(gen_array(rng, (3,))), ten(gen_array(rng, (3,)), "float32"))),
             (ints, lambda: (jitgrad.tensor([1, 2, 3]), ten(gen_array(rng, (3,)))))]
    for fn, args in cases:
        c = jitgrad.compile(fn)
        for k in range(3):
            a = args()
            close(c(*a), fn(*a), msg=f"{fn.__name__} call {k}")



def test_calls_from_several_threads_each_get_their_own_result():
    """One plan, one arena: concurrent replays must not mix their values."""
    def step(x):
        h = x
        for _ in range(20):
            h = (h * 0.9 + 0.1).tanh()
        return h.sum()

    c = jitgrad.compile(step)
    xs = [ten(np.random.default_rng(k).normal(size=64)) for k in range(4)]
    with jitgrad.no_grad():
        c(xs[0])
        want = [as_np(c(x)) for x in xs]  # replayed alone
    assert_plan(c)
    bad = []

    def worker(k):
        with jitgrad.no_grad():
            for _ in range(100):
                got = as_np(c(xs[k]))
                if got != want[k]:
                    bad.append((k, got, want[k]))

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can
    try:
        threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert not bad, f"{len(bad)} calls got another call's values, e.g. {bad[0]}"


def grad_norm(w, opt, x):
    loss = ((w * x).tanh() ** 2).sum()
    loss.backward()
    gn = (w.grad * w.grad).sum()  # ops on the .grad the backward made
    opt.step()
    opt.zero_grad()
    return loss, gn


def clip_grad(w, opt, x):
    loss = ((w * x).tanh() ** 2).sum()
    loss.backward()
    w.grad = w.grad.clamp(-0.5, 0.5) * 0.5  # a .grad assigned
    opt.step()
    opt.zero_grad()
    return loss


def two_losses_one_graph(w, opt, x):
    h = (w * x).tanh()
    l1, l2 = (h ** 2).sum(), (h * 3.0).sum()
    l1.backward(retain_graph=True)
    l2.backward()
    opt.step()
    opt.zero_grad()
    return l1, l2


def two_graphs(w, opt, x):
    l1 = ((w * x).tanh() ** 2).sum()
    l1.backward()
    l2 = (w * x * 3.0).sin().sum()
    l2.backward()
    opt.step()
    opt.zero_grad()
    return l1, l2


def backward_with_a_gradient(w, opt, x):
    h = (w * x).tanh()
    h.backward(x * 2.0)
    opt.step()
    opt.zero_grad()
    return h


def grad_kept_after_step(w, opt, x):
    loss = ((w * x).tanh() ** 2).sum()
    loss.backward()
    opt.step()
    g = w.grad * 1.0
    opt.zero_grad()
    return loss, g


def grads_accumulate_across_calls(w, opt, x):
    loss = ((w * x).tanh() ** 2).sum()
    loss.backward()
    opt.step()
    return loss


@pytest.mark.parametrize("body", [grad_norm, clip_grad, two_losses_one_graph, two_graphs, backward_with_a_gradient,
                                  grad_kept_after_step, grads_accumulate_across_calls],
                         ids=lambda f: f.__name__)
def test_what_a_step_does_besides_ops_replays(body):
    """backward() calls, .grad reads and assignments, optimizer calls: the events of a step."""
    made = []
    for _ in range(2):
        w = ten([0.5, -1.0, 2.0], rg=True)
        made.append((w, jitgrad.optim.SGD([w], lr=0.1, momentum=0.9)))
    (we, oe), (wc, oc) = made
    c = jitgrad.compile(lambda x: body(wc, oc, x))
    for k in range(4):
        x = [1.0 + k, -0.5, 0.25 * k]
        close(c(ten(x)), body(we, oe, ten(x)), msg=f"call {k}")
        close(wc, we, msg=f"call {k}: parameter")
        if we.grad is not None:
            close(wc.grad, we.grad, msg=f"call {k}: .grad")
        else:
            assert wc.grad is None
    assert_plan(c)


def test_random_numbers_drawn_in_a_step_are_fresh_every_call(rng):
    """randn and dropout in the step draw what eager draws from the same generator state,
    never the recorded numbers: the plan draws them again."""
    def make():
        w = ten([0.5, -1.0, 2.0, 0.3], rg=True)

        def step(x):
            noise = jitgrad.randn(4, dtype=jitgrad.float64)
            h = F.dropout(x * w + noise * 0.1, p=0.5, training=True)
            loss = (h * h).sum()
            loss.backward()
            return loss, h
        return w, step

    (we, eager), (wc, step) = make(), make()
    c = jitgrad.compile(step)
    outs = []
    for k in range(4):
        x = gen_array(rng, (3, 4))
        jitgrad.manual_seed(100 + k)
        got = c(ten(x))
        jitgrad.manual_seed(100 + k)
        want = eager(ten(x))
        close(got, want, msg=f"call {k}")
        close(wc.grad, we.grad, msg=f"call {k}: .grad")
        outs.append(as_np(got[1]))
    assert not np.array_equal(outs[1] != 0, outs[2] != 0)  # different masks
    assert_plan(c)


@pytest.mark.parametrize("what", ["argument", "argument_view", "parameter_view"])
def test_returning_an_argument_or_a_view_of_one_aliases_as_eager(what):
    """Eager returns the tensor itself (or a view of it): writes after the call show in it.
    A replay would return a copy, so such a step runs eagerly."""
    def make():
        w = ten([1.0, 2.0, 3.0], rg=True)
        opt = jitgrad.optim.SGD([w], lr=0.1)

        def step(x):
            loss = (w * x).sum()
            loss.backward()
            opt.step()
            opt.zero_grad()
            return {"argument": x, "argument_view": x.unsqueeze(0), "parameter_view": w.unsqueeze(0)}[what]
        return w, step

    (we, eager), (wc, step) = make(), make()
    c = jitgrad.compile(step)
    for k in range(3):
        xe, xc = ten([1.0, 2.0, -1.0]), ten([1.0, 2.0, -1.0])
        got, want = c(xc), eager(xe)
        with jitgrad.no_grad():  # written after the call: the returned tensor sees it
            for x, w in ((xe, we), (xc, wc)):
                x.mul_(2.0)
                w.add_(1.0)
        close(got, want, msg=f"call {k}")
    assert "returns a view of an argument or of a tensor from outside the step" in breaks(c)[0][0]
