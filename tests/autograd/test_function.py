"""Custom autograd Functions, part 1: ``apply``, the graph API, ``setup_context``, the ctx API,
inputs and outputs.  (Part 2, test_function_backward.py: once_differentiable, create_graph,
errors, exceptions, mixing with ops, reference cycles, retain_graph.)

Every test runs the same code with both libraries (``T`` is ``jitgrad`` or ``torch``) and
compares the results, or asserts a literal expectation in a test parametrized over both
libraries, so real PyTorch 2.13 validates each expectation.  The Function classes are
defined inside factories taking ``T``: each library gets its own classes with the same
names (the node names, ``<ClassName>Backward``, are part of what is compared).
"""

import numpy as np
import pytest
from conftest import LIBS, both, capture, exp_square, fn_module, grad_desc, mk, to_np

torch = pytest.importorskip("torch")



# ----------------------------------------------------------------------------- 1. basics

@LIBS
def test_function_is_exported(T):
    mod = fn_module(T)
    assert mod.Function is T.autograd.Function
    assert callable(mod.once_differentiable)


@pytest.mark.parametrize("shape", [(), (3,), (2, 3)], ids=["0d", "1d", "2d"])
def test_apply_values_and_backward(shape):
    rng = np.random.default_rng(len(shape))
    xa = rng.uniform(-1.0, 1.0, size=shape)
    wa = rng.uniform(-1.0, 1.0, size=shape)

    def run(T):
        MyExp, Square = exp_square(T)
        x = mk(T, xa, rg=True)
        y = MyExp.apply(x)
        z = Square.apply(y)
        loss = (z * mk(T, wa)).sum()
        loss.backward()
        return dict(y=y, z=z, loss=loss, grad=x.grad, y_rg=y.requires_grad, z_rg=z.requires_grad,
                    y_leaf=y.is_leaf, y_shape=tuple(y.shape), is_tensor=isinstance(y, T.Tensor),
                    has_fn=y.grad_fn is not None)

    both(run)


def test_apply_via_autograd_grad():
    xa = np.array([0.3, -0.7, 1.1])
    va = np.array([1.0, -2.0, 0.5])

    def run(T):
        MyExp, Square = exp_square(T)
        x = mk(T, xa, rg=True)
        (g1,) = T.autograd.grad(MyExp.apply(x).sum(), x)
        (g2,) = T.autograd.grad(Square.apply(x), x, grad_outputs=mk(T, va))
        g3 = T.autograd.grad(Square.apply(MyExp.apply(x)).sum(), [x])
        return dict(g1=g1, g2=g2, g3=g3, g1_rg=g1.requires_grad, dot_grad_none=x.grad is None)

    both(run)


def test_grad_mode_inside_forward_and_backward():
    def run(T):
        seen = {}

        class Probe(T.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                seen["fwd_enabled"] = T.is_grad_enabled()
                z = x * 2
                seen["fwd_inner_rg"] = z.requires_grad
                seen["fwd_inner_fn"] = z.grad_fn is None
                ctx.save_for_backward(x)
                return z

            @staticmethod
            def backward(ctx, grad):
                seen.setdefault("bwd_enabled", []).append(T.is_grad_enabled())
                seen.setdefault("bwd_grad_rg", []).append(grad.requires_grad)
                (x,) = ctx.saved_tensors
                return grad * 2 * x

        x = mk(T, [1.0, 2.0], rg=True)
        Probe.apply(x).sum().backward()
        (g,) = T.autograd.grad(Probe.apply(x).sum(), x, create_graph=True)
        seen["cg_grad_rg"] = g.requires_grad
        seen["x_grad"] = x.grad
        seen["g"] = g
        return seen

    both(run)


def test_no_input_requires_grad_or_no_grad_mode():
    def run(T):
        MyExp, _ = exp_square(T)
        out = {}
        y = MyExp.apply(mk(T, [1.0, 2.0]))
        out["const"] = (y.requires_grad, y.grad_fn is None, y.is_leaf)
        x = mk(T, [1.0, 2.0], rg=True)
        with T.no_grad():
            z = MyExp.apply(x)
        out["no_grad"] = (z.requires_grad, z.grad_fn is None, z.is_leaf)
        out["values"] = (y, z)
        return out

    both(run)


def test_apply_keyword_arguments_bind_to_forward_parameters():
    def run(T):
        seen = []

        class Scale(T.autograd.Function):
            @staticmethod
            def forward(ctx, x, k=2.0):
                seen.append(ctx.needs_input_grad)
                ctx.k = k
                return x * k

            @staticmethod
            def backward(ctx, grad):
                return grad * ctx.k, None   # a trailing None beyond the inputs is accepted

        x = mk(T, [1.0, -2.0], rg=True)
        a = Scale.apply(x)
        b = Scale.apply(x, k=3.0)
        c = Scale.apply(x, 4.0)
        (a + b + c).sum().backward()
        return dict(a=a, b=b, c=c, grad=x.grad, nig=seen)

    both(run)


def test_trailing_none_gradients_beyond_inputs_are_accepted():
    def run(T):
        class Extra(T.autograd.Function):
            @staticmethod
            def forward(ctx, x, y):
                return x * y

            @staticmethod
            def backward(ctx, grad):
                return grad * 2, grad * 3, None, None

        x = mk(T, [1.0, 2.0], rg=True)
        y = mk(T, [3.0, 4.0], rg=True)
        Extra.apply(x, y).sum().backward()
        return x.grad, y.grad

    both(run)


# ----------------------------------------------------------------------------- 2. graph API

def test_node_names():
    def run(T):
        MyExp, Square = exp_square(T)
        x = mk(T, [1.0, 2.0], rg=True)
        y = MyExp.apply(x)
        z = Square.apply(y)
        return dict(type_y=type(y.grad_fn).__name__, name_y=y.grad_fn.name(),
                    type_z=type(z.grad_fn).__name__, name_z=z.grad_fn.name(),
                    is_node=isinstance(y.grad_fn, T.autograd.graph.Node),
                    same_class=type(MyExp.apply(x).grad_fn) is type(y.grad_fn),
                    repr_has_name="MyExpBackward" in repr(y))

    j, t = both(run)
    assert j["type_y"] == "MyExpBackward"
    assert j["name_z"] == "SquareBackward"


def describe(fn, named):
    """Structure of the graph under fn: names, input indices, leaves identified by object."""
    if fn is None:
        return None
    tname = type(fn).__name__
    if tname == "AccumulateGrad":
        return ("AccumulateGrad", tuple(k for k, v in named.items() if v is fn.variable))
    return (tname, fn.name(), tuple((describe(n, named), i) for n, i in fn.next_functions))


def test_next_functions_structure():
    def run(T):
        class Lin(T.autograd.Function):
            @staticmethod
            def forward(ctx, x, c, k, w):
                return x * c * k + w

            @staticmethod
            def backward(ctx, grad):
                return grad, None, None, grad

        class Two(T.autograd.Function):
            @staticmethod
            def forward(ctx, x, y):
                return x * y, x + y

            @staticmethod
            def backward(ctx, ga, gb):
                return ga + gb, ga + gb

        x = mk(T, [1.0, 2.0], rg=True)
        w = mk(T, [0.5, 0.5], rg=True)
        c = mk(T, [3.0, 4.0])
        named = dict(x=x, w=w, c=c)
        out = {}
        y = Lin.apply(x, c, 3, w * 2)            # non-tensor arg: no edge; constant: (None, 0)
        out["lin"] = describe(y.grad_fn, named)
        out["lin_len"] = len(y.grad_fn.next_functions)
        out["lin_none"] = y.grad_fn.next_functions[1] == (None, 0)
        out["lin_acc_var"] = y.grad_fn.next_functions[0][0].variable is x
        h = w * 2
        y2 = Lin.apply(x, c, 3, h)
        out["nonleaf_identity"] = y2.grad_fn.next_functions[2][0] is h.grad_fn
        a, b = Two.apply(x, c)
        out["two_same_node"] = a.grad_fn is b.grad_fn
        out["output_nr"] = (a.output_nr, b.output_nr)
        (u, _) = Two.apply(a, b)
        nf = u.grad_fn.next_functions
        out["consumer"] = describe(u.grad_fn, named)
        out["consumer_identity"] = (nf[0][0] is a.grad_fn, nf[1][0] is a.grad_fn, nf[0][1], nf[1][1])
        v = (u * 2).sum()
        out["downstream"] = describe(v.grad_fn, named)
        out["down_identity"] = v.grad_fn.next_functions[0][0].next_functions[0][0] is u.grad_fn
        out["acc_shared"] = (y.grad_fn.next_functions[0][0] is a.grad_fn.next_functions[0][0])
        return out

    both(run)


# ----------------------------------------------------------------------------- 3. setup_context

def test_setup_context_style():
    def run(T):
        seen = {}

        class SC(T.autograd.Function):
            @staticmethod
            def forward(x, k):
                seen["fwd_args"] = (type(x).__name__, k)
                return x * x * k

            @staticmethod
            def setup_context(ctx, inputs, output):
                x, k = inputs
                seen["inputs_is_tuple"] = isinstance(inputs, tuple)
                seen["output_is_tensor"] = isinstance(output, T.Tensor)
                seen["output_vals"] = to_np(output).tolist()
                ctx.k = k
                ctx.save_for_backward(x)

            @staticmethod
            def backward(ctx, grad):
                (x,) = ctx.saved_tensors
                return grad * 2 * x * ctx.k, None

        x = mk(T, [1.0, -2.0], rg=True)
        y = SC.apply(x, 3.0)
        y.sum().backward()
        (g,) = T.autograd.grad(SC.apply(x, 0.5).sum(), x)
        seen.update(y=y, grad=x.grad, g=g, name=type(y.grad_fn).__name__, name2=y.grad_fn.name())
        return seen

    both(run)


def test_setup_context_multiple_outputs_and_defaults():
    def run(T):
        seen = {}

        class SC2(T.autograd.Function):
            @staticmethod
            def forward(x, k=2.0):
                return x * k, x.exp()

            @staticmethod
            def setup_context(ctx, inputs, output):
                seen["n_inputs"] = len(inputs)
                seen["k"] = inputs[1]
                seen["output_is_tuple"] = isinstance(output, tuple) and len(output) == 2
                ctx.k = inputs[1]
                ctx.save_for_backward(output[1])

            @staticmethod
            def backward(ctx, ga, gb):
                (e,) = ctx.saved_tensors
                return ga * ctx.k + gb * e, None

        x = mk(T, [0.5, -1.0], rg=True)
        a, b = SC2.apply(x)
        (a.sin() + b * b).sum().backward()
        seen.update(a=a, b=b, grad=x.grad)
        return seen

    both(run)


# ----------------------------------------------------------------------------- 4. ctx API

def test_save_for_backward_and_saved_tensors():
    def run(T):
        seen = {}

        class Saver(T.autograd.Function):
            @staticmethod
            def forward(ctx, x, c):
                y = x.exp()
                ctx.save_for_backward(x, None, y, c)
                return y

            @staticmethod
            def backward(ctx, grad):
                s = ctx.saved_tensors
                seen["type"] = type(s).__name__
                seen["n"] = len(s)
                seen["vals"] = [grad_desc(v) for v in s]
                seen["none_kept"] = s[1] is None
                seen["rg"] = [None if v is None else v.requires_grad for v in s]
                x, _, y, c = s
                return grad * y * c, None

        x = mk(T, [0.1, 0.2], rg=True)
        c = mk(T, [2.0, 3.0])
        y = Saver.apply(x, c)
        y.sum().backward()
        seen["grad"] = x.grad
        return seen

    both(run)


def test_needs_input_grad():
    def run(T):
        seen = []

        class Many(T.autograd.Function):
            @staticmethod
            def forward(ctx, x, k, c, s, n, z, f):
                seen.append(("fwd", type(ctx.needs_input_grad).__name__, ctx.needs_input_grad))
                return x * k * c + z * f

            @staticmethod
            def backward(ctx, grad):
                seen.append(("bwd", ctx.needs_input_grad))
                nig = ctx.needs_input_grad
                gx = grad * 3 if nig[0] else None
                gz = grad * 2 if nig[5] else None
                return gx, None, None, None, None, gz, None

        x = mk(T, [1.0, 2.0], rg=True)
        c = mk(T, [3.0, 4.0])
        z = mk(T, [5.0, 6.0], rg=True) * 1.0     # a non-leaf that requires grad
        Many.apply(x, 3, c, "s", None, z, 2.0).sum().backward()
        Many.apply(c, 3, x, "s", None, c, 2.0)    # only a tensor not at index 0 requires grad
        Many.apply(c, 3, c, "s", None, c, 2.0)    # nothing requires grad
        return dict(seen=seen, grad=x.grad)

    j, t = both(run)
    assert j["seen"][0] == ("fwd", "tuple", (True, False, False, False, False, True, False))


@pytest.mark.parametrize("materialize", [True, False])
@pytest.mark.parametrize("loss", ["first", "both"])
def test_mark_non_differentiable(materialize, loss):
    def run(T):
        seen = []

        class WithIndex(T.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                ctx.set_materialize_grads(materialize)
                idx = (x * 10).clone()
                ctx.mark_non_differentiable(idx)
                ctx.save_for_backward(x)
                return x * x, idx

            @staticmethod
            def backward(ctx, ga, gi):
                seen.append((grad_desc(ga), grad_desc(gi)))
                (x,) = ctx.saved_tensors
                return ga * 2 * x

        x = mk(T, [1.0, -2.0, 3.0], rg=True)
        a, idx = WithIndex.apply(x)
        out = (a.sum() if loss == "first" else (a * idx).sum())
        out.backward()
        return dict(seen=seen, idx=idx, a=a, grad=x.grad, idx_rg=idx.requires_grad,
                    idx_fn=idx.grad_fn is None, idx_leaf=idx.is_leaf, a_rg=a.requires_grad)

    j, t = both(run)
    assert j["idx_rg"] is False


@pytest.mark.parametrize("materialize", [True, False])
@pytest.mark.parametrize("used", ["first", "second"])
def test_set_materialize_grads(materialize, used):
    def run(T):
        seen = []

        class Two(T.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                if not materialize:
                    ctx.set_materialize_grads(False)
                return x * 2, x * 3

            @staticmethod
            def backward(ctx, g1, g2):
                seen.append((grad_desc(g1), grad_desc(g2)))
                r = None
                if g1 is not None:
                    r = g1 * 2
                if g2 is not None:
                    r = g2 * 3 if r is None else r + g2 * 3
                return r

        x = mk(T, [1.0, 2.0], rg=True)
        a, b = Two.apply(x)
        ((a if used == "first" else b) * mk(T, [1.0, -1.0])).sum().backward()
        a, b = Two.apply(x)
        (g,) = T.autograd.grad((a if used == "first" else b).sum(), x)
        return dict(seen=seen, grad=x.grad, g=g)

    both(run)


def test_ctx_arbitrary_attributes():
    def run(T):
        seen = {}

        class Attrs(T.autograd.Function):
            @staticmethod
            def forward(ctx, x, k):
                ctx.k = k
                ctx.label = "scale"
                ctx.shape = tuple(x.shape)
                ctx.items = [1, 2]
                ctx.x = x
                return x * k

            @staticmethod
            def backward(ctx, grad):
                seen["attrs"] = (ctx.k, ctx.label, ctx.shape, ctx.items)
                seen["x"] = ctx.x
                return grad * ctx.k + ctx.x * 0, None

        x = mk(T, [1.0, 2.0], rg=True)
        Attrs.apply(x, 3).sum().backward()
        seen["grad"] = x.grad
        return seen

    both(run)


@pytest.mark.parametrize("method", ["copy_", "mul_"])
def test_mark_dirty_inplace_forward(method):
    def run(T):
        class Double_(T.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                if method == "mul_":
                    x.mul_(2)
                else:
                    x.copy_(x * 2)
                ctx.mark_dirty(x)
                return x

            @staticmethod
            def backward(ctx, grad):
                return grad * 2

        leaf = mk(T, [1.0, -2.0, 3.0], rg=True)
        a = leaf * 1.0
        v0 = a._version
        o = Double_.apply(a)
        out = dict(same_obj=o is a, a=a, o=o, rg=o.requires_grad, name=type(a.grad_fn).__name__,
                   shared_fn=o.grad_fn is a.grad_fn, bumped=a._version > v0, leaf_unchanged=leaf)
        (o * o).sum().backward()
        out["grad"] = leaf.grad
        return out

    both(run)


def test_mark_dirty_on_leaf_requiring_grad_raises():
    def run(T):
        class Double_(T.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                x.copy_(x * 2)
                ctx.mark_dirty(x)
                return x

            @staticmethod
            def backward(ctx, grad):
                return grad * 2

        e = capture(Double_.apply, mk(T, [1.0, 2.0], rg=True))
        return type(e).__name__, (str(e).splitlines() or [""])[0]

    j, t = both(run)
    assert t[0] == "RuntimeError"


def test_forward_returning_an_input_unchanged():
    def run(T):
        class Ident(T.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x

            @staticmethod
            def backward(ctx, grad):
                return grad * 5

        out = {}
        x = mk(T, [1.0, 2.0], rg=True)
        a = x * 1.0
        o = Ident.apply(a)
        out["nonleaf"] = (o is a, type(o.grad_fn).__name__, type(a.grad_fn).__name__)
        o.sum().backward()
        out["grad_nonleaf"] = x.grad
        y = mk(T, [3.0], rg=True)
        p = Ident.apply(y)
        out["leaf"] = (p is y, type(p.grad_fn).__name__, y.is_leaf, y.grad_fn is None)
        (p * 2).sum().backward()
        out["grad_leaf"] = y.grad
        return out

    both(run)


# ----------------------------------------------------------------------------- 5. inputs / outputs

def two_out(T, seen):
    class Pair(T.autograd.Function):
        @staticmethod
        def forward(ctx, x, y):
            ctx.save_for_backward(x, y)
            return x * y, x + y

        @staticmethod
        def backward(ctx, ga, gb):
            seen.append((grad_desc(ga), grad_desc(gb)))
            x, y = ctx.saved_tensors
            return ga * y + gb, ga * x + gb

    return Pair


@pytest.mark.parametrize("loss", ["both", "first", "second"])
def test_multiple_inputs_and_outputs(loss):
    def run(T):
        seen = []
        Pair = two_out(T, seen)
        x = mk(T, [0.5, -1.0, 2.0], rg=True)
        y = mk(T, [1.5, 0.25, -0.75], rg=True)
        a, b = Pair.apply(x, y)
        if loss == "both":
            out = (a.sin() + b * b).sum()
        elif loss == "first":
            out = (a * 2).sum()
        else:
            out = b.exp().sum()
        out.backward()
        gx, gy = T.autograd.grad(Pair.apply(x, y)[0 if loss == "first" else 1].sum(), [x, y])
        return dict(a=a, b=b, seen=seen, xg=x.grad, yg=y.grad, gx=gx, gy=gy,
                    a_rg=a.requires_grad, b_rg=b.requires_grad)

    both(run)


def test_non_tensor_arguments():
    def run(T):
        seen = {}

        class Mixed(T.autograd.Function):
            @staticmethod
            def forward(ctx, x, n, f, none, s):
                seen["types"] = (type(n).__name__, type(f).__name__, none, s)
                ctx.n, ctx.f = n, f
                return x * n * f if s == "mul" else x + n

            @staticmethod
            def backward(ctx, grad):
                return grad * ctx.n * ctx.f, None, None, None, None

        x = mk(T, [1.0, 2.0], rg=True)
        y = Mixed.apply(x, 3, 0.5, None, "mul")
        y.sum().backward()
        (g,) = T.autograd.grad((Mixed.apply(x, 2, 2.0, None, "mul") ** 2).sum(), x)
        seen.update(y=y, grad=x.grad, g=g, nf=len(y.grad_fn.next_functions))
        return seen

    both(run)


def test_backward_returning_none_for_an_input():
    def run(T):
        class HalfGrad(T.autograd.Function):
            @staticmethod
            def forward(ctx, x, y):
                return x * y

            @staticmethod
            def backward(ctx, grad):
                return grad * 2, None

        x = mk(T, [1.0, 2.0], rg=True)
        y = mk(T, [3.0, 4.0], rg=True)
        HalfGrad.apply(x, y).sum().backward()
        out = dict(xg=x.grad, y_none=y.grad is None)
        gx, gy = T.autograd.grad(HalfGrad.apply(x, y).sum(), [x, y], allow_unused=True)
        out.update(gx=gx, gy_none=gy is None)
        out["mat"] = T.autograd.grad(HalfGrad.apply(x, y).sum(), [x, y], materialize_grads=True)
        e = capture(T.autograd.grad, HalfGrad.apply(x, y).sum(), [x, y])
        out["err"] = (type(e).__name__, str(e).split(".")[0])
        return out

    both(run)
