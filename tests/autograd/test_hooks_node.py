"""Node hooks and hooks in the engine: jitgrad against torch 2.13.

``Node.register_hook`` / ``Node.register_prehook``, execution order, selective execution,
``autograd.graph.register_multi_grad_hook``, ``create_graph``, exceptions, lifetime, and node-hook
errors.  (Tensor hooks: test_hooks_tensor.py.)

Every test runs the same code with both libraries (``T`` is ``jitgrad`` or ``torch``) and
compares the results (values as float64 numpy, call orders as lists of strings, error
types/messages), so real PyTorch 2.13 decides every expectation.
"""
import gc
import weakref

import numpy as np
import pytest
from conftest import both, capture, err, gdesc, gtuple, mk, to_np

torch = pytest.importorskip("torch")



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
