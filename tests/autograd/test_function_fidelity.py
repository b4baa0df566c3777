"""Custom Functions and the graph a create_graph backward builds, as in PyTorch:
once_differentiable's Error node, calling a Function instance (the removed legacy form),
materialized gradients under create_graph, the CopyBackwards node AccumulateGrad puts on a
.grad that has a graph, and pack hooks on what a Function saves. Each scenario runs on
jitgrad and on torch and the results must agree."""
import warnings

import numpy as np
import pytest
from conftest import LIBS

import jitgrad

torch = pytest.importorskip("torch")


def _once_differentiable_graph(T):
    class Double(T.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        @T.autograd.function.once_differentiable
        def backward(ctx, g):
            return g * 2

    x = T.tensor([1.0, 2.0], dtype=T.float64, requires_grad=True)
    v = T.tensor([0.5, -1.0], dtype=T.float64, requires_grad=True)
    g, = T.autograd.grad(Double.apply(x), x, v, create_graph=True)
    node = g.grad_fn
    out = [type(node).__name__, node.name(), [type(n).__name__ for n, _ in node.next_functions],
           g.detach().numpy().tolist()]
    try:
        g.sum().backward()
        out.append(None)
    except RuntimeError as e:
        out.append(str(e))
    return out


def test_once_differentiable_node_is_torchs_error_node():
    assert _once_differentiable_graph(jitgrad) == _once_differentiable_graph(torch)


def _legacy_call(T):
    class Legacy(T.autograd.Function):
        def forward(self, x):
            return x

    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        fn = Legacy()
    out = [[(c.category.__name__, str(c.message).split(" should")[1][:40]) for c in w]]
    try:
        fn(T.ones(2))
    except RuntimeError as e:
        out.append(str(e))
    return out


def test_calling_a_function_instance_is_the_legacy_error():
    assert _legacy_call(jitgrad) == _legacy_call(torch)


def _materialized(T, create_graph):
    x = T.tensor([1.0, 2.0], dtype=T.float64, requires_grad=True)
    unused = T.tensor([3.0, 4.0], dtype=T.float64, requires_grad=True)
    gx, gu = T.autograd.grad((x * 3).sum(), (x, unused), create_graph=create_graph, materialize_grads=True)
    return [gu.detach().numpy().tolist(), gu.requires_grad, gu.grad_fn is None, gu.is_leaf,
            gx.requires_grad, gx.grad_fn is None]


@pytest.mark.parametrize("create_graph", [False, True])
def test_materialized_zeros_follow_create_graph(create_graph):
    assert _materialized(jitgrad, create_graph) == _materialized(torch, create_graph)


def _grad_graph(T):
    """Node names of x.grad's graph after create_graph backwards: AccumulateGrad copies a
    gradient that has a graph (CopyBackwards); a second backward adds to it."""
    def names(t):
        n = t.grad_fn
        return None if n is None else [type(n).__name__, [type(m).__name__ if m is not None else None
                                                           for m, _ in n.next_functions]]
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's reference-cycle warning for backward(create_graph=True)
        x = T.tensor([1.0, -2.0], dtype=T.float64, requires_grad=True)
        (x * x).sum().backward(create_graph=True)
        out.append(names(x.grad))
        first = x.grad
        (x * x).sum().backward(create_graph=True)
        out.append(names(x.grad))
        out.append(x.grad.detach().numpy().tolist())
        (x.grad * first).sum().backward()  # through both copies: d/dx (2x + 2x) * 2x = 16x
        out.append(x.grad.detach().numpy().tolist())
        y = T.tensor([1.0, 2.0], dtype=T.float64, requires_grad=True)
        (y * 2).sum().backward(create_graph=True)  # a gradient without a graph: kept as it is
        out.append([names(y.grad), y.grad.requires_grad])
        z = T.tensor([1.0, 2.0], dtype=T.float64, requires_grad=True)
        g = T.tensor([3.0, 4.0], dtype=T.float64, requires_grad=True)
        z.backward(g, create_graph=True)
        out.append([names(z.grad), z.grad is g])
    return out


def test_create_graph_accumulation_nodes_match_torch():
    assert _grad_graph(jitgrad) == _grad_graph(torch)


@LIBS
def test_pack_hook_writing_a_function_input_raises(T):
    class Square(T.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            x, = ctx.saved_tensors
            return 2 * x * g

    def inc(t):
        t += 1
        return t

    x = T.tensor([1.0, 2.0], dtype=T.float64, requires_grad=True)
    with T.autograd.graph.saved_tensors_hooks(inc, lambda t: t):
        with pytest.raises(RuntimeError, match="A saved tensor pack hook is modifying its input in place"):
            Square.apply(x)
    with T.autograd.graph.saved_tensors_hooks(lambda t: t * 2, lambda t: t):
        y = Square.apply(x)
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 4 * x.detach().numpy())


def _function_raw_saved(T):
    class Keep(T.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x, None)
            return x * 3

        @staticmethod
        def backward(ctx, g):
            x, none = ctx.saved_tensors
            return g * x

    out = []

    def catch(fn):
        try:
            fn()
            out.append(None)
        except (RuntimeError, TypeError) as e:
            out.append((type(e).__name__, str(e).split("\n")[0][:50]))

    x = T.tensor([1.0, 2.0], dtype=T.float64, requires_grad=True)
    y = Keep.apply(x)
    saved = y.grad_fn._raw_saved_tensors
    out.append(len(saved))
    out.append([saved[0].unpack() is x, saved[1].unpack(), saved[0].unpack_hook])
    catch(lambda: saved[1].register_hooks(lambda t: t, lambda t: t))
    catch(lambda: saved[0].register_hooks(lambda t: t))
    catch(lambda: saved[0].register_hooks(1, 1))
    saved[0].register_hooks(lambda t: 2 * t, lambda t: t)  # backward then reads 2x
    catch(lambda: saved[0].register_hooks(lambda t: t, lambda t: t))
    out.append([saved[0].data.tolist(), saved[0].unpack().tolist()])
    y.sum().backward()
    out.append(x.grad.numpy().tolist())
    saved = None  # the SavedTensors are dropped before the freed node is read again
    catch(lambda: y.grad_fn._raw_saved_tensors)
    catch(lambda: y.grad_fn.saved_tensors)
    return out


def test_function_raw_saved_tensors_match_torch():
    assert _function_raw_saved(jitgrad) == _function_raw_saved(torch)


_FIRST = {
    "exp": lambda T, a, b: a.exp(), "sin": lambda T, a, b: a.sin(), "div": lambda T, a, b: a / b,
    "square": lambda T, a, b: a * a, "mean": lambda T, a, b: a.mean(),
    "broadcast": lambda T, a, b: a.reshape(3, 1) * b, "sum_dim": lambda T, a, b: (a.reshape(3, 1) * b).sum(0),
    "matmul": lambda T, a, b: a.reshape(1, 3) @ b.reshape(3, 1),
    "linear": lambda T, a, b: T.nn.functional.linear(a.reshape(1, 3), b.reshape(1, 3).expand(2, 3)).exp(),
    "sum_to_scalar": lambda T, a, b: a.sum() * b,
    "transpose": lambda T, a, b: (a.reshape(3, 1) * b).transpose(0, 1).exp()[0],
    "t": lambda T, a, b: (a.reshape(3, 1) * b).t().exp()[0],
}


def _first_grad_graph(T, name):
    a = T.tensor([0.5, 1.5, 2.5], dtype=T.float64, requires_grad=True)
    b = T.tensor([1.5, 0.7, 1.2], dtype=T.float64, requires_grad=True)
    out = []

    def walk(n, depth=0):
        if n is not None and depth < 8:
            out.append(f"{depth}:{type(n).__name__}")
            for m, _ in n.next_functions:
                walk(m, depth + 1)
    y = _FIRST[name](T, a, b).sum()
    for g in T.autograd.grad(y, (a, b), create_graph=True, allow_unused=True):
        walk(None if g is None else g.grad_fn)
        out.append("|")
    return out


@pytest.mark.parametrize("name", sorted(_FIRST))
def test_create_graph_backward_records_torchs_nodes(name):
    # no extra reshapes or permutes: a backward's graph has the nodes torch's rules make
    assert _first_grad_graph(jitgrad, name) == _first_grad_graph(torch, name)
