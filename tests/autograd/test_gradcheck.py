"""gradcheck and gradgradcheck (jitgrad.autograd.gradcheck).

gradcheck passes, in slow and in fast mode, on every primitive of the op table (the
input cases of tests/ops/test_kernels_vs_rules.py, which has one per primitive), and
gradgradcheck on every one of them too (each backward rule is differentiable). The
failures and options are run side by side with torch.autograd.gradcheck on the same
functions (``T`` is jitgrad or torch): same result, same exception type, same message.
"""
import importlib
import warnings

import numpy as np
import pytest
from conftest import LIBS, err
from ops.test_kernels_vs_rules import CASES

import jitgrad as J
from jitgrad.autograd.gradcheck import GradcheckError
from jitgrad.graph.spec import REGISTRY

torch = pytest.importorskip("torch")

# cases of their own: casts run in Python (no kernel case), and embedding's options that
# make its gradient differ from the derivative on purpose (padding_idx, scale_grad_by_freq)
# are left to test_embedding_options_fail_as_in_torch
OWN_CASES = {
    "to_copy": (lambda: (J.tensor([[0.7, 1.3], [1.1, 0.6]], dtype=J.float64, requires_grad=True),),
                lambda a: a.float()),
    "embedding": (lambda: (J.tensor(np.linspace(0.5, 1.5, 15).reshape(5, 3), dtype=J.float64, requires_grad=True),),
                  lambda w: J.nn.functional.embedding(J.tensor([[4, 1, 4], [0, 2, 1]]), w)),
}
if J.cuda.is_available():  # a GPU, or the simulator (CI); without one to_device has nowhere to go
    OWN_CASES["to_device"] = (lambda: (J.tensor([[0.7, 1.3], [1.1, 0.6]], dtype=J.float64, requires_grad=True),),
                              lambda a: (a.cuda() * 2.0).cpu())
GRADCHECK_CASES = {**CASES, **OWN_CASES}
# a float32 output loses the finite difference at eps=1e-6: torch needs the same wider eps
EPS = {"to_copy": 1e-3}


def gc_module(T):
    return importlib.import_module(T.__name__ + ".autograd.gradcheck")


def test_every_primitive_has_a_case():
    primitives = {name for name, spec in REGISTRY.items() if spec.kind != "sink"}
    missing = primitives - set(GRADCHECK_CASES) - (set() if J.cuda.is_available() else {"to_device"})
    assert not missing, f"add a gradcheck case for: {sorted(missing)}"


def _case(name):
    make, fn = GRADCHECK_CASES[name]
    ins = make()
    out = fn(*ins)
    assert out.grad_fn is not None and out.grad_fn._spec.name == name, out.grad_fn  # the case runs its primitive
    return fn, ins


@pytest.mark.parametrize("fast_mode", [False, True], ids=["slow", "fast"])
@pytest.mark.parametrize("name", sorted(GRADCHECK_CASES))
def test_gradcheck_passes_on_every_primitive(name, fast_mode):
    fn, ins = _case(name)
    assert J.autograd.gradcheck(fn, ins, eps=EPS.get(name, 1e-6), fast_mode=fast_mode) is True


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradgradcheck_passes_on_every_primitive(name):
    fn, ins = _case(name)
    assert J.autograd.gradgradcheck(fn, ins) is True


def _has_forward_formula(name):
    spec = REGISTRY[name]
    return spec.kind == "ew" or spec.jvp is not None


@pytest.mark.parametrize("name", sorted(n for n in GRADCHECK_CASES if _has_forward_formula(n)))
def test_gradcheck_forward_ad_on_primitives_with_a_jvp(name):
    fn, ins = _case(name)
    assert J.autograd.gradcheck(fn, ins, eps=EPS.get(name, 1e-6), check_forward_ad=True) is True
    assert J.autograd.gradcheck(fn, ins, eps=EPS.get(name, 1e-6), check_forward_ad=True, check_backward_ad=False,
                                fast_mode=True) is True


def test_gradcheck_names():
    assert J.autograd.gradcheck is gc_module(J).gradcheck and callable(J.autograd.gradcheck)
    assert J.autograd.gradgradcheck is gc_module(J).gradgradcheck
    assert issubclass(GradcheckError, RuntimeError)


# ------------------------------------------------------------ failures, side by side with torch

def wrong_square(T):
    """x * x whose backward forgets the factor 2."""
    class WrongSquare(T.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * x

    return WrongSquare


def run_both(run):
    """run(T) with torch and jitgrad: (result or exception) of each."""
    out = {}
    for T in (torch, J):
        try:
            out[T] = ("ok", run(T))
        except Exception as e:  # noqa: BLE001
            out[T] = ("raised", e)
    return out[J], out[torch]


def same_failure(run):
    (jk, j), (tk, t) = run_both(run)
    assert tk == "raised", f"torch did not raise: {t!r}"
    assert jk == "raised", f"jitgrad did not raise: {j!r}"
    assert type(j).__name__ == type(t).__name__, (err(j), err(t))
    assert str(j) == str(t), f"\njitgrad: {str(j)!r}\ntorch:   {str(t)!r}"
    return j, t


X = np.array([[0.5, 1.25, 2.0], [1.5, 0.75, 0.3]])  # positive: every Jacobian entry has one sign


def x64(T, a=X):
    return T.tensor(a, dtype=T.float64, requires_grad=True)


def test_wrong_function_message_as_torch():
    j, _ = same_failure(lambda T: T.autograd.gradcheck(wrong_square(T).apply, (x64(T),)))
    assert isinstance(j, GradcheckError)
    assert str(j).startswith("Jacobian mismatch for output 0 with respect to input 0,\nnumerical:tensor([[1.0000,")


@LIBS
def test_wrong_function_returns_false_without_raising(T):
    assert T.autograd.gradcheck(wrong_square(T).apply, (x64(T),), raise_exception=False) is False
    assert T.autograd.gradcheck(wrong_square(T).apply, (x64(T),), raise_exception=False, fast_mode=True) is False
    assert T.autograd.gradgradcheck(detached_cube(T).apply, (x64(T),), raise_exception=False) is False


def test_wrong_function_fast_mode_message_as_torch():
    """The random vectors differ (each library draws its own), so v^T J u differs; the
    slow-mode recomputation that follows is the same text."""
    (_, j), (_, t) = run_both(lambda T: T.autograd.gradcheck(wrong_square(T).apply, (x64(T),), fast_mode=True))
    assert type(j) is GradcheckError and type(t).__name__ == "GradcheckError"
    head_j, tail_j = str(j).split("\n\nThe above quantities", 1)
    head_t, tail_t = str(t).split("\n\nThe above quantities", 1)
    assert tail_j == tail_t
    for head in (head_j, head_t):
        lines = head.split("\n")
        assert lines[0] == "Jacobian mismatch for output 0 with respect to input 0,"
        n, a = float(lines[1][len("numerical:"):]), float(lines[2][len("analytical:"):])
        assert n == pytest.approx(2 * a, rel=1e-6)  # the backward forgets the factor 2


def wrong_second_output(T):
    """Two inputs, two outputs; only d out1 / d in1 is wrong."""
    class TwoByTwo(T.autograd.Function):
        @staticmethod
        def forward(ctx, a, b):
            ctx.save_for_backward(a, b)
            return a * b, b.exp()

        @staticmethod
        def backward(ctx, g0, g1):
            a, b = ctx.saved_tensors
            return g0 * b, g0 * a + g1 * b.exp() * 0.5

    return TwoByTwo


@pytest.mark.parametrize("fast_mode", [False, True], ids=["slow", "fast"])
def test_mismatch_names_the_output_and_input(fast_mode):
    def run(T):
        a, b = x64(T, X[0]), x64(T, X[1])
        return T.autograd.gradcheck(wrong_second_output(T).apply, (a, b), fast_mode=fast_mode)
    if not fast_mode:
        same_failure(run)
    else:
        (_, j), (_, t) = run_both(run)
        assert str(j).split("\n")[0] == str(t).split("\n")[0] == \
            "Jacobian mismatch for output 1 with respect to input 1,"
        assert str(j).split("Below, we recompute")[1] == str(t).split("Below, we recompute")[1]


def detached_cube(T):
    class Cube(T.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * 3 * x.detach() ** 2  # right first derivative, but its own derivative in x is lost
    return Cube


def test_gradgradcheck_catches_a_backward_that_is_not_differentiable_as_torch():
    def run(T):
        g = T.tensor(np.full((2, 3), 0.5), dtype=T.float64, requires_grad=True)
        return T.autograd.gradgradcheck(detached_cube(T).apply, (x64(T),), (g,))
    same_failure(run)


def test_embedding_options_fail_as_in_torch():
    """padding_idx and scale_grad_by_freq give a gradient that is not the derivative: torch's
    gradcheck fails on them, and so does jitgrad's, with the same message."""
    w = np.linspace(0.5, 1.5, 15).reshape(5, 3)

    def run(T, **kw):
        idx = T.tensor([[4, 1, 4], [0, 2, 1]])
        F = importlib.import_module(T.__name__ + ".nn.functional")
        return T.autograd.gradcheck(lambda w: F.embedding(idx, w, **kw), (x64(T, w),))
    same_failure(lambda T: run(T, padding_idx=0))
    same_failure(lambda T: run(T, scale_grad_by_freq=True))


# ----------------------------------------------------------------------- options and checks

@LIBS
def test_float32_input_warns(T):
    x = T.tensor(X, dtype=T.float32, requires_grad=True)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert T.autograd.gradcheck(lambda x: x.exp(), (x,), eps=1e-3, atol=1e-2, rtol=1e-2)
    msgs = [str(m.message) for m in w if m.category is UserWarning]
    assert msgs == ["Input #0 requires gradient and is not a double precision floating point or complex. This "
                    "check will likely fail if all the inputs are not of double precision floating point or complex. "]


@LIBS
def test_float32_at_the_default_eps_fails(T):
    x = T.tensor(X, dtype=T.float32, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert T.autograd.gradcheck(lambda x: x.exp(), (x,), raise_exception=False) is False


@LIBS
def test_non_tensor_int_and_no_grad_inputs(T):
    """Only the float tensors that require grad are checked; the others are passed as they are."""
    x = x64(T)
    y = T.tensor(X + 1.0, dtype=T.float64)  # requires no grad
    idx = T.tensor([0, 1, 1])
    assert T.autograd.gradcheck(lambda x, n, y, i: (x * y)[:, i] * n, (x, 3.0, y, idx))
    assert T.autograd.gradgradcheck(lambda x, n, y, i: (x * y * x)[:, i] * n, (x, 3.0, y, idx))


@LIBS
def test_several_inputs_and_outputs(T):
    a, b = x64(T), x64(T, X[::-1].copy())
    assert T.autograd.gradcheck(lambda a, b: (a * b, (a / b).sum(0), a.sin()), (a, b))
    assert T.autograd.gradcheck(lambda a, b: (a * b, (a / b).sum(0), a.sin()), (a, b), fast_mode=True)
    assert T.autograd.gradgradcheck(lambda a, b: (a * b, (a / b).sum(0)), (a, b), gen_non_contig_grad_outputs=True)


@LIBS
def test_outputs_that_do_not_require_grad(T):
    x = x64(T)
    # an integer output and a detached one are not checked
    assert T.autograd.gradcheck(lambda x: (x.exp(), x.argmax(), x.detach() * 2), (x,))
    # no differentiable output: passes when moving the input moves no output
    assert T.autograd.gradcheck(lambda x: (x > 1.0).double(), (x,))
    assert T.autograd.gradcheck(lambda x: (x > 1.0).double(), (x,), fast_mode=True)


def test_no_differentiable_output_that_moves_fails_as_torch():
    same_failure(lambda T: T.autograd.gradcheck(lambda x: x.detach() * 2, (x64(T),)))
    same_failure(lambda T: T.autograd.gradcheck(lambda x: x.detach() * 2, (x64(T),), fast_mode=True))


def test_input_errors_as_torch():
    same_failure(lambda T: T.autograd.gradcheck(lambda x: x * 2, (T.tensor(X, dtype=T.float64),)))
    same_failure(lambda T: T.autograd.gradcheck(
        lambda x: x * 2, (T.tensor([1.0, 2.0], dtype=T.float64, requires_grad=True).expand(3, 2),)))


def test_output_shape_changing_under_perturbation_as_torch():
    def f(x):
        return x[:2] if x[0] > 1.0 else x  # at x[0] == 1 the two sides differ in shape

    same_failure(lambda T: T.autograd.gradcheck(f, (T.tensor([1.0, 2.0, 3.0], dtype=T.float64,
                                                             requires_grad=True),)))


@pytest.mark.parametrize("kw", [dict(check_forward_ad=False, check_backward_ad=False),
                                dict(check_batched_grad=True, check_backward_ad=False, check_forward_ad=True),
                                dict(check_batched_forward_grad=True)], ids=str)
def test_option_assertions_as_torch(kw):
    same_failure(lambda T: T.autograd.gradcheck(lambda x: x * 2, (x64(T),), **kw))


@pytest.mark.parametrize("kw", [dict(check_fwd_over_rev=False, check_rev_over_rev=False),
                                dict(check_rev_over_rev=False, check_fwd_over_rev=True),
                                dict(check_rev_over_rev=False, check_fwd_over_rev=True, check_undefined_grad=False,
                                     check_batched_grad=True)], ids=str)
def test_gradgradcheck_option_assertions_as_torch(kw):
    same_failure(lambda T: T.autograd.gradgradcheck(lambda x: x * 2, (x64(T),), **kw))


def nondeterministic(T):
    class Noisy(T.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x.exp()

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * (x.exp() + T.rand(x.shape, dtype=x.dtype) * 1e-9)

    return Noisy


def test_nondet_tol_as_torch():
    same_failure(lambda T: T.autograd.gradcheck(nondeterministic(T).apply, (x64(T),)))
    for T in (torch, J):
        assert T.autograd.gradcheck(nondeterministic(T).apply, (x64(T),), nondet_tol=1e-7)
        assert T.autograd.gradcheck(nondeterministic(T).apply, (x64(T),), nondet_tol=1e-7, fast_mode=True)


def ignores_grad_output(T):
    class Stubborn(T.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            if float(g.abs().sum()) != 0:
                return g * 2 * x
            return T.ones_like(x)  # not zero for a zero grad_output

    return Stubborn


def test_backward_not_multiplied_by_grad_output_as_torch():
    same_failure(lambda T: T.autograd.gradcheck(ignores_grad_output(T).apply, (x64(T),)))
    same_failure(lambda T: T.autograd.gradcheck(ignores_grad_output(T).apply, (x64(T),), masked=True))


def undefined_grad_unsafe(T):
    """Two outputs; backward fails when one gradient is undefined and the other is zero
    (what check_undefined_grad feeds it, output by output)."""
    class Pair(T.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.set_materialize_grads(False)
            ctx.save_for_backward(x)
            return x * 2, x * x

        @staticmethod
        def backward(ctx, g0, g1):
            (x,) = ctx.saved_tensors
            defined = [g for g in (g0, g1) if g is not None]
            if len(defined) == 1 and float(defined[0].abs().sum()) == 0:
                raise RuntimeError("undefined gradient")
            if not defined:
                return None
            return (g0 * 2 if g0 is not None else 0) + (g1 * 2 * x if g1 is not None else 0)

    return Pair


def test_check_undefined_grad_as_torch():
    """torch runs a node whose output gradients are all undefined (the first case it
    checks); jitgrad's engine runs no node that receives no gradient, so for jitgrad that
    case holds by construction, and the one-undefined-at-a-time cases are what it checks."""
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        j, _ = same_failure(lambda T: T.autograd.gradcheck(undefined_grad_unsafe(T).apply, (x64(T),)))
    assert isinstance(j.__cause__, RuntimeError) and str(j.__cause__) == "undefined gradient"
    assert sum("Backwards compatibility: New undefined gradient support" in str(m.message) for m in w) == 2
    for T in (torch, J):
        assert T.autograd.gradcheck(undefined_grad_unsafe(T).apply, (x64(T),), check_undefined_grad=False)


@LIBS
def test_check_batched_grad(T):
    a, b = x64(T), x64(T, X.T.copy())
    assert T.autograd.gradcheck(lambda a, b: (a @ b).tanh(), (a, b), check_batched_grad=True)
    assert T.autograd.gradgradcheck(lambda a, b: (a @ b).tanh(), (a, b), check_batched_grad=True)


@LIBS
def test_check_forward_ad(T):
    x = x64(T)
    assert T.autograd.gradcheck(lambda x: x.exp() * x.sin() + x, (x,), check_forward_ad=True)
    assert T.autograd.gradcheck(lambda x: x.exp() * x.sin() + x, (x,), check_forward_ad=True, fast_mode=True)
    assert T.autograd.gradcheck(lambda x: (x.exp(), x * x), (x,), check_forward_ad=True, check_backward_ad=False)


def wrong_jvp(T):
    class WrongJvp(T.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_forward(x)
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * 2 * x

        @staticmethod
        def jvp(ctx, t):
            (x,) = ctx.saved_tensors
            return t * x  # forgets the factor 2

    return WrongJvp


def test_wrong_jvp_message_as_torch():
    j, _ = same_failure(lambda T: T.autograd.gradcheck(wrong_jvp(T).apply, (x64(T),), check_forward_ad=True))
    assert str(j).startswith("Jacobian computed with forward mode mismatch for output 0 with respect to input 0,")
    (_, j), (_, t) = run_both(lambda T: T.autograd.gradcheck(wrong_jvp(T).apply, (x64(T),), check_forward_ad=True,
                                                             fast_mode=True))
    assert str(j).split("Below, we recompute")[1] == str(t).split("Below, we recompute")[1]


@LIBS
def test_gradgradcheck_fwd_over_rev(T):
    x = x64(T)
    assert T.autograd.gradgradcheck(lambda x: x.exp() * x.sin(), (x,), check_fwd_over_rev=True)
    assert T.autograd.gradgradcheck(lambda x: x.exp() * x.sin(), (x,), check_fwd_over_rev=True,
                                    check_rev_over_rev=False, check_undefined_grad=False)


@pytest.mark.parametrize("f", [lambda T, x: x.exp(), lambda T, x: (x.sin() * x.sum(), x[1:] * x[:-1]),
                               lambda T, x: T.linalg.vector_norm(x) * T.hypot(x, x.cos())])
def test_check_batched_forward_grad_as_torch(f):
    """torch vmaps the JVP over a batch of tangents and holds it to one JVP per tangent."""
    for T in (J, torch):
        assert T.autograd.gradcheck(lambda x: f(T, x), (x64(T),), check_forward_ad=True,
                                    check_batched_forward_grad=True)


@LIBS
def test_input_is_left_as_it_was(T):
    x = x64(T)
    version = x._version
    T.autograd.gradcheck(lambda x: x.exp(), (x,))
    T.autograd.gradcheck(lambda x: x.exp(), (x,), fast_mode=True)
    np.testing.assert_array_equal(x.detach().numpy(), X)
    assert x._version == version and x.grad is None
