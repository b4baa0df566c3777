"""Behaviours PyTorch's test_autograd.py checks that sit between the owners of issue 13.

Each one crosses engine, hooks, custom Functions, grad modes and in-place ops at once, so no
single family's tests own it; they guard the merge of the issue-13 branches.  Every test runs
the same code with jitgrad and with torch 2.13 (``both``) in float64 and compares everything
it returns: values, call orders, flags, error types and messages.
"""
import threading

import pytest
from conftest import both, err_of, mk

torch = pytest.importorskip("torch")


def test_gradient_buffered_in_three_places_is_not_summed_in_place():
    # one incoming gradient reaches x through a, c and add2: each use must get its own buffer
    def run(T):
        x = mk(T, [[1.0, 2.0], [3.0, 4.0]], rg=True)
        y = mk(T, [[0.5, -1.0], [2.0, 0.25]], rg=True)
        a, b, c = x + 2, y + 2, x + 2
        add2 = (a + b) + c
        for _ in range(4):
            a, b, c = a * 2, b * 2, c * 2
        (add2 + a + b + c).backward(T.ones(2, 2, dtype=T.float64))
        return x.grad, y.grad

    both(run)


def test_backward_of_two_dependent_roots_sums_both_paths():
    def run(T):
        x = mk(T, [0.3, -1.2, 2.0], rg=True)
        y = x ** 2
        z = y ** 3
        T.autograd.backward([y, z], [mk(T, [1.0, 2.0, -1.0]), mk(T, [0.5, 0.5, 2.0])])
        return x.grad

    both(run)


def test_backward_twice_through_the_same_root_listed_twice():
    def run(T):
        a = mk(T, [1.0, 2.0], rg=True)
        b = mk(T, [3.0, -4.0], rg=True)
        x = a * b
        go = mk(T, [0.5, 1.5])
        T.autograd.backward([x, x], [go, go])
        return a.grad, b.grad

    both(run)


def test_backward_inputs_nonleaf_create_graph_and_an_unused_input():
    def run(T):
        x = mk(T, [[0.5, 1.0], [-1.0, 2.0]], rg=True)
        mid = x * 1
        y = mk(T, [[1.0, -0.5], [0.25, 3.0]], rg=True)
        z = mk(T, [1.0, 2.0], rg=True)
        out = mid ** 2 + y * mid + y ** 2
        out.backward(T.ones(2, 2, dtype=T.float64), create_graph=True, inputs=[x, y, mid])
        grads = (x.grad.detach(), y.grad.detach(), mid.grad.detach(), x.grad.requires_grad)
        out.backward(T.ones(2, 2, dtype=T.float64), create_graph=True, inputs=[z])
        return grads, z.grad is None

    both(run)


def test_hook_on_leaf_running_a_reentrant_backward():
    # a gradient-penalty hook: the hook itself calls backward on a fresh graph
    def run(T):
        param = mk(T, [0.5, -1.0, 2.0], rg=True)
        state = {}

        def penalty(grad):
            state["handle"].remove()
            with T.enable_grad():
                g = grad.detach().requires_grad_()
                ((g * 2) + param.detach()).sum().backward()
            return g.grad + grad

        state["handle"] = param.register_hook(penalty)
        (param * param).sum().backward()
        return param.grad

    both(run)


def test_reentrant_backward_tasks_run_before_the_outer_graph_continues():
    def run(T):
        order = []

        class Plain(T.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x

            @staticmethod
            def backward(ctx, g):
                order.append("plain")
                return g

        class Reentrant(T.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                with T.enable_grad():
                    ctx.x = x.detach().requires_grad_() - 1
                return ctx.x.detach()

            @staticmethod
            def backward(ctx, g):
                order.append("reentrant")
                if ctx.x < 0:
                    return g
                with T.enable_grad():
                    Reentrant.apply(ctx.x).backward()
                return g

        a = Plain.apply(mk(T, 6.0, rg=True))
        b = Reentrant.apply(mk(T, 4.0, rg=True))
        (a * b).backward()
        return order

    both(run)


def test_grad_mode_inside_a_custom_backward_is_restored_after_a_nested_grad():
    def run(T):
        seen = []

        class F(T.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x.clone()

            @staticmethod
            def backward(ctx, go):
                before = T.is_grad_enabled()
                with T.enable_grad():
                    foo = mk(T, [0.5, 1.0, 1.5], rg=True)
                    (g,) = T.autograd.grad(foo ** 3, foo, grad_outputs=go)
                seen.append((before, T.is_grad_enabled()))
                return g

        x = mk(T, [1.0, 2.0, 3.0], rg=True)
        F.apply(x).sum().backward()
        F.apply(x).sum().backward(create_graph=True)
        return seen, x.grad.detach()

    both(run)


def test_set_grad_enabled_used_as_a_decorator_leaves_the_global_mode_alone():
    def run(T):
        out = []
        with T.enable_grad():
            @T.set_grad_enabled(False)
            def inner(x):
                return x.sin()

            out.append(T.is_grad_enabled())
            obj = T.set_grad_enabled(False)          # the call itself flips the mode ...
            out.append(T.is_grad_enabled())
            wrapped = obj(lambda x: x.sin())         # ... and decorating restores it
            out.append(T.is_grad_enabled())
            x = mk(T, [1.0], rg=True)
            out += [inner(x).requires_grad, wrapped(x).requires_grad]
        return out

    both(run)


def test_threads_backward_into_one_shared_leaf_accumulate():
    def run(T):
        x = T.ones(5, 5, dtype=T.float64, requires_grad=True)
        errors = []

        def work():
            try:
                ((x + 3) * (x + 4) * 0.5).sum().backward()
            except Exception as e:  # noqa: BLE001  (re-raised below, in the main thread)
                errors.append(e)

        threads = [threading.Thread(target=work) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return x.grad

    both(run)


def test_item_assignment_under_no_grad_and_of_a_requires_grad_value():
    def run(T):
        x = T.zeros(3, 2, dtype=T.float64, requires_grad=True)
        with T.no_grad():
            x[0] = mk(T, [1.0, 2.0])
        plain = T.zeros(3, 2, dtype=T.float64)
        y = mk(T, [0.5, -0.5], rg=True)
        z = mk(T, [2.0, 3.0], rg=True)
        plain[0] = y
        plain[1] = 2 * z
        # (the node name, CopySlices in torch, is checked in test_gaps.py)
        flags = (x.requires_grad, x.grad_fn is None, plain.requires_grad)
        (plain * plain).sum().backward()
        return flags, y.grad, z.grad

    both(run)


def test_pow_of_a_zero_base_has_the_limit_gradients():
    def run(T):
        b = mk(T, [-1.0, 0.0, 1.0], rg=True)
        (mk(T, [0.0, 0.0, 0.0]) ** b).sum().backward()
        g1 = b.grad.clone()
        b.grad = None
        (0 ** b).sum().backward()
        return g1, b.grad

    both(run)


def test_custom_function_outputs_returned_twice_and_marked_non_differentiable():
    def run(T):
        class Twice(T.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                out = x * 2
                return out, out

            @staticmethod
            def backward(ctx, g1, g2):
                return g1 * 2 + g2 * 2

        class Mixed(T.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                a, b = x + 1, x + 2
                ctx.mark_non_differentiable(a)
                return a, b

            @staticmethod
            def backward(ctx, ga, gb):
                return gb + ga

        x = mk(T, [1.0, -2.0], rg=True)
        a, b = Twice.apply(x)
        (a + b).sum().backward()
        g = x.grad.clone()
        x.grad = None
        m, n = Mixed.apply(x)
        (n * 3).sum().backward()
        return a is b, g, m.requires_grad, n.requires_grad, x.grad

    both(run)


def test_nested_saved_tensors_hooks_the_inner_pair_wins_and_numbers_skip_them():
    def run(T):
        calls = []
        with T.autograd.graph.saved_tensors_hooks(lambda t: 3 * t, lambda t: 3 * t):
            b = mk(T, [1.0, 2.0], rg=True)
            with T.autograd.graph.saved_tensors_hooks(lambda t: 5 * t, lambda t: 5 * t):
                a = mk(T, [0.5, -1.0], rg=True)
                y = a * a
            z = b * b
        y.sum().backward()
        z.sum().backward()

        def pack(t):
            calls.append("pack")
            return t

        with T.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            c = mk(T, [1.0, 2.0], rg=True)
            T.autograd.grad((c * 3).sum(), (c,))
        return a.grad, b.grad, calls

    both(run)


def test_sharded_grad_then_backward_from_the_intermediates():
    def run(T):
        leaves = [T.zeros(2, 2, dtype=T.float64, requires_grad=True) + i for i in range(4)]
        leaves = [lf.detach().requires_grad_() for lf in leaves]
        inter = [lf * i + lf * lf for i, lf in enumerate(leaves)]
        loss = sum(v * i for i, v in enumerate(inter)).sum()
        d = [g for k in range(0, 4, 2) for g in T.autograd.grad(loss, inter[k:k + 2], retain_graph=True)]
        T.autograd.backward(inter, d)
        return [lf.grad for lf in leaves]

    both(run)


def test_backward_errors_on_roots_that_need_no_grad():
    def run(T):
        x = mk(T, [1.0, 2.0], rg=True)
        y = mk(T, [3.0, 4.0])
        z, q = x + y, y * 2
        ones = T.ones(2, dtype=T.float64)
        return (err_of(lambda: T.autograd.backward([z, q], [ones, ones]))[0],
                err_of(lambda: T.autograd.backward([x + 2], [None]))[0],
                err_of(lambda: T.autograd.backward(x * 2, ones, inputs=[]))[0])  # message: test_gaps.py

    both(run)


def _first_sentence(e):
    return None if e is None else (e[0], e[1].split(". ")[0])


def test_outputs_of_multi_view_ops_are_views_that_refuse_in_place_writes():
    # between the new ops (unbind/split/chunk/split_with_sizes) and the view mechanism: PyTorch
    # marks their outputs as views made by a function returning several views
    def run(T):
        out = []
        for make in (lambda t: t.unbind(), lambda t: t.split(1), lambda t: t.chunk(3),
                     lambda t: t.split_with_sizes([1, 2])):
            base = T.arange(9.0, dtype=T.float64).reshape(3, 3).requires_grad_() * 1
            parts = make(base)
            out.append([p._is_view() for p in parts])
            out.append(_first_sentence(err_of(lambda: parts[0].mul_(2))))
            with T.no_grad():
                made_without_grad = make(base)
            out.append(_first_sentence(err_of(lambda: made_without_grad[0].mul_(2))))
            plain = T.zeros(3, 3, dtype=T.float64)
            make(plain)[0].add_(1)          # no autograd involved: allowed, writes through
            out.append(plain.sum().item())
        return out

    both(run)
