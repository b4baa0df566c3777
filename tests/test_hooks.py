"""Autograd hooks: jitgrad against torch 2.13.

Tensor hooks (``Tensor.register_hook``, ``register_post_accumulate_grad_hook``), node
hooks (``Node.register_hook`` / ``Node.register_prehook``), ``retain_grad`` interplay,
execution order, selective execution, ``autograd.graph.register_multi_grad_hook``,
``create_graph``, exceptions and lifetime.

Every test runs the same code with both libraries (``T`` is ``jitgrad`` or ``torch``) and
compares the results (values as float64 numpy, call orders as lists of strings, error
types/messages), so real PyTorch 2.13 decides every expectation.
"""
import gc
import weakref

import numpy as np
import pytest

import jitgrad
from conftest import both, mk, capture, to_np

torch = pytest.importorskip("torch")

LIBS = pytest.mark.parametrize("T", [jitgrad, torch], ids=["jitgrad", "torch"])
DTYPES = pytest.mark.parametrize("dtype", ["float32", "float64"])


# ----------------------------------------------------------------------------- helpers









def gdesc(g):
    """A gradient as seen by a hook: None, or (kind, dtype, shape, values, requires_grad)."""
    if g is None:
        return None
    return ("tensor", str(g.dtype).split(".")[-1], tuple(g.shape), to_np(g).tolist(), bool(g.requires_grad))


def gtuple(gs):
    """A tuple of gradients as seen by a node hook: its container type and each entry."""
    return (type(gs).__name__, [gdesc(g) for g in gs])


def err(e):
    return None if e is None else (type(e).__name__, str(e))


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


# ----------------------------------------------------------------------------- 4. node hooks

def test_node_post_hook_arguments_mul_with_constant():
    def run(T):
        seen = []
        x = mk(T, [1.0, 2.0], rg=True)
        c = mk(T, [3.0, 4.0])
        y = x * c
        z = c * x
        y.grad_fn.register_hook(lambda gi, go: seen.append(("y", gtuple(gi), gtuple(go))))
        z.grad_fn.register_hook(lambda gi, go: seen.append(("z", gtuple(gi), gtuple(go))))
        (y * 2 + z * 5).sum().backward()
        return dict(seen=seen, x_grad=x.grad)

    j, t = both(run)
    assert len(t["seen"]) == 2


def test_node_prehook_arguments_and_sum():
    def run(T):
        seen = []
        x = mk(T, [[1.0, 2.0], [3.0, 4.0]], rg=True)
        y = x * x
        s = y.sum()
        s.grad_fn.register_prehook(lambda go: seen.append(("pre_sum", gtuple(go))))
        s.grad_fn.register_hook(lambda gi, go: seen.append(("post_sum", gtuple(gi), gtuple(go))))
        y.grad_fn.register_prehook(lambda go: seen.append(("pre_mul", gtuple(go))))
        y.grad_fn.register_hook(lambda gi, go: seen.append(("post_mul", gtuple(gi), gtuple(go))))
        s.backward(mk(T, 2.0))
        return dict(seen=seen, x_grad=x.grad)

    both(run)


def test_node_post_hook_replacement_changes_leaf_grads():
    def run(T):
        x = mk(T, [1.0, 2.0], rg=True)
        w = mk(T, [3.0, -1.0], rg=True)
        y = x * w
        y.grad_fn.register_hook(lambda gi, go: (gi[0] * 10, gi[1] + 1))
        (y * mk(T, [1.0, 2.0])).sum().backward()
        return dict(x=x.grad, w=w.grad)

    both(run)


def test_node_post_hook_returning_none_keeps_grads():
    def run(T):
        x = mk(T, [1.0, 2.0], rg=True)
        y = x.exp()
        y.grad_fn.register_hook(lambda gi, go: None)
        y.sum().backward()
        return x.grad

    both(run)


def test_node_prehook_replacement_changes_leaf_grads():
    def run(T):
        seen = []
        x = mk(T, [1.0, 2.0], rg=True)
        w = mk(T, [3.0, -1.0], rg=True)
        y = x * w
        y.grad_fn.register_prehook(lambda go: (go[0] * 3,))
        y.grad_fn.register_prehook(lambda go: (seen.append(gtuple(go)), None)[1])
        y.grad_fn.register_hook(lambda gi, go: seen.append((gtuple(gi), gtuple(go))))
        y.sum().backward()
        return dict(seen=seen, x=x.grad, w=w.grad)

    both(run)


def test_node_hook_handles_remove():
    def run(T):
        calls = []
        x = mk(T, [1.0, 2.0], rg=True)
        y = x * 2
        h1 = y.grad_fn.register_hook(lambda gi, go: (calls.append("post"), (gi[0] * 100,))[1])
        h2 = y.grad_fn.register_prehook(lambda go: (calls.append("pre"), (go[0] * 100,))[1])
        h1.remove()
        h2.remove()
        y.sum().backward()
        return dict(calls=calls, x=x.grad)

    both(run)


def test_node_hooks_on_custom_function():
    def run(T):
        class MulAdd(T.autograd.Function):
            @staticmethod
            def forward(ctx, a, b, k):
                ctx.save_for_backward(a, b)
                ctx.k = k
                return a * b + k

            @staticmethod
            def backward(ctx, g):
                a, b = ctx.saved_tensors
                return g * b, g * a, None

        seen = []
        x = mk(T, [1.0, 2.0], rg=True)
        c = mk(T, [3.0, 4.0])
        y = MulAdd.apply(x, c, 2.0)
        node = y.grad_fn
        node.register_prehook(lambda go: (seen.append(("pre", gtuple(go))), (go[0] * 2,))[1])
        node.register_hook(lambda gi, go: (seen.append(("post", gtuple(gi), gtuple(go))),
                                           (gi[0] + 1, None))[1])
        (y * mk(T, [1.0, -1.0])).sum().backward()
        return dict(name=type(node).__name__, seen=seen, x=x.grad)

    both(run)


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


# ----------------------------------------------------------------------------- 7. order of events

def test_order_of_tensor_and_node_hooks_in_branching_graph():
    def run(T):
        ev = []
        x = mk(T, [0.5, -1.0], rg=True)
        a = x * 2
        b = a.exp()
        c = a.sin()
        d = b + c
        loss = d.sum()
        tensors = [("x", x), ("a", a), ("b", b), ("c", c), ("d", d), ("loss", loss)]
        for name, t in tensors:
            t.register_hook(lambda g, n=name: ev.append("tensor:" + n))
        for name, t in tensors[1:]:
            fn = t.grad_fn
            fn.register_prehook(lambda go, n=name: ev.append("pre:" + n))
            fn.register_hook(lambda gi, go, n=name: ev.append("post:" + n))
        x.register_post_accumulate_grad_hook(lambda t: ev.append("post_acc:x"))
        loss.backward()
        return dict(ev=ev, x=x.grad)

    both(run)


def test_order_with_two_independent_branches_and_leaves():
    def run(T):
        ev = []
        x = mk(T, [1.0, 2.0], rg=True)
        w = mk(T, [0.5, 0.25], rg=True)
        p = x * 3            # created first
        q = w.exp()          # created second
        r = p * q
        s = p + r
        loss = (s * q).sum()
        for name, t in [("x", x), ("w", w), ("p", p), ("q", q), ("r", r), ("s", s)]:
            t.register_hook(lambda g, n=name: ev.append("tensor:" + n))
        for name, t in [("p", p), ("q", q), ("r", r), ("s", s), ("loss", loss)]:
            t.grad_fn.register_prehook(lambda go, n=name: ev.append("pre:" + n))
            t.grad_fn.register_hook(lambda gi, go, n=name: ev.append("post:" + n))
        loss.backward()
        return dict(ev=ev, x=x.grad, w=w.grad)

    both(run)


# ----------------------------------------------------------------------------- 8. selective execution

@pytest.mark.parametrize("via", ["grad", "backward_inputs"])
def test_hooks_on_unneeded_branch_do_not_fire(via):
    def run(T):
        ev = []
        x = mk(T, [1.0, 2.0], rg=True)
        y = mk(T, [3.0, 4.0], rg=True)
        p = x * 2                        # needed for x
        q = y * 3                        # not needed for x
        loss = (p * p).sum() + q.sum()
        p.register_hook(lambda g: ev.append("tensor:p"))
        q.register_hook(lambda g: ev.append("tensor:q"))
        y.register_hook(lambda g: ev.append("tensor:y"))
        q.grad_fn.register_prehook(lambda go: ev.append("pre:q"))
        q.grad_fn.register_hook(lambda gi, go: ev.append("post:q"))
        p.grad_fn.register_hook(lambda gi, go: ev.append("post:p"))
        if via == "grad":
            (g,) = T.autograd.grad(loss, x)
        else:
            loss.backward(inputs=[x])
            g = x.grad
        return dict(ev=ev, g=g, y_grad_none=y.grad is None)

    j, t = both(run)
    assert "tensor:q" not in t["ev"] and "tensor:p" in t["ev"]


def test_hook_on_needed_branch_modifies_grad_result():
    def run(T):
        x = mk(T, [1.0, 2.0], rg=True)
        y = mk(T, [3.0, 4.0], rg=True)
        p = x * y
        q = y.exp()
        p.register_hook(lambda g: g * 7)
        q.register_hook(lambda g: g * 1000)
        loss = (p + q).sum()
        (gx,) = T.autograd.grad(loss, x, retain_graph=True)
        gx2, gy = T.autograd.grad(loss, (x, y))
        return dict(gx=gx, gx2=gx2, gy=gy)

    both(run)


# ----------------------------------------------------------------------------- 9. multi grad hook

def test_multi_grad_hook_all_reached_and_unreached():
    def run(T):
        calls = []
        a = mk(T, [1.0, 2.0], rg=True)
        b = mk(T, [3.0], rg=True)

        def fn(grads):
            calls.append([gdesc(g) for g in grads])

        handle = T.autograd.graph.register_multi_grad_hook((a, b), fn)
        (a * 3).sum().backward()                    # b not reached
        (a * b).sum().backward()                    # both reached
        handle.remove()
        (a * b).sum().backward()                    # removed: no call
        return dict(calls=calls, a=a.grad, b=b.grad)

    j, t = both(run)
    assert len(t["calls"]) == 2


def test_multi_grad_hook_on_non_leaves_with_grad():
    def run(T):
        calls = []
        x = mk(T, [1.0, -2.0], rg=True)
        a = x * 2
        b = x.exp()
        T.autograd.graph.register_multi_grad_hook((a, b), lambda gs: calls.append([gdesc(g) for g in gs]))
        (g,) = T.autograd.grad((a * a + b).sum(), x)
        return dict(calls=calls, g=g)

    both(run)


def test_multi_grad_hook_argument_container_type():
    def run(T):
        kinds = []
        a = mk(T, [1.0], rg=True)
        b = mk(T, [2.0], rg=True)
        T.autograd.graph.register_multi_grad_hook((a, b), lambda gs: kinds.append(type(gs).__name__))
        (a * b).sum().backward()
        return kinds

    both(run)


# ----------------------------------------------------------------------------- 10. create_graph

def test_hook_with_create_graph_second_order():
    def run(T):
        x = mk(T, [0.5, -1.5, 2.0], rg=True)
        y = x ** 3
        y.register_hook(lambda g: g * 2)
        (g,) = T.autograd.grad(y.sum(), x, create_graph=True)
        (gg,) = T.autograd.grad(g.sum(), x)
        return dict(g=g, g_rg=g.requires_grad, gg=gg)

    j, t = both(run)
    assert t["g_rg"] is True


def test_hook_with_create_graph_capturing_a_tensor_that_requires_grad():
    def run(T):
        seen = []
        x = mk(T, [0.5, -1.5], rg=True)
        w = mk(T, [2.0, 3.0], rg=True)
        y = x.sin()

        def hook(g):
            seen.append(bool(g.requires_grad))
            return g * w

        y.register_hook(hook)
        (g,) = T.autograd.grad((y * y).sum(), x, create_graph=True)
        gx, gw = T.autograd.grad(g.sum(), (x, w))
        return dict(seen=seen, g=g, gx=gx, gw=gw)

    both(run)


def test_hook_with_create_graph_via_backward():
    def run(T):
        x = mk(T, [0.5, 1.5], rg=True)
        y = x * x
        y.register_hook(lambda g: g * 2)
        y.sum().backward(create_graph=True)
        g = x.grad
        gg = T.autograd.grad(g.sum(), x)[0]
        return dict(g=g, g_rg=g.requires_grad, gg=gg)

    both(run)


# ----------------------------------------------------------------------------- 11. exceptions

class HookBoom(Exception):
    pass


@pytest.mark.parametrize("where", ["nonleaf", "leaf", "node_pre", "node_post", "post_acc"])
def test_hook_exception_reaches_caller_and_next_backward_works(where):
    def run(T):
        state = dict(armed=True, raised=None)

        def boom(*args):
            if state["armed"]:
                state["raised"] = HookBoom("hook failed", 7)
                raise state["raised"]
            return None

        x = mk(T, [1.0, 2.0], rg=True)
        y = x * 3
        if where == "nonleaf":
            y.register_hook(boom)
        elif where == "leaf":
            x.register_hook(boom)
        elif where == "node_pre":
            y.grad_fn.register_prehook(boom)
        elif where == "node_post":
            y.grad_fn.register_hook(boom)
        else:
            x.register_post_accumulate_grad_hook(boom)
        loss = (y * y).sum()
        with pytest.raises(HookBoom) as ei:
            loss.backward(retain_graph=True)
        out = dict(same_obj=ei.value is state["raised"], args=ei.value.args,
                   grad=None if x.grad is None else to_np(x.grad).tolist())
        state["armed"] = False
        x.grad = None
        loss.backward()
        out["after"] = x.grad
        z = x * 3
        (z * z).sum().backward()
        out["after2"] = x.grad
        return out

    j, t = both(run)
    assert j["same_obj"] is True


def test_hook_exception_via_autograd_grad():
    def run(T):
        x = mk(T, [1.0, 2.0], rg=True)
        y = x.exp()

        def boom(g):
            raise HookBoom("in grad")

        h = y.register_hook(boom)
        e = capture(T.autograd.grad, y.sum(), x)
        h.remove()
        (g,) = T.autograd.grad(y.sum(), x)
        return dict(err=(type(e).__name__, e.args), g=g)

    both(run)


# ----------------------------------------------------------------------------- 12. lifetime

class Big:
    def __init__(self):
        self.payload = np.zeros(1 << 20)


def _dead_after(setup):
    """setup(T) returns a weakref; after gc.collect() it must be dead (as in torch)."""
    def run(T):
        ref = setup(T)
        gc.collect()
        return ref() is None
    return run


@pytest.mark.parametrize("case", ["nonleaf_no_backward", "nonleaf_leaf_kept_alive",
                                  "nonleaf_after_backward", "leaf",
                                  "removed_handle", "node_hooks", "post_acc", "multi_grad"])
def test_hooks_do_not_leak(case):
    def setup(T):
        big = Big()
        ref = weakref.ref(big)

        def hook(*args):
            big.payload.sum()  # noqa: F821 - the closure outlives the del below, on purpose
            return None

        x = mk(T, [1.0, 2.0], rg=True)
        if case == "nonleaf_no_backward":
            y = x * 2
            y.register_hook(hook)
            z = (y * y).sum()
            del y, z
        elif case == "nonleaf_leaf_kept_alive":
            # the leaf outlives the (never backpropagated) graph holding the hook
            y = x * 2
            y.register_hook(hook)
            z = (y.exp() * y).sum()
            del y, z
            setup.keep = x
        elif case == "nonleaf_after_backward":
            y = x * 2
            y.register_hook(hook)
            (y * y).sum().backward()
            del y
        elif case == "leaf":
            x.register_hook(hook)
            (x * x).sum().backward()
            del x
        elif case == "removed_handle":
            y = x * 2
            h = y.register_hook(hook)
            h.remove()
            del h
            # y and its graph stay alive (held by the caller's frame through keep)
            setup.keep = (x, y)
        elif case == "node_hooks":
            y = x * 2
            y.grad_fn.register_hook(hook)
            y.grad_fn.register_prehook(hook)
            y.sum().backward()
            del y
        elif case == "post_acc":
            x.register_post_accumulate_grad_hook(hook)
            (x * 3).sum().backward()
            del x
        else:
            a = x * 2
            T.autograd.graph.register_multi_grad_hook((x, a), hook)
            (a * x).sum().backward()
            del a, x
        del hook, big
        return ref

    j, t = both(_dead_after(setup))
    assert t is True


def test_removed_hook_released_while_tensor_alive():
    def run(T):
        big = Big()
        ref = weakref.ref(big)
        x = mk(T, [1.0, 2.0], rg=True)
        y = x * 2
        h = y.register_hook(lambda g, b=big: None)
        del big
        gc.collect()
        alive_before = ref() is not None
        h.remove()
        gc.collect()
        out = dict(alive_before=alive_before, dead_after=ref() is None)
        y.sum().backward()
        out["x"] = x.grad
        return out

    j, t = both(run)
    assert t["dead_after"] is True


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


# ----------------------------------------------------------------------------- 14. executors, errors of node hooks

def test_hooks_with_mixed_dtypes():
    def run(T):
        seen = []
        x = mk(T, [0.5, -1.0], "float32", rg=True)
        w = mk(T, [2.0, 3.0], "float64", rg=True)
        a = x * 2                    # float32
        b = a * w                    # promoted to float64
        a.register_hook(lambda g: (seen.append(("a", gdesc(g)[:3])), g * 3)[1])
        b.register_hook(lambda g: (seen.append(("b", gdesc(g)[:3])), g + 1)[1])
        x.register_hook(lambda g: (seen.append(("x", gdesc(g)[:3])), None)[1])
        b.grad_fn.register_hook(lambda gi, go: seen.append(("post_b", [d[:3] for d in gtuple(gi)[1]])))
        (b * b).sum().backward()
        return dict(seen=seen, x=x.grad, w=w.grad)

    both(run, "float32")


def test_hooks_on_long_chain():
    def run(T):
        calls = []
        x = mk(T, [0.3, -0.2, 0.1], rg=True)
        h = x
        for i in range(40):
            h = (h * 1.05).sin() if i % 2 else h * 0.9 + 0.01
            if i % 7 == 3:
                h.register_hook(lambda g, i=i: (calls.append(i), g * 1.5)[1])
            if i % 11 == 5:
                h.grad_fn.register_prehook(lambda go, i=i: calls.append(("pre", i)))
        h.sum().backward()
        return dict(calls=calls, x=x.grad)

    both(run)


def test_node_post_hook_replacing_none_gradient_raises():
    def run(T):
        x = mk(T, [1.0, 2.0], rg=True)
        c = mk(T, [3.0, 4.0])
        y = x * c
        y.grad_fn.register_hook(lambda gi, go: (gi[0], gi[0]))
        return dict(err=err(capture(y.sum().backward)), grad_none=x.grad is None)

    j, t = both(run)
    assert t["err"][0] == "RuntimeError"


def test_node_prehook_returning_wrong_number_of_values_raises():
    def run(T):
        x = mk(T, [1.0, 2.0], rg=True)
        y = x * 2
        y.grad_fn.register_prehook(lambda go: (go[0], go[0]))
        return dict(err=err(capture(y.sum().backward)), grad_none=x.grad is None)

    j, t = both(run)
    assert t["err"][0] == "RuntimeError"


def test_node_post_hook_with_create_graph():
    def run(T):
        x = mk(T, [0.5, -1.5], rg=True)
        y = x ** 3
        y.grad_fn.register_hook(lambda gi, go: (gi[0] * x,))
        (g,) = T.autograd.grad(y.sum(), x, create_graph=True)
        (gg,) = T.autograd.grad(g.sum(), x)
        return dict(g=g, gg=gg)

    both(run)
