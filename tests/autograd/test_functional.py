"""jitgrad.autograd.functional against torch.autograd.functional in float64: vjp, jvp,
jacobian, hessian, vhp and hvp of random programs (elementwise ops, matmul, reductions,
views; one or several inputs and outputs, as Tensors or tuples), with create_graph,
strict, vectorize and both strategies, and torch's errors."""
import importlib

import numpy as np
import pytest
import torch
from conftest import assert_close, capture, gen_array, stable_seed

import jitgrad

LIBS = (jitgrad, torch)


def AF(T):
    return importlib.import_module(T.__name__ + ".autograd.functional")


# --- random programs: a list of steps run by one interpreter for both libraries

UNARY = ("sin", "tanh", "sq", "exp", "sigmoid", "cube")
BINARY = ("add", "mul", "sub")
MIXING = ("matmul", "transpose_view", "colsum", "rowmean", "total", "slice")


def random_program(seed, n_inputs, n_outputs, n_steps=6):
    """Steps over a pool of (m, n) values that starts with the inputs; each step appends
    one value. The outputs are the last values, each reduced as the program says."""
    rng = np.random.default_rng(seed)
    steps = []
    size = n_inputs
    for _ in range(n_steps):
        kind = rng.choice(["unary", "binary", "mixing"], p=[0.35, 0.3, 0.35])
        a, b, c = (int(i) for i in rng.integers(0, size, 3))
        if kind == "unary":
            steps.append((str(rng.choice(UNARY)), a, b, c))
        elif kind == "binary":
            steps.append((str(rng.choice(BINARY)), a, b, c))
        else:
            steps.append((str(rng.choice(MIXING)), a, b, c))
        size += 1
    finals = [str(rng.choice(["full", "rows", "scalar", "flat"])) for _ in range(n_outputs)]
    return steps, finals


def _step(T, op, x, y, z):
    m, n = x.shape
    if op == "sin":
        return x.sin()
    if op == "tanh":
        return x.tanh()
    if op == "sq":
        return x * x
    if op == "exp":
        return (0.3 * x).exp()
    if op == "sigmoid":
        return x.sigmoid()
    if op == "cube":
        return x.pow(3) * 0.5
    if op == "add":
        return x + y
    if op == "mul":
        return x * y
    if op == "sub":
        return x - 2.0 * y
    if op == "matmul":
        return T.matmul(x, y.t() @ z) * 0.5
    if op == "transpose_view":
        return x.t().reshape(m, n) + y
    if op == "colsum":
        return x.sum(dim=0, keepdim=True) * y
    if op == "rowmean":
        return x.mean(1, keepdim=True) + y.tanh()
    if op == "total":
        return x.sum() * y * 0.2
    if op == "slice":
        return T.cat([x[1:], y[:1]], 0) * z
    raise AssertionError(op)


def _final(kind, v):
    if kind == "full":
        return v
    if kind == "rows":
        return v.sum(1)
    if kind == "scalar":
        return (v * v).sum()
    return v.reshape(-1)[1:]


def make_func(T, prog, tuple_out):
    steps, finals = prog

    def f(*xs):
        pool = list(xs)
        for op, a, b, c in steps:
            pool.append(_step(T, op, pool[a], pool[b], pool[c]))
        outs = tuple(_final(k, pool[-1 - i]) for i, k in enumerate(finals))
        return outs if tuple_out else outs[0]
    return f


def make_scalar_func(T, prog):
    inner = make_func(T, prog, True)

    def f(*xs):
        return sum(o.sum() for o in inner(*xs)) + (xs[0] * xs[-1]).sin().sum()
    return f


def arrays(seed, n_inputs, shape=(3, 2)):
    rng = np.random.default_rng(seed)
    return [gen_array(rng, shape) for _ in range(n_inputs)]


def tens(T, arrs, rg=False):
    return tuple(T.tensor(a, dtype=T.float64, requires_grad=rg) for a in arrs)


def pack(ts, as_tuple):
    return ts if as_tuple else ts[0]


def check(j, t, msg="", requires_grad=True):
    """Same nesting (tuple vs Tensor, lengths), values, dtypes and requires_grad."""
    if isinstance(t, (tuple, list)):  # torch's forward-mode jacobian nests lists
        assert type(j) is type(t), f"{msg}: got {type(j).__name__}, torch gives a {type(t).__name__}"
        assert len(j) == len(t), f"{msg}: length {len(j)} != {len(t)}"
        for k, (a, b) in enumerate(zip(j, t)):
            check(a, b, f"{msg}[{k}]", requires_grad)
        return
    assert isinstance(t, torch.Tensor), f"{msg}: unexpected torch result {t!r}"
    assert isinstance(j, jitgrad.Tensor), f"{msg}: got {type(j).__name__}, torch gives a Tensor"
    assert str(j.dtype) == str(t.dtype), f"{msg}: dtype {j.dtype} != {t.dtype}"
    if requires_grad:
        assert j.requires_grad == t.requires_grad, f"{msg}: requires_grad {j.requires_grad} != {t.requires_grad}"
    assert_close(j, t, rtol=1e-9, atol=1e-11, msg=msg)


CASES = [(n_in, n_out, tin, tout) for n_in, n_out in ((1, 1), (2, 1), (1, 2), (3, 2))
         for tin in (False, True) for tout in (False, True)
         if (tin or n_in == 1) and (tout or n_out == 1)]
IDS = [f"in{a}{'t' if c else ''}-out{b}{'t' if d else ''}" for a, b, c, d in CASES]


def _run(fn_name, case, seed, create_graph, extra=None, **kw):
    """fn(func, inputs, ...) with both libraries, on one random program. Under
    create_graph the results are differentiated again with respect to the original
    inputs, and those gradients compared too."""
    n_in, n_out, tin, tout = case
    prog = random_program(seed, n_in, n_out)
    arrs = arrays(seed + 1, n_in)
    res = []
    for T in LIBS:
        xs = tens(T, arrs, rg=create_graph)
        args = extra(T, xs) if extra is not None else ()
        out = getattr(AF(T), fn_name)(make_func(T, prog, tout), pack(xs, tin), *args, create_graph=create_graph,
                                      **kw)
        second = None
        if create_graph:
            flat = [t for t in _flatten(out) if t.requires_grad]
            if flat:
                second = T.autograd.grad(sum((t * t).sum() for t in flat), xs, allow_unused=True,
                                         materialize_grads=True)
        res.append((out, second))
    (jo, js), (to, ts) = res
    check(jo, to, fn_name)
    if create_graph:
        assert (js is None) == (ts is None)
        if ts is not None:
            check(js, ts, fn_name + " second order", requires_grad=False)
    return jo, to


def _flatten(x):
    if isinstance(x, (tuple, list)):
        return [t for el in x for t in _flatten(el)]
    return [x]


def _v_like_outputs(seed, prog_case):
    """v for vjp: random arrays shaped like the outputs (computed by torch)."""
    n_in, n_out, tin, tout = prog_case
    prog = random_program(seed, n_in, n_out)
    outs = make_func(torch, prog, True)(*tens(torch, arrays(seed + 1, n_in)))
    rng = np.random.default_rng(seed + 7)
    vs = [gen_array(rng, tuple(o.shape)) for o in outs]

    def extra(T, xs):
        return (pack(tens(T, vs), tout),)
    return extra


def _v_like_inputs(seed, prog_case):
    n_in, _, tin, _ = prog_case
    vs = arrays(seed + 9, n_in)

    def extra(T, xs):
        return (pack(tens(T, vs), tin),)
    return extra


# --- vjp, jvp

@pytest.mark.parametrize("create_graph", [False, True])
@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("seed", [0, 1])
def test_vjp_matches_torch(case, seed, create_graph):
    s = stable_seed("vjp", case, seed)
    _run("vjp", case, s, create_graph, _v_like_outputs(s, case))


@pytest.mark.parametrize("create_graph", [False, True])
@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("seed", [0, 1])
def test_jvp_matches_torch(case, seed, create_graph):
    s = stable_seed("jvp", case, seed)
    _run("jvp", case, s, create_graph, _v_like_inputs(s, case))


def test_v_may_be_omitted_for_one_element():
    def run(T, fn, f):
        x = T.tensor([0.7], dtype=T.float64)
        return getattr(AF(T), fn)(f, x)
    for fn in ("vjp", "jvp"):
        check(run(jitgrad, fn, lambda x: (x * x).sin()), run(torch, fn, lambda x: (x * x).sin()), fn)
    for fn in ("vhp", "hvp"):
        check(run(jitgrad, fn, lambda x: (x * x).sin().sum()), run(torch, fn, lambda x: (x * x).sin().sum()), fn)


def test_a_tensor_captured_by_func_is_not_an_input():
    """The inputs are replaced by fresh Tensors: the same Tensor captured from outside
    is a constant (torch issue 32576)."""
    res = []
    for T in LIBS:
        x = T.tensor([0.5, -1.0], dtype=T.float64, requires_grad=True)
        res.append(AF(T).vjp(lambda a: a * x, x, T.ones(2, dtype=T.float64)))
    check(*res)
    np.testing.assert_array_equal(res[0][1].numpy(), [0.5, -1.0])  # d(a * x)/da, x a constant


# --- jacobian

@pytest.mark.parametrize("create_graph", [False, True])
@pytest.mark.parametrize("vectorize", [False, True])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_jacobian_reverse_matches_torch(case, vectorize, create_graph):
    s = stable_seed("jac", case)
    _run("jacobian", case, s, create_graph, vectorize=vectorize)


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("inputs_require_grad", [False, True])
def test_jacobian_forward_matches_torch(case, inputs_require_grad):
    n_in, n_out, tin, tout = case
    s = stable_seed("jacfwd", case)
    prog = random_program(s, n_in, n_out)
    arrs = arrays(s + 1, n_in)
    res = [AF(T).jacobian(make_func(T, prog, tout), pack(tens(T, arrs, inputs_require_grad), tin), vectorize=True,
                          strategy="forward-mode") for T in LIBS]
    # values and nesting; whether a tangent requires grad is forward AD's business (torch's
    # tangent of `2.0 * x` requires grad when x does, jitgrad's does not yet)
    check(*res, msg="jacobian forward-mode", requires_grad=False)


def test_jacobian_of_an_unused_input_and_a_constant_output():
    def run(T, vectorize, strategy="reverse-mode"):
        x, y = tens(T, arrays(3, 2))
        return AF(T).jacobian(lambda a, b: (a.sin(), T.ones(2, dtype=T.float64)), (x, y), vectorize=vectorize,
                              strategy=strategy)
    for vec in (False, True):
        check(run(jitgrad, vec), run(torch, vec), f"vectorize={vec}")
    check(run(jitgrad, True, "forward-mode"), run(torch, True, "forward-mode"), "forward-mode")


def test_vectorized_jacobian_is_one_batched_grad_call(monkeypatch):
    """All rows of the Jacobian come from one autograd.grad(is_grads_batched=True)."""
    calls = []
    real = jitgrad.autograd.functional._autograd_grad

    def counting(*args, **kwargs):
        calls.append(kwargs.get("is_grads_batched", False))
        return real(*args, **kwargs)
    monkeypatch.setattr(jitgrad.autograd.functional, "_autograd_grad", counting)
    x = jitgrad.tensor(arrays(5, 1, (4, 3))[0])
    jac = jitgrad.autograd.functional.jacobian(lambda a: (a @ a.t()).tanh(), x, vectorize=True)
    assert calls == [True] and tuple(jac.shape) == (4, 4, 4, 3)


# --- second order

@pytest.mark.parametrize("create_graph", [False, True])
@pytest.mark.parametrize("vectorize", [False, True])
@pytest.mark.parametrize("n_in,tin", [(1, False), (1, True), (2, True), (3, True)])
def test_hessian_matches_torch(n_in, tin, vectorize, create_graph):
    s = stable_seed("hess", n_in, tin)
    prog = random_program(s, n_in, 2)
    arrs = arrays(s + 1, n_in, (2, 2))
    res = []
    for T in LIBS:
        xs = tens(T, arrs, rg=create_graph)
        h = AF(T).hessian(make_scalar_func(T, prog), pack(xs, tin), create_graph=create_graph, vectorize=vectorize)
        second = None
        if create_graph:
            second = T.autograd.grad(sum((t * t).sum() for t in _flatten(h)), xs, allow_unused=True,
                                     materialize_grads=True)
        res.append((h, second))
    check(res[0][0], res[1][0], "hessian")
    if create_graph:
        check(res[0][1], res[1][1], "hessian second order", requires_grad=False)


@pytest.mark.parametrize("n_in,tin", [(1, False), (2, True)])
def test_hessian_forward_over_reverse_matches_torch(n_in, tin):
    s = stable_seed("hessfwd", n_in, tin)
    prog = random_program(s, n_in, 2)
    arrs = arrays(s + 1, n_in, (2, 2))
    res = [AF(T).hessian(make_scalar_func(T, prog), pack(tens(T, arrs), tin), vectorize=True,
                         outer_jacobian_strategy="forward-mode") for T in LIBS]
    check(*res, msg="hessian forward-over-reverse")


def _scalar_run(fn_name, n_in, tin, create_graph, seed):
    s = stable_seed(fn_name, n_in, tin, seed)
    prog = random_program(s, n_in, 2)
    arrs = arrays(s + 1, n_in)
    vs = arrays(s + 2, n_in)
    res = []
    for T in LIBS:
        xs = tens(T, arrs, rg=create_graph)
        out = getattr(AF(T), fn_name)(make_scalar_func(T, prog), pack(xs, tin), pack(tens(T, vs), tin),
                                      create_graph=create_graph)
        second = None
        if create_graph:
            second = T.autograd.grad(sum((t * t).sum() for t in _flatten(out)), xs, allow_unused=True,
                                     materialize_grads=True)
        res.append((out, second))
    check(res[0][0], res[1][0], fn_name)
    if create_graph:
        check(res[0][1], res[1][1], fn_name + " second order", requires_grad=False)


@pytest.mark.parametrize("fn_name", ["vhp", "hvp"])
@pytest.mark.parametrize("create_graph", [False, True])
@pytest.mark.parametrize("n_in,tin", [(1, False), (1, True), (3, True)])
@pytest.mark.parametrize("seed", [0, 1])
def test_vhp_hvp_match_torch(fn_name, n_in, tin, create_graph, seed):
    _scalar_run(fn_name, n_in, tin, create_graph, seed)


def test_hvp_equals_hessian_times_v():
    """On a random program: hvp is the Hessian (as a matrix) applied to v."""
    prog = random_program(11, 1, 2)
    x, = tens(jitgrad, arrays(12, 1))
    v, = tens(jitgrad, arrays(13, 1))
    f = make_scalar_func(jitgrad, prog)
    h = jitgrad.autograd.functional.hessian(f, x).numpy().reshape(6, 6)
    _, hv = jitgrad.autograd.functional.hvp(f, x, v)
    np.testing.assert_allclose(hv.numpy().reshape(-1), h @ v.numpy().reshape(-1), rtol=1e-10, atol=1e-12)


def test_jacobian_matches_finite_differences():
    prog = random_program(21, 2, 2)
    arrs = arrays(22, 2)
    f = make_func(jitgrad, prog, True)
    jac = jitgrad.autograd.functional.jacobian(f, tens(jitgrad, arrs), vectorize=True)
    eps = 1e-6
    for j in range(2):
        for idx in np.ndindex(*arrs[j].shape):
            hi = [a.copy() for a in arrs]
            lo = [a.copy() for a in arrs]
            hi[j][idx] += eps
            lo[j][idx] -= eps
            for i, (a, b) in enumerate(zip(f(*tens(jitgrad, hi)), f(*tens(jitgrad, lo)))):
                fd = (a.numpy() - b.numpy()) / (2 * eps)
                np.testing.assert_allclose(jac[i][j].numpy()[(Ellipsis,) + idx], fd, rtol=1e-6, atol=1e-7)


# --- grad mode and create_graph

@pytest.mark.parametrize("fn_name", ["vjp", "jvp", "jacobian"])
def test_results_do_not_require_grad_without_create_graph(fn_name):
    def run(T):
        x = T.tensor([0.3, 0.8], dtype=T.float64, requires_grad=True)
        extra = () if fn_name == "jacobian" else (T.ones(2, dtype=T.float64),)
        return getattr(AF(T), fn_name)(lambda a: a.exp() * a, x, *extra)
    check(run(jitgrad), run(torch), fn_name)


def test_create_graph_under_no_grad():
    def run(T):
        x = T.tensor([0.3, 0.8], dtype=T.float64, requires_grad=True)
        with T.no_grad():
            out, vj = AF(T).vjp(lambda a: a.exp() * a, x, T.ones(2, dtype=T.float64), create_graph=True)
            plain = AF(T).vjp(lambda a: a.exp() * a, x, T.ones(2, dtype=T.float64))
        return out, vj, plain
    check(run(jitgrad), run(torch))


# --- strict mode and errors

def _errors_match(make):
    """make(T) -> a thunk; both libraries raise the same type with the same message."""
    te = capture(make(torch))
    je = capture(make(jitgrad))
    assert te is not None, "torch did not raise: the test is wrong"
    assert je is not None, f"jitgrad did not raise (torch: {type(te).__name__}: {te})"
    assert type(je) is type(te), f"{type(je).__name__} vs torch {type(te).__name__}: {je}"
    assert str(je) == str(te), f"\njitgrad: {je}\ntorch:   {te}"


def _x(T, n=3, rg=False):
    return T.tensor(np.linspace(0.2, 0.9, n), dtype=T.float64, requires_grad=rg)


def _with_captured(T):
    """An output that requires grad but depends on no input: the double-backward trick
    cannot reach its grad_output."""
    w = _x(T, rg=True)
    return lambda a: (a * a, w * 2)


def _grad_captured(T):
    """A gradient with respect to b that requires grad (through w) but does not depend on b."""
    w = _x(T, rg=True)
    return lambda a, b: (a * a).sum() + (b * w).sum()


STRICT = {
    # output does not require grad
    "vjp-output": lambda T: lambda: AF(T).vjp(lambda a: a.detach() * 2, _x(T), _x(T), strict=True),
    "jvp-output": lambda T: lambda: AF(T).jvp(lambda a: a.detach() * 2, _x(T), _x(T), strict=True),
    "jacobian-output": lambda T: lambda: AF(T).jacobian(lambda a: a.detach() * 2, _x(T), strict=True),
    # an output independent of one input
    "vjp-input": lambda T: lambda: AF(T).vjp(lambda a, b: a * 2, (_x(T), _x(T)), _x(T), strict=True),
    "jvp-input": lambda T: lambda: AF(T).jvp(lambda a, b: (a * 2, b * 2), (_x(T), _x(T)), (_x(T), _x(T)),
                                             strict=True, create_graph=True),
    "jvp-linear-grad": lambda T: lambda: AF(T).jvp(lambda a: a * 2, _x(T), _x(T), strict=True, create_graph=True),
    "jvp-back-trick": lambda T: lambda: AF(T).jvp(_with_captured(T), _x(T), _x(T), strict=True),
    "jacobian-input": lambda T: lambda: AF(T).jacobian(lambda a, b: a.sin(), (_x(T), _x(T)), strict=True),
    "jacobian-linear": lambda T: lambda: AF(T).jacobian(lambda a: a * 2, _x(T), strict=True, create_graph=True),
    "vjp-linear": lambda T: lambda: AF(T).vjp(lambda a: a * 2, _x(T), _x(T), strict=True, create_graph=True),
    "hessian-linear": lambda T: lambda: AF(T).hessian(lambda a: (a * 2).sum(), _x(T), strict=True),
    "hessian-quadratic": lambda T: lambda: AF(T).hessian(lambda a: (a * a).sum(), _x(T), strict=True,
                                                         create_graph=True),
    "vhp-linear": lambda T: lambda: AF(T).vhp(lambda a: (a * 2).sum(), _x(T), _x(T), strict=True),
    "vhp-input": lambda T: lambda: AF(T).vhp(lambda a, b: (a * a).sum() + (b * 2).sum(), (_x(T), _x(T)),
                                             (_x(T), _x(T)), strict=True),
    "vhp-quadratic": lambda T: lambda: AF(T).vhp(lambda a: (a * a).sum(), _x(T), _x(T), strict=True,
                                                 create_graph=True),
    "hvp-linear": lambda T: lambda: AF(T).hvp(lambda a: (a * 2).sum(), _x(T), _x(T), strict=True),
    "hvp-quadratic": lambda T: lambda: AF(T).hvp(lambda a: (a * a).sum(), _x(T), _x(T), strict=True,
                                                 create_graph=True),
    "hvp-input": lambda T: lambda: AF(T).hvp(lambda a, b: (a * a).sum(), (_x(T), _x(T)), (_x(T), _x(T)),
                                             strict=True),
    "vhp-double-back": lambda T: lambda: AF(T).vhp(_grad_captured(T), (_x(T), _x(T)), (_x(T), _x(T)),
                                                   strict=True),
    "hvp-double-back-trick": lambda T: lambda: AF(T).hvp(_grad_captured(T), (_x(T), _x(T)), (_x(T), _x(T)),
                                                         strict=True),
    "hvp-output": lambda T: lambda: AF(T).hvp(lambda a: a.detach().sum(), _x(T), _x(T), strict=True),
}


@pytest.mark.parametrize("name", sorted(STRICT))
def test_strict_errors_match_torch(name):
    _errors_match(STRICT[name])


def test_strict_passes_when_everything_depends_on_everything():
    def run(T):
        f = lambda a, b: ((a * b).sin(), (a.exp() * b).sum())  # noqa: E731
        xs = (_x(T), _x(T))
        return (AF(T).vjp(f, xs, (_x(T), T.tensor(1.0, dtype=T.float64)), strict=True),
                AF(T).jvp(f, xs, xs, strict=True),
                AF(T).jacobian(f, xs, strict=True),
                AF(T).hessian(lambda a, b: (a * a * b * b).sum(), xs, strict=True),
                AF(T).hvp(lambda a, b: (a * a * b * b).sum(), xs, xs, strict=True))
    check(run(jitgrad), run(torch))


def _sq(a):
    return a * a


ERRORS = {
    "inputs-list": lambda T: lambda: AF(T).vjp(_sq, [_x(T)], _x(T)),
    "inputs-int-in-tuple": lambda T: lambda: AF(T).jvp(_sq, (_x(T), 3), (_x(T), _x(T))),
    "inputs-jacobian": lambda T: lambda: AF(T).jacobian(_sq, [_x(T)]),
    "inputs-hessian": lambda T: lambda: AF(T).hessian(lambda a: a.sum(), 1.5),
    "inputs-vhp": lambda T: lambda: AF(T).vhp(lambda a: a.sum(), [_x(T)], _x(T)),
    "outputs-list": lambda T: lambda: AF(T).vjp(lambda a: [a * a], _x(T), _x(T)),
    "outputs-jacobian": lambda T: lambda: AF(T).jacobian(lambda a: [a * a], _x(T)),
    "outputs-jacfwd": lambda T: lambda: AF(T).jacobian(lambda a: [a * a], _x(T), vectorize=True,
                                                       strategy="forward-mode"),
    "v-not-tensor": lambda T: lambda: AF(T).vjp(_sq, _x(T), [1.0, 2.0, 3.0]),
    "v-length": lambda T: lambda: AF(T).vjp(lambda a: (a, a), _x(T), (_x(T),)),
    "v-single-length": lambda T: lambda: AF(T).jvp(_sq, _x(T), (_x(T), _x(T))),
    "v-size": lambda T: lambda: AF(T).jvp(_sq, _x(T), _x(T, 4)),
    "v-size-tuple": lambda T: lambda: AF(T).vjp(lambda a, b: (a, b), (_x(T), _x(T)), (_x(T), _x(T, 2))),
    "v-none-vjp": lambda T: lambda: AF(T).vjp(_sq, _x(T)),
    "v-none-jvp": lambda T: lambda: AF(T).jvp(_sq, _x(T)),
    "v-none-vhp": lambda T: lambda: AF(T).vhp(lambda a: a.sum(), _x(T)),
    "v-none-hvp": lambda T: lambda: AF(T).hvp(lambda a: a.sum(), (_x(T, 1), _x(T, 1))),
    "strategy": lambda T: lambda: AF(T).jacobian(_sq, _x(T), strategy="forward"),
    "hessian-strategy": lambda T: lambda: AF(T).hessian(lambda a: a.sum(), _x(T), outer_jacobian_strategy="fwd"),
    "forward-create-graph": lambda T: lambda: AF(T).jacobian(_sq, _x(T), create_graph=True, vectorize=True,
                                                             strategy="forward-mode"),
    "forward-strict": lambda T: lambda: AF(T).jacobian(_sq, _x(T), strict=True, vectorize=True,
                                                       strategy="forward-mode"),
    "forward-not-vectorized": lambda T: lambda: AF(T).jacobian(_sq, _x(T), strategy="forward-mode"),
    "hessian-forward-not-vectorized": lambda T: lambda: AF(T).hessian(lambda a: a.sum(), _x(T),
                                                                      outer_jacobian_strategy="forward-mode"),
    "vectorize-strict": lambda T: lambda: AF(T).jacobian(_sq, _x(T), strict=True, vectorize=True),
    "hessian-not-scalar": lambda T: lambda: AF(T).hessian(_sq, _x(T)),
    "hessian-tuple": lambda T: lambda: AF(T).hessian(lambda a: (a.sum(),), _x(T)),
    "vhp-not-scalar": lambda T: lambda: AF(T).vhp(_sq, _x(T), _x(T)),
    "hvp-tuple": lambda T: lambda: AF(T).hvp(lambda a: (a.sum(), a.sum()), _x(T), _x(T)),
}


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_errors_match_torch(name):
    _errors_match(ERRORS[name])


def test_vectorized_jacobian_through_a_hooked_graph():
    """A tensor hook makes the sweep hand rows back to Python: the batch then goes one
    grad() per row, with the same answer."""
    def run(T):
        x = tens(T, arrays(31, 1, (3,)))[0]

        def f(v):
            h = v.sin() * v
            h.register_hook(lambda g: g * 2)
            return (h * v).tanh()
        return AF(T).jacobian(f, x, vectorize=True)
    check(run(jitgrad), run(torch))
