"""Tensor hooks: jitgrad against torch 2.13.

``Tensor.register_hook`` on non-leaf and leaf tensors, scalars and dtypes,
``register_post_accumulate_grad_hook``, ``retain_grad`` interplay and more tensor-hook details.
(Node hooks, order of events, selective execution, multi-grad hooks, create_graph, exceptions
and lifetime: test_hooks_node.py.)

Every test runs the same code with both libraries (``T`` is ``jitgrad`` or ``torch``) and
compares the results (values as float64 numpy, call orders as lists of strings, error
types/messages), so real PyTorch 2.13 decides every expectation.
"""
import gc

import pytest
from conftest import both, capture, err, gdesc, gtuple, mk, to_np

torch = pytest.importorskip("torch")



DTYPES = pytest.mark.parametrize("dtype", ["float32", "float64"])


# ----------------------------------------------------------------------------- 1. non-leaf tensor hooks

@pytest.mark.parametrize("ret", ["none", "replace"])
def test_nonleaf_hook_called_once_with_grad(ret):
    def run(T):
        calls = []
        x = mk(T, [1.0, -2.0, 3.0], rg=True)
        w = mk(T, [0.5, 1.5, -1.0])
        y = x * 2

        def h(g):
            calls.append(dict(is_tensor=isinstance(g, T.Tensor), g=gdesc(g)))
            return g * 3 if ret == "replace" else None

        handle = y.register_hook(h)
        (y * w).sum().backward()
        return dict(calls=calls, x_grad=x.grad, has_remove=callable(getattr(handle, "remove", None)))

    j, t = both(run)
    assert len(t["calls"]) == 1


def test_nonleaf_hook_replacement_flows_upstream_through_chain():
    def run(T):
        x = mk(T, [0.3, -0.7, 1.1], rg=True)
        y = x.exp()
        z = y * y
        seen = []
        z.register_hook(lambda g: (seen.append(gdesc(g)), g + 1.0)[1])
        y.register_hook(lambda g: (seen.append(gdesc(g)), None)[1])
        z.sum().backward()
        return dict(seen=seen, x_grad=x.grad)

    both(run)


def test_nonleaf_hook_sees_summed_gradient_of_multiple_uses():
    def run(T):
        x = mk(T, [1.0, 2.0], rg=True)
        y = x * 3
        seen = []
        y.register_hook(lambda g: seen.append(gdesc(g)))
        loss = (y * mk(T, [2.0, 5.0])).sum() + (y * y).sum() + y.sin().sum()
        loss.backward()
        return dict(seen=seen, x_grad=x.grad)

    j, t = both(run)
    assert len(t["seen"]) == 1


def test_hook_handle_remove():
    def run(T):
        calls = []
        x = mk(T, [1.0, 2.0], rg=True)
        y = x * 2
        h1 = y.register_hook(lambda g: (calls.append("h1"), g * 100)[1])
        h2 = y.register_hook(lambda g: calls.append("h2"))
        h1.remove()
        y.sum().backward(retain_graph=True)
        first = (list(calls), to_np(x.grad).tolist())
        h2.remove()
        h2.remove()                       # removing twice is harmless
        y.sum().backward()
        return dict(first=first, calls=calls, x_grad=x.grad)

    both(run)


def test_multiple_hooks_run_in_registration_order_and_chain():
    def run(T):
        log = []
        x = mk(T, [1.0, -1.0, 2.0], rg=True)
        y = x * x

        def make(name, f):
            def h(g):
                log.append((name, to_np(g).tolist()))
                return f(g)
            return h

        y.register_hook(make("add1", lambda g: g + 1))
        y.register_hook(make("none", lambda g: None))
        y.register_hook(make("mul2", lambda g: g * 2))
        y.register_hook(make("neg", lambda g: -g))
        (y * mk(T, [1.0, 2.0, 3.0])).sum().backward()
        return dict(log=log, x_grad=x.grad)

    both(run)


def test_hook_fires_on_every_backward():
    def run(T):
        calls = []
        x = mk(T, [1.0, 2.0], rg=True)
        y = x * 2
        y.register_hook(lambda g: calls.append(to_np(g).tolist()))
        loss = (y * y).sum()
        loss.backward(retain_graph=True)
        loss.backward(retain_graph=True)
        (g,) = T.autograd.grad(loss, x)
        return dict(calls=calls, x_grad=x.grad, g=g)

    j, t = both(run)
    assert len(t["calls"]) == 3


def test_register_hook_on_tensor_not_requiring_grad_raises():
    def run(T):
        c = mk(T, [1.0, 2.0])
        e = capture(c.register_hook, lambda g: None)
        return err(e)

    j, t = both(run)
    assert t[0] == "RuntimeError"


@pytest.mark.parametrize("bad", ["shape", "dtype"])
def test_hook_returning_wrong_shape_or_dtype_raises(bad):
    def run(T):
        x = mk(T, [1.0, 2.0], rg=True)
        y = x * 2

        def hook(g):
            return g.sum() if bad == "shape" else g.float()

        y.register_hook(hook)
        e = capture(y.sum().backward)
        return dict(err=err(e), grad_none=x.grad is None)

    j, t = both(run)
    assert t["err"][0] == "RuntimeError"


# ----------------------------------------------------------------------------- 2. leaf tensor hooks

def test_leaf_hook_sees_incoming_grad_before_accumulation():
    def run(T):
        seen = []
        x = mk(T, [1.0, 2.0, -3.0], rg=True)

        def h(g):
            seen.append(dict(g=gdesc(g), grad_inside=None if x.grad is None else to_np(x.grad).tolist()))
            return None

        x.register_hook(h)
        (x * x).sum().backward()
        (x * 5).sum().backward()
        return dict(seen=seen, x_grad=x.grad)

    j, t = both(run)
    assert len(t["seen"]) == 2


def test_leaf_hook_replacement_is_accumulated():
    def run(T):
        x = mk(T, [1.0, 2.0], rg=True)
        seen = []
        x.register_hook(lambda g: (seen.append(to_np(g).tolist()), g * 10)[1])
        x.register_hook(lambda g: (seen.append(to_np(g).tolist()), g + 1)[1])
        (x * 3).sum().backward()
        first = to_np(x.grad).tolist()
        (x * x).sum().backward()
        return dict(seen=seen, first=first, x_grad=x.grad)

    both(run)


def test_leaf_hook_used_twice_called_once():
    def run(T):
        x = mk(T, [0.5, -1.5], rg=True)
        calls = []
        x.register_hook(lambda g: (calls.append(to_np(g).tolist()), g * 2)[1])
        (x * 3 + x.exp() + x * x).sum().backward()
        return dict(calls=calls, x_grad=x.grad)

    j, t = both(run)
    assert len(t["calls"]) == 1


def test_leaf_hook_applies_to_autograd_grad_result():
    def run(T):
        x = mk(T, [1.0, 2.0], rg=True)
        calls = []
        x.register_hook(lambda g: (calls.append(to_np(g).tolist()), g * 10)[1])
        (g,) = T.autograd.grad((x * 3).sum(), x)
        return dict(calls=calls, g=g, grad_none=x.grad is None)

    both(run)


# ----------------------------------------------------------------------------- 3. scalars, MLP, dtypes

@DTYPES
def test_hooks_on_scalar_chain(dtype):
    def run(T):
        seen = []
        x = mk(T, 0.7, dtype, rg=True)
        y = x * 3
        z = y.exp()
        w = z * z + y
        y.register_hook(lambda g: (seen.append(("y", gdesc(g))), g * 0.5)[1])
        z.register_hook(lambda g: (seen.append(("z", gdesc(g))), g - 1.0)[1])
        w.register_hook(lambda g: (seen.append(("w", gdesc(g))), None)[1])
        x.register_hook(lambda g: (seen.append(("x", gdesc(g))), g * 2)[1])
        w.backward()
        return dict(seen=[(n, d[:3] + (d[4],)) for n, d in seen],
                    vals=[mk(T, d[3], dtype) for _, d in seen], x_grad=x.grad)

    both(run, dtype)


@DTYPES
def test_hooks_in_mlp(dtype, rng):
    xa = rng.uniform(-1, 1, size=(4, 3))
    w1a = rng.uniform(-1, 1, size=(3, 5))
    w2a = rng.uniform(-1, 1, size=(5, 2))
    b1a = rng.uniform(-0.3, 0.3, size=(5,))

    def run(T):
        seen = {}
        X = mk(T, xa, dtype)
        W1 = mk(T, w1a, dtype, rg=True)
        b1 = mk(T, b1a, dtype, rg=True)
        W2 = mk(T, w2a, dtype, rg=True)
        h = X @ W1 + b1
        a = h.relu()
        out = a @ W2
        loss = (out * out).sum()

        def rec(name, f):
            def hook(g):
                seen[name] = T.tensor(to_np(g).copy())
                return f(g)
            return hook

        h.register_hook(rec("h", lambda g: g * 2))
        a.register_hook(rec("a", lambda g: None))
        out.register_hook(rec("out", lambda g: g + 0.25))
        W1.register_hook(rec("W1", lambda g: g * 0.5))
        loss.backward()
        return dict(seen=seen, W1=W1.grad, b1=b1.grad, W2=W2.grad)

    both(run, dtype)


# ----------------------------------------------------------------------------- 5. post-accumulate-grad hooks

def test_post_accumulate_grad_hook_sees_updated_grad():
    def run(T):
        seen = []
        x = mk(T, [1.0, -2.0], rg=True)

        def hook(t):
            seen.append(dict(is_x=t is x, grad=to_np(t.grad).tolist()))

        handle = x.register_post_accumulate_grad_hook(hook)
        (x * x).sum().backward()
        (x * 3).sum().backward()
        handle.remove()
        (x * 3).sum().backward()
        return dict(seen=seen, x=x.grad)

    j, t = both(run)
    assert len(t["seen"]) == 2


def test_post_accumulate_grad_hook_runs_after_tensor_hooks():
    def run(T):
        log = []
        x = mk(T, [1.0, 2.0], rg=True)
        x.register_post_accumulate_grad_hook(lambda t: log.append(("post_acc", to_np(t.grad).tolist())))
        x.register_hook(lambda g: (log.append(("tensor", to_np(g).tolist())), g * 2)[1])
        (x * 5).sum().backward()
        return dict(log=log, x=x.grad)

    both(run)


def test_post_accumulate_grad_hook_not_called_by_autograd_grad():
    def run(T):
        calls = []
        x = mk(T, [1.0, 2.0], rg=True)
        x.register_post_accumulate_grad_hook(lambda t: calls.append(1))
        (g,) = T.autograd.grad((x * 3).sum(), x)
        return dict(calls=calls, g=g, grad_none=x.grad is None)

    both(run)


def test_post_accumulate_grad_hook_on_non_leaf_raises():
    def run(T):
        x = mk(T, [1.0, 2.0], rg=True)
        y = x * 2
        return err(capture(y.register_post_accumulate_grad_hook, lambda t: None))

    j, t = both(run)
    assert t[0] == "RuntimeError"


def test_post_accumulate_grad_hook_on_tensor_not_requiring_grad_raises():
    def run(T):
        c = mk(T, [1.0, 2.0])
        return err(capture(c.register_post_accumulate_grad_hook, lambda t: None))

    j, t = both(run)
    assert t[0] == "RuntimeError"


def test_post_accumulate_grad_hook_returning_value_raises():
    def run(T):
        x = mk(T, [1.0, 2.0], rg=True)
        x.register_post_accumulate_grad_hook(lambda t: t.grad * 2)
        return err(capture((x * 2).sum().backward))

    j, t = both(run)
    assert t[0] == "RuntimeError"


# ----------------------------------------------------------------------------- 6. retain_grad + hooks

@pytest.mark.parametrize("order", ["retain_first", "hook_first"])
def test_retain_grad_sees_grad_after_tensor_hooks(order):
    def run(T):
        x = mk(T, [1.0, 2.0], rg=True)
        y = x * 2
        if order == "retain_first":
            y.retain_grad()
            y.register_hook(lambda g: g * 10)
        else:
            y.register_hook(lambda g: g * 10)
            y.retain_grad()
        (y * 3).sum().backward()
        return dict(y=y.grad, x=x.grad)

    both(run)


def test_retain_grad_and_hook_registered_later_accumulate():
    def run(T):
        x = mk(T, [1.0, 2.0], rg=True)
        y = x * 2
        y.retain_grad()
        loss = (y * y).sum()
        loss.backward(retain_graph=True)
        first = to_np(y.grad).tolist()
        y.register_hook(lambda g: g + 1)
        loss.backward()
        return dict(first=first, y=y.grad, x=x.grad)

    both(run)


# ----------------------------------------------------------------------------- 13. more tensor-hook details

def test_hook_on_root_output_replaces_seed():
    def run(T):
        seen = []
        x = mk(T, [1.0, 2.0], rg=True)
        y = x * x
        y.register_hook(lambda g: (seen.append(gdesc(g)), g * 5)[1])
        y.backward(mk(T, [1.0, -2.0]))
        s = (x * 3).sum()
        s.register_hook(lambda g: (seen.append(gdesc(g)), g + 1)[1])
        s.backward()
        return dict(seen=seen, x=x.grad)

    both(run)


def test_hook_fires_after_python_tensor_is_deleted_while_graph_alive():
    def run(T):
        calls = []
        x = mk(T, [1.0, 2.0], rg=True)
        y = x * 2
        y.register_hook(lambda g: (calls.append(to_np(g).tolist()), g * 10)[1])
        loss = (y * y).sum()
        del y
        gc.collect()
        loss.backward()
        return dict(calls=calls, x=x.grad)

    j, t = both(run)
    assert len(t["calls"]) == 1


@pytest.mark.parametrize("create_graph", [False, True])
def test_grad_mode_inside_hooks(create_graph):
    def run(T):
        seen = []
        x = mk(T, [1.0, 2.0], rg=True)
        y = x * x
        y.register_hook(lambda g: seen.append(("tensor", T.is_grad_enabled(), bool(g.requires_grad))))
        y.grad_fn.register_prehook(lambda go: seen.append(("pre", T.is_grad_enabled())))
        y.grad_fn.register_hook(lambda gi, go: seen.append(("post", T.is_grad_enabled())))
        (g,) = T.autograd.grad(y.sum(), x, create_graph=create_graph)
        seen.append(("after", T.is_grad_enabled()))
        return dict(seen=seen, g=g)

    both(run)


def test_hook_on_unused_output_of_multi_output_function():
    def run(T):
        class Two(T.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * 2, x * 3

            @staticmethod
            def backward(ctx, ga, gb):
                return ga * 2 + gb * 3

        calls = []
        x = mk(T, [1.0, 2.0], rg=True)
        a, b = Two.apply(x)
        a.register_hook(lambda g: calls.append(("a", gdesc(g))))
        b.register_hook(lambda g: calls.append(("b", gdesc(g))))
        a.grad_fn.register_prehook(lambda go: calls.append(("pre", gtuple(go))))
        (a * 5).sum().backward()
        return dict(calls=calls, x=x.grad)

    both(run)


def test_hook_on_one_output_of_multi_output_function_replaces_only_it():
    def run(T):
        class Two(T.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * 2, x * 3

            @staticmethod
            def backward(ctx, ga, gb):
                return ga * 2 + gb * 3

        x = mk(T, [1.0, 2.0], rg=True)
        a, b = Two.apply(x)
        b.register_hook(lambda g: g * 100)
        (a + b).sum().backward()
        return x.grad

    both(run)


def test_accumulate_grad_node_hooks():
    def run(T):
        seen = []
        x = mk(T, [1.0, 2.0], rg=True)
        y = x * 2
        acc = y.grad_fn.next_functions[0][0]
        acc.register_prehook(lambda go: seen.append(("pre", gtuple(go))))
        acc.register_hook(lambda gi, go: seen.append(("post", gtuple(gi), gtuple(go))))
        y.sum().backward()
        return dict(name=type(acc).__name__, seen=seen, x=x.grad)

    both(run)


def test_multi_grad_hook_mode_any():
    def run(T):
        calls = []
        a = mk(T, [1.0, 2.0], rg=True)
        b = mk(T, [3.0], rg=True)
        T.autograd.graph.register_multi_grad_hook((a, b), lambda g: calls.append(gdesc(g)), mode="any")
        (a * b).sum().backward()
        (b * 2).sum().backward()
        return dict(calls=calls, a=a.grad, b=b.grad)

    both(run)
