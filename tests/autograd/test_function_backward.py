"""Custom autograd Functions, part 2: once_differentiable, create_graph, invalid gradients,
exceptions, Functions mixed with ops, reference cycles, retain_graph and edge cases.
(Part 1, test_function.py: apply, graph API, setup_context, ctx API, inputs and outputs.)

Every test runs the same code with both libraries (``T`` is ``jitgrad`` or ``torch``) and
compares the results, or asserts a literal expectation in a test parametrized over both
libraries, so real PyTorch 2.13 validates each expectation.  The Function classes are
defined inside factories taking ``T``: each library gets its own classes with the same
names (the node names, ``<ClassName>Backward``, are part of what is compared).
"""
import gc
import weakref

import numpy as np
import pytest
from conftest import LIBS, both, capture, err_of, exp_square, fn_module, grad_desc, mk, to_np

torch = pytest.importorskip("torch")



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
