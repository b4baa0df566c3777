"""autograd.graph.GradientEdge, get_gradient_edge and increment_version, side by side with
torch (``T`` is jitgrad or torch)."""
import importlib

import numpy as np
import pytest
from conftest import LIBS, both, err_of, mk

torch = pytest.importorskip("torch")

X = [[0.5, -1.25, 2.0], [1.5, 0.75, -0.3]]


def graph_(T):
    return importlib.import_module(T.__name__ + ".autograd.graph")


@LIBS
def test_edge_of_a_non_leaf_and_of_a_leaf(T):
    g = graph_(T)
    x = mk(T, X, rg=True)
    y = x.exp()
    e = g.get_gradient_edge(y)
    assert isinstance(e, g.GradientEdge) and isinstance(e, tuple)
    assert e.node is y.grad_fn and e.output_nr == 0 and e.ownership_token is None
    assert type(e.node).__name__ == "ExpBackward0"
    leaf = g.get_gradient_edge(x)
    assert type(leaf.node).__name__ == "AccumulateGrad" and leaf.output_nr == 0
    assert leaf.node is y.grad_fn.next_functions[0][0]  # the same sink the graph reaches
    assert g.GradientEdge(e.node, 0) == (e.node, 0, None)


def test_grad_of_an_edge_equals_grad_of_its_tensor():
    def run(T):
        g = graph_(T)
        x = mk(T, X, rg=True)
        y = x.exp()
        z = (y * y.sin()).sum()
        by_edge = T.autograd.grad(z, [g.get_gradient_edge(y), g.get_gradient_edge(x)], retain_graph=True)
        by_tensor = T.autograd.grad(z, [y, x], retain_graph=True)
        single = T.autograd.grad(z, g.get_gradient_edge(y), create_graph=True)  # one edge, not a sequence
        return by_edge, by_tensor, single
    (edge, tensor, single), _ = both(run)
    for a, b in zip(edge, tensor):
        np.testing.assert_array_equal(a.detach().numpy(), b.detach().numpy())
    assert single[0].requires_grad


def test_edge_of_an_output_that_is_not_the_first():
    def run(T):
        g = graph_(T)

        class Pair(T.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * 2, x * 3

            @staticmethod
            def backward(ctx, g1, g2):
                return g1 * 2 + g2 * 3

        x = mk(T, X, rg=True)
        p, q = Pair.apply(x)
        eq, ep = g.get_gradient_edge(q), g.get_gradient_edge(p)
        assert (ep.output_nr, eq.output_nr) == (0, 1) and ep.node is eq.node
        loss = (p * 1.5 + q * 10).sum()
        return T.autograd.grad(loss, [eq, ep, x])
    both(run)


def test_edge_of_a_max_output_and_of_a_leaf_used_twice():
    def run(T):
        g = graph_(T)
        x = mk(T, X, rg=True)
        values = x.max(1).values
        e = g.get_gradient_edge(values)
        return T.autograd.grad((values * values).sum() + (x * 2).sum(), [e, g.get_gradient_edge(x)])
    both(run)


def test_unreached_edge_and_materialize_grads():
    def run(T):
        g = graph_(T)
        x = mk(T, X, rg=True)
        y = x.exp()
        e = g.get_gradient_edge(y)
        z = (x * 2).sum()  # does not go through y
        unused = T.autograd.grad(z, e, allow_unused=True, retain_graph=True)
        errors = (err_of(T.autograd.grad, z, e, retain_graph=True),
                  err_of(T.autograd.grad, z, e, materialize_grads=True, retain_graph=True),
                  err_of(T.autograd.grad, z, [x, e], materialize_grads=True))
        return unused, errors
    both(run)


@LIBS
def test_edge_of_a_tensor_without_grad_raises(T):
    g = graph_(T)
    e = err_of(g.get_gradient_edge, mk(T, X))
    assert e == ("RuntimeError", "It is not possible to get the gradient edge for a Tensor that does not require "
                                 "gradients")


def test_increment_version_makes_backward_raise():
    def run(T):
        g = graph_(T)
        x = mk(T, X, rg=True)
        y = x.exp()  # saves its result
        v0 = y._version
        g.increment_version(y)
        g.increment_version([y, x])  # a list of tensors too
        e = err_of(lambda: y.sum().backward())
        return v0, y._version, x._version, e[0], e[1].split(", which is output")[0].split(" is at version")[0]
    both(run)


def test_increment_version_of_an_unsaved_tensor_is_harmless():
    def run(T):
        g = graph_(T)
        x = mk(T, X, rg=True)
        y = x * 2  # saves nothing of x
        g.increment_version(x)
        y.sum().backward()
        return x.grad, x._version
    both(run)


@LIBS
def test_increment_version_counts_on_the_storage(T):
    g = graph_(T)
    x = mk(T, X)
    view = x[0]
    g.increment_version(view)
    assert (x._version, view._version) == (1, 1)
    g.increment_version(x.data)  # .data has a counter of its own, as any write through it
    assert x._version == 1
