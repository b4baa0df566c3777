"""Custom autograd Functions: ``jitgrad.autograd.Function`` against ``torch.autograd.Function``.

Every test runs the same code with both libraries (``T`` is ``jitgrad`` or ``torch``) and
compares the results, or asserts a literal expectation in a test parametrized over both
libraries, so real PyTorch 2.13 validates each expectation.  The Function classes are
defined inside factories taking ``T``: each library gets its own classes with the same
names (the node names, ``<ClassName>Backward``, are part of what is compared).
"""
import gc
import importlib
import weakref

import numpy as np
import pytest

import jitgrad
from conftest import both, mk, capture, to_np

torch = pytest.importorskip("torch")

LIBS = pytest.mark.parametrize("T", [jitgrad, torch], ids=["jitgrad", "torch"])




def fn_module(T):
    """``T.autograd.function`` (imported: it need not be an attribute of the package)."""
    return importlib.import_module(T.__name__ + ".autograd.function")








def grad_desc(g):
    """A gradient as seen inside backward: None or ('tensor', values)."""
    return None if g is None else ("tensor", to_np(g).tolist())


# ----------------------------------------------------------------------------- factories

def exp_square(T):
    class MyExp(T.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            y = x.exp()
            ctx.save_for_backward(y)
            return y

        @staticmethod
        def backward(ctx, grad):
            (y,) = ctx.saved_tensors
            return grad * y

    class Square(T.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return grad * 2 * x

    return MyExp, Square


def counted_exp(T, name):
    """An Exp Function counting its forward/backward calls on class attributes."""
    def forward(ctx, x):
        cls.fwd += 1
        y = x.exp()
        ctx.save_for_backward(y)
        return y

    def backward(ctx, grad):
        cls.bwd += 1
        (y,) = ctx.saved_tensors
        return grad * y

    cls = type(name, (T.autograd.Function,), {
        "fwd": 0, "bwd": 0,
        "forward": staticmethod(forward), "backward": staticmethod(backward)})
    return cls


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


# ----------------------------------------------------------------------------- 6. once_differentiable

def once_exp(T, seen):
    once_differentiable = fn_module(T).once_differentiable

    class OnceExp(T.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x.exp()

        @staticmethod
        @once_differentiable
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            seen.append((T.is_grad_enabled(), isinstance(grad, T.Tensor), grad.requires_grad))
            return grad * x.exp()

    return OnceExp


def test_once_differentiable_first_order():
    def run(T):
        seen = []
        OnceExp = once_exp(T, seen)
        x = mk(T, [0.5, -1.0], rg=True)
        y = OnceExp.apply(x)
        (y * y).sum().backward()
        (g,) = T.autograd.grad(OnceExp.apply(x * 2).sum(), x)
        return dict(y=y, grad=x.grad, g=g, seen=seen, name=type(y.grad_fn).__name__)

    both(run)


def test_once_differentiable_create_graph_constant_grad_output():
    # the incoming gradient does not require grad: the result is simply not differentiable
    def run(T):
        seen = []
        OnceExp = once_exp(T, seen)
        x = mk(T, [0.5, -1.0], rg=True)
        (g,) = T.autograd.grad(OnceExp.apply(x).sum(), x, create_graph=True)
        return dict(g=g, rg=g.requires_grad, fn_none=g.grad_fn is None, seen=seen)

    both(run)


def test_once_differentiable_double_backward_raises():
    def run(T):
        seen = []
        OnceExp = once_exp(T, seen)
        x = mk(T, [0.5, -1.0], rg=True)
        (g,) = T.autograd.grad((OnceExp.apply(x) ** 2).sum(), x, create_graph=True)
        out = dict(g=g, rg=g.requires_grad, seen=seen)
        e = capture(g.sum().backward)
        out["err"] = (type(e).__name__, str(e))
        out["x_grad_none"] = x.grad is None
        # the engine still works
        y = OnceExp.apply(x)
        (y * 3).sum().backward()
        out["grad_after"] = x.grad
        return out

    j, t = both(run)
    assert t["err"] == ("RuntimeError", "trying to differentiate twice a function that was marked with "
                        "@once_differentiable")


# ----------------------------------------------------------------------------- 7. create_graph

def cube(T):
    class Cube(T.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x * x

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return grad * 3 * x * x

    return Cube


@pytest.mark.parametrize("where", ["direct", "middle"])
def test_create_graph_second_derivative(where):
    xa = np.array([0.7, -1.3, 2.0])
    va = np.array([1.0, 0.5, -2.0])

    def run(T):
        Cube = cube(T)
        x = mk(T, xa, rg=True)
        if where == "direct":
            y = Cube.apply(x).sum()
        else:
            y = (Cube.apply(x.sin()) * x).sum()
        (g,) = T.autograd.grad(y, x, create_graph=True)
        (h,) = T.autograd.grad((g * mk(T, va)).sum(), x)
        return dict(y=y, g=g, h=h, g_rg=g.requires_grad)

    both(run)


def test_create_graph_through_saved_output():
    # MyExp saves its own output: its second derivative goes through MyExpBackward again
    def run(T):
        MyExp, _ = exp_square(T)
        x = mk(T, [0.3, -0.4], rg=True)
        (g,) = T.autograd.grad((MyExp.apply(x) * x).sum(), x, create_graph=True)
        (h,) = T.autograd.grad(g.sum(), x, create_graph=True)
        (k,) = T.autograd.grad(h.sum(), x)
        return dict(g=g, h=h, k=k)

    both(run)


@pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph=True")
def test_backward_create_graph_then_backward_again():
    def run(T):
        Cube = cube(T)
        x = mk(T, [1.5, -0.5], rg=True)
        Cube.apply(x).sum().backward(create_graph=True)
        g = x.grad
        out = dict(g=to_np(g).tolist(), rg=g.requires_grad)
        x.grad = None
        g.sum().backward()
        out["h"] = x.grad
        return out

    both(run)


# ----------------------------------------------------------------------------- 8. errors

def bad_fns(T):
    class TooFew(T.autograd.Function):
        @staticmethod
        def forward(ctx, x, y):
            return x * y

        @staticmethod
        def backward(ctx, grad):
            return grad

    class TooMany(T.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            return grad, grad

    class BadShape(T.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            return mk(T, [1.0, 2.0, 3.0])

    return TooFew, TooMany, BadShape


@pytest.mark.parametrize("via", ["backward", "grad"])
@pytest.mark.parametrize("kind", ["too_few", "too_many", "bad_shape"])
def test_invalid_gradients_from_backward(kind, via):
    def run(T):
        TooFew, TooMany, BadShape = bad_fns(T)
        x = mk(T, [1.0, 2.0], rg=True)
        if kind == "too_few":
            loss = TooFew.apply(x, x * 1.0).sum()
        elif kind == "too_many":
            loss = TooMany.apply(x).sum()
        else:
            loss = BadShape.apply(x).sum()
        if via == "backward":
            e = capture(loss.backward)
        else:
            e = capture(T.autograd.grad, loss, x)
        out = dict(err=(type(e).__name__, str(e)), grad_none=x.grad is None)
        # a correct backward on a fresh graph works afterwards
        MyExp, _ = exp_square(T)
        (MyExp.apply(x) * x).sum().backward()
        out["grad"] = x.grad
        return out

    j, t = both(run)
    msg = t["err"][1]
    if kind == "too_few":
        assert msg.startswith("function TooFewBackward returned an incorrect number of gradients (expected 2, got 1)")
    elif kind == "too_many":
        assert msg.startswith("function TooManyBackward returned an incorrect number of gradients (expected 1, got 2)")
    else:
        assert msg.startswith("Function BadShapeBackward returned an invalid gradient at index 0 - got [3] but "
                              "expected shape compatible with [2]")


def test_gradient_broadcastable_to_input_is_summed_and_cast():
    def run(T):
        class Wide(T.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * 2

            @staticmethod
            def backward(ctx, grad):
                return (grad * 2).expand(3, 2)      # summed back to the input's shape [2]

        class Cast(T.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * 2

            @staticmethod
            def backward(ctx, grad):
                return (grad * 2).float()           # cast back to the input's float64

        x = mk(T, [1.0, 2.0], rg=True)
        Wide.apply(x).sum().backward()
        wide = x.grad
        x = mk(T, [1.0, 2.0], rg=True)
        (Cast.apply(x) * mk(T, [1.0, 3.0])).sum().backward()
        return dict(wide=wide, cast=x.grad)

    both(run)


# ----------------------------------------------------------------------------- 9. exceptions

class Boom(Exception):
    pass


@pytest.mark.parametrize("via", ["backward", "grad"])
def test_exception_in_backward_propagates_unchanged(via):
    def run(T):
        class Bomb(T.autograd.Function):
            armed = True
            raised = None

            @staticmethod
            def forward(ctx, x):
                ctx.save_for_backward(x)
                return x * 2

            @staticmethod
            def backward(ctx, grad):
                if Bomb.armed:
                    Bomb.raised = Boom("boom!", 42)
                    raise Bomb.raised
                (x,) = ctx.saved_tensors
                return grad * 2 + x * 0

        x = mk(T, [1.0, 2.0], rg=True)
        loss = (Bomb.apply(x * 1.5) * 3).sum() + (x * x).sum() * 0
        with pytest.raises(Boom) as ei:
            if via == "backward":
                loss.backward()
            else:
                T.autograd.grad(loss, x)
        out = dict(same_obj=ei.value is Bomb.raised, type=type(ei.value).__name__, args=ei.value.args,
                   grad_none=x.grad is None)
        Bomb.armed = False
        (Bomb.apply(x * 1.5) * 3).sum().backward()
        out["grad"] = x.grad
        MyExp, _ = exp_square(T)
        (g,) = T.autograd.grad((MyExp.apply(x) * x).sum(), x)
        out["g"] = g
        return out

    j, t = both(run)
    assert j["same_obj"] is True


# ----------------------------------------------------------------------------- 10. mixing

@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape", [(), (2, 3)], ids=["0d", "2d"])
def test_function_in_the_middle_of_a_graph(dtype, shape):
    rng = np.random.default_rng(3 + len(shape))
    xa = rng.uniform(-0.8, 0.8, size=shape)

    def run(T):
        MyExp, Square = exp_square(T)
        x = mk(T, xa, dtype=dtype, rg=True)
        y = MyExp.apply(x * 3)
        out = (y + x).sin().sum()
        out.backward()
        z = (Square.apply(x.tanh()) * x).sum()
        (g,) = T.autograd.grad(z, x)
        return dict(y=y, out=out, grad=x.grad, g=g, shape=tuple(y.shape))

    both(run, dtype=dtype)


def test_function_applied_several_times_in_one_graph():
    def run(T):
        Counted = counted_exp(T, "CountedExp")
        x = mk(T, [0.2, -0.4, 0.6], rg=True)
        y = Counted.apply(Counted.apply(x) * 0.5) + Counted.apply(x * 2) + Counted.apply(x)
        y.sum().backward()
        return dict(y=y, grad=x.grad, fwd=Counted.fwd, bwd=Counted.bwd)

    j, t = both(run)
    assert j["bwd"] == 4


def test_same_function_in_two_graphs():
    def run(T):
        MyExp, Square = exp_square(T)
        x = mk(T, [0.5, 1.0], rg=True)
        y = mk(T, [-0.5, 2.0], rg=True)
        g1 = (MyExp.apply(x) * Square.apply(x)).sum()
        g2 = (MyExp.apply(y) * 2 + Square.apply(y)).sum()
        g2.backward()
        yg = y.grad
        g1.backward()
        return dict(xg=x.grad, yg=yg)

    both(run)


@pytest.mark.parametrize("via", ["grad", "backward_inputs"])
def test_selective_execution_skips_unneeded_function(via):
    def run(T):
        A = counted_exp(T, "BranchA")
        B = counted_exp(T, "BranchB")
        x = mk(T, [0.1, 0.2], rg=True)
        w = mk(T, [0.3, 0.4], rg=True)
        loss = (A.apply(x * 2) * x).sum() + B.apply(w).sum() + (B.apply(w.sin()) * x).sum()
        if via == "grad":
            (g,) = T.autograd.grad(loss, [x])
        else:
            loss.backward(inputs=[x])
            g = x.grad
        return dict(g=g, a=(A.fwd, A.bwd), b=(B.fwd, B.bwd), w_none=w.grad is None)

    j, t = both(run)
    assert t["b"] == (2, 0)


# ----------------------------------------------------------------------------- 11. reference cycles

def cycle_fn(T):
    class Keep(T.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            y = x.exp()
            ctx.x = x           # plain attributes: output -> node -> ctx -> output is a cycle
            ctx.y = y
            return y

        @staticmethod
        def backward(ctx, grad):
            return grad * ctx.y

    return Keep


def saving_fn(T):
    class Save(T.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            y = x.exp()
            ctx.save_for_backward(x, y)
            return y

        @staticmethod
        def backward(ctx, grad):
            x, y = ctx.saved_tensors
            return grad * y

    return Save


def _build(T, factory, do_backward):
    Fn = factory(T)
    x = mk(T, [1.0, 2.0], rg=True)
    a = x * 1.0
    y = Fn.apply(a)
    z = (y * 2).sum()
    refs = [weakref.ref(x), weakref.ref(a), weakref.ref(y), weakref.ref(y.grad_fn)]
    if do_backward:
        z.backward()
    return refs


@LIBS
@pytest.mark.parametrize("do_backward", [False, True], ids=["no_backward", "backward"])
def test_ctx_attributes_do_not_leak(T, do_backward):
    refs = _build(T, cycle_fn, do_backward)
    gc.collect()
    assert [r() is None for r in refs] == [True] * 4


@pytest.fixture
def no_gc():
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@LIBS
@pytest.mark.parametrize("do_backward", [False, True], ids=["no_backward", "backward"])
def test_save_for_backward_frees_without_cycle_collector(T, do_backward, no_gc):
    refs = _build(T, saving_fn, do_backward)
    assert [r() is None for r in refs] == [True] * 4


# ----------------------------------------------------------------------------- 12. retain_graph

@pytest.mark.parametrize("via", ["backward", "grad"])
def test_retain_graph_twice_doubles(via):
    def run(T):
        MyExp, Square = exp_square(T)
        x = mk(T, [0.5, -1.0], rg=True)
        loss = Square.apply(MyExp.apply(x)).sum()
        if via == "backward":
            loss.backward(retain_graph=True)
            first = to_np(x.grad).tolist()
            loss.backward()
            return dict(first=first, second=x.grad)
        g1 = T.autograd.grad(loss, x, retain_graph=True)
        g2 = T.autograd.grad(loss, x)
        return dict(g1=g1, g2=g2)

    both(run)


@pytest.mark.parametrize("via", ["backward", "grad"])
def test_second_backward_without_retain_graph_raises(via):
    def run(T):
        MyExp, _ = exp_square(T)
        x = mk(T, [0.5, -1.0], rg=True)
        loss = MyExp.apply(x).sum()
        if via == "backward":
            loss.backward()
            e = capture(loss.backward)
        else:
            T.autograd.grad(loss, x)
            e = capture(T.autograd.grad, loss, x)
        out = dict(err=(type(e).__name__, str(e)), grad=to_np(x.grad).tolist() if x.grad is not None else None)
        MyExp.apply(x).sum().backward()   # a fresh graph works
        out["after"] = x.grad
        return out

    j, t = both(run)
    assert t["err"][0] == "RuntimeError"
    assert t["err"][1].startswith("Trying to backward through the graph a second time")


# ----------------------------------------------------------------------------- more edge cases

def test_non_tensor_outputs():
    def run(T):
        seen = []

        class WithExtras(T.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * 2, 3, "s"

            @staticmethod
            def backward(ctx, g, g2, g3):
                seen.append((grad_desc(g), g2, g3))
                return g * 2

        x = mk(T, [1.0, 2.0], rg=True)
        o = WithExtras.apply(x)
        out = dict(kind=type(o).__name__, extras=o[1:], rg=o[0].requires_grad, name=type(o[0].grad_fn).__name__)
        (o[0] * mk(T, [1.0, -1.0])).sum().backward()
        out.update(seen=seen, grad=x.grad)
        return out

    both(run)


def err_of(f, *args, **kwargs):
    e = capture(f, *args, **kwargs)
    return None if e is None else (type(e).__name__, str(e))


@pytest.mark.parametrize("kind", ["grad_for_non_tensor", "list_return", "float_return"])
def test_invalid_backward_return_values(kind):
    def run(T):
        class Bad(T.autograd.Function):
            @staticmethod
            def forward(ctx, x, y, k):
                return x * y * k

            @staticmethod
            def backward(ctx, g):
                if kind == "grad_for_non_tensor":
                    return g, g, g
                if kind == "list_return":
                    return [g, g, None]
                return g, 3.0, None

        x = mk(T, [1.0, 2.0], rg=True)
        y = mk(T, [3.0, 4.0], rg=True)
        err = err_of(Bad.apply(x, y, 2).sum().backward)
        return dict(err=err, x_none=x.grad is None)

    j, t = both(run)
    assert t["err"] is not None and t["err"][0] == "RuntimeError"


def test_save_for_backward_rejects_non_tensors():
    def run(T):
        class SaveInt(T.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                ctx.save_for_backward(x, 3)
                return x * 2

            @staticmethod
            def backward(ctx, g):
                return g

        return err_of(SaveInt.apply, mk(T, [1.0], rg=True)), T.is_grad_enabled()

    j, t = both(run)
    assert t[0][0] == "TypeError"


def test_all_outputs_non_differentiable():
    def run(T):
        class AllND(T.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                y = x * 2
                ctx.mark_non_differentiable(y)
                return y

            @staticmethod
            def backward(ctx, g):
                return g

        y = AllND.apply(mk(T, [1.0], rg=True))
        return dict(rg=y.requires_grad, fn=y.grad_fn is None, y=y, err=err_of(y.sum().backward))

    both(run)


def test_nested_function_calls_and_double_backward():
    def run(T):
        seen = []

        class Inner(T.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                ctx.save_for_backward(x)
                return x * x

            @staticmethod
            def backward(ctx, g):
                (x,) = ctx.saved_tensors
                return g * 2 * x

        class Outer(T.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                y = Inner.apply(x)               # runs under no_grad: records nothing
                seen.append((y.requires_grad, y.grad_fn is None))
                ctx.save_for_backward(x)
                return y * x

            @staticmethod
            def backward(ctx, g):
                (x,) = ctx.saved_tensors
                return g * 3 * Inner.apply(x)    # differentiable under create_graph

        x = mk(T, [1.0, -2.0], rg=True)
        y = Outer.apply(x)
        (g,) = T.autograd.grad(y.sum(), x, create_graph=True)
        (h,) = T.autograd.grad(g.sum(), x)
        return dict(y=y, g=g, h=h, seen=seen, g_rg=g.requires_grad)

    both(run)


def test_saved_tensor_modified_in_place_raises():
    def run(T):
        class Sq(T.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                ctx.save_for_backward(x)
                return x * x

            @staticmethod
            def backward(ctx, g):
                (x,) = ctx.saved_tensors
                return g * 2 * x

        x = mk(T, [1.0, 2.0], rg=True)
        a = x * 1.0
        y = Sq.apply(a)
        with T.no_grad():
            a.copy_(a * 2)
        e = capture(y.sum().backward)
        return type(e).__name__, str(e)[:94], x.grad is None

    j, t = both(run)
    assert t[1].startswith("one of the variables needed for gradient computation has been modified by an inplace")


def test_same_tensor_passed_twice_and_output_used_twice():
    def run(T):
        Counted = counted_exp(T, "Twice")

        class P2(T.autograd.Function):
            @staticmethod
            def forward(ctx, x, y):
                ctx.save_for_backward(x, y)
                return x * y

            @staticmethod
            def backward(ctx, g):
                x, y = ctx.saved_tensors
                return g * y, g * x * 10

        x = mk(T, [1.0, 2.0], rg=True)
        P2.apply(x, x).sum().backward()
        p = P2.apply(x, x)
        nf = p.grad_fn.next_functions
        out = dict(g_twice=x.grad, nf_idx=[i for _, i in nf], nf_same=nf[0][0] is nf[1][0])
        z = mk(T, [0.5, -0.5], rg=True)
        e = Counted.apply(z)
        (e * 2 + e.sin() + e).sum().backward()   # one backward call with the summed gradient
        out.update(zg=z.grad, bwd=Counted.bwd)
        return out

    j, t = both(run)
    assert t["bwd"] == 1


@pytest.mark.parametrize("where", ["forward", "backward", "once_backward"])
def test_grad_mode_restored_after_exception(where):
    def run(T):
        once_differentiable = fn_module(T).once_differentiable

        class Raiser(T.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                if where == "forward":
                    raise Boom("fwd")
                return x * 2

            @staticmethod
            def backward(ctx, g):
                raise Boom("bwd")

        class OnceRaiser(Raiser):
            @staticmethod
            @once_differentiable
            def backward(ctx, g):
                raise Boom("once")

        fn = OnceRaiser if where == "once_backward" else Raiser
        x = mk(T, [1.0, 2.0], rg=True)
        if where == "forward":
            e = capture(fn.apply, x)
        else:
            e = capture(fn.apply(x).sum().backward)
        after = (x * 2).requires_grad
        return type(e).__name__, e.args, T.is_grad_enabled(), after

    both(run)


def test_materialized_zero_gradients_have_output_dtype_and_shape():
    def run(T):
        seen = []

        class Two32(T.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * 2, (x * 3).sum()

            @staticmethod
            def backward(ctx, g1, g2):
                seen.append((str(g1.dtype).split(".")[-1], str(g2.dtype).split(".")[-1], tuple(g2.shape),
                             tuple(g1.shape), to_np(g2).tolist()))
                return g1 * 2

        x = mk(T, [1.0, 2.0], dtype="float32", rg=True)
        Two32.apply(x)[0].sum().backward()
        return dict(seen=seen, grad=x.grad)

    both(run, dtype="float32")


def test_retain_grad_on_function_output():
    def run(T):
        MyExp, Square = exp_square(T)
        x = mk(T, [0.5, 1.5], rg=True)
        y = Square.apply(x)
        y.retain_grad()
        (MyExp.apply(y) * 3).sum().backward()
        return dict(yg=y.grad, xg=x.grad, retains=y.retains_grad)

    both(run)


def test_backward_of_function_output_without_grad_raises():
    def run(T):
        MyExp, _ = exp_square(T)
        return err_of(MyExp.apply(mk(T, [1.0])).sum().backward)

    j, t = both(run)
    assert t[0] == "RuntimeError"


def test_grad_fn_of_a_temporary_output_keeps_its_graph():
    # torch: a node holds its next nodes, so a grad_fn outlives the tensor it came from
    def run(T):
        MyExp, Square = exp_square(T)
        x = mk(T, [1.0, 2.0], rg=True)
        fn = Square.apply(MyExp.apply(x)).grad_fn
        inner = fn.next_functions[0][0]
        return fn.name(), inner.name(), type(inner.next_functions[0][0]).__name__, \
            inner.next_functions[0][0].variable is x

    both(run)
