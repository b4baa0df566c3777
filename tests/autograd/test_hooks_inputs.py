"""Which hooks run under autograd.grad(inputs=) and backward(inputs=), PyTorch 2.13's rules:
grad() runs no requested node for itself (a requested tensor's hooks run, its node's hooks
and a leaf's AccumulateGrad hooks do not); backward(inputs=) runs the requested nodes; a
retained .grad fills in both. Each scenario runs on jitgrad and torch and the logs must
be equal."""
import numpy as np
import pytest
from conftest import LIBS, assert_close

torch = pytest.importorskip("torch")
import jitgrad  # noqa: E402

CALLS = ["grad(c, b)", "grad(c, (a, b))", "grad(c, a)", "c.backward()", "c.backward(inputs=(a, b))",
         "c.backward(inputs=(b,))", "c.backward(inputs=(a,))"]


def chain_log(T, call, retain):
    a = T.tensor(1.0, requires_grad=True)
    b = a * 2
    c = b * 2
    log = []
    a.register_hook(lambda g: log.append(("a.hook", g.item())))
    b.register_hook(lambda g: log.append(("b.hook", g.item())))
    acc = b.grad_fn.next_functions[0][0]
    acc.register_prehook(lambda g: log.append("acc.pre"))
    acc.register_hook(lambda gi, go: log.append("acc.post"))
    b.grad_fn.register_prehook(lambda g: log.append("b_fn.pre"))
    b.grad_fn.register_hook(lambda gi, go: log.append("b_fn.post"))
    c.grad_fn.register_prehook(lambda g: log.append("c_fn.pre"))
    c.grad_fn.register_hook(lambda gi, go: log.append("c_fn.post"))
    if retain:
        b.retain_grad()
    out = eval(call, {"grad": T.autograd.grad, "a": a, "b": b, "c": c})  # noqa: S307  (the calls above)
    got = [g.item() for g in out] if isinstance(out, tuple) else None
    return log, got, (None if a.grad is None else a.grad.item()), \
        (b.grad.item() if b.retains_grad and b.grad is not None else None), b.retains_grad


@pytest.mark.parametrize("retain", [False, True])
@pytest.mark.parametrize("call", CALLS)
def test_which_hooks_run_matches_torch(call, retain):
    assert chain_log(jitgrad, call, retain) == chain_log(torch, call, retain)


@LIBS
def test_prehook_order_and_what_backward_inputs_accumulates(T):
    log = []

    def times3(g):
        log.append(1)
        return g * 3

    def times2(gs):
        log.append(2)
        return tuple(g * 2 for g in gs)

    a = T.tensor(1.0, requires_grad=True)
    b = a.clone()
    b.grad_fn.register_prehook(times2)
    b.register_hook(times3)
    b.grad_fn.register_prehook(times2)
    acc = b.grad_fn.next_functions[0][0]
    a.register_hook(times3)
    acc.register_prehook(times2)
    a.register_hook(times3)
    b.sum().backward(retain_graph=True)
    assert log == [1, 2, 2, 1, 1, 2]
    assert a.grad.item() == 3 * 4 * 9 * 2
    log.clear()
    (g,) = T.autograd.grad(b.sum(), inputs=(a,), retain_graph=True)
    assert log == [1, 2, 2, 1, 1] and g.item() == 3 * 4 * 9  # no AccumulateGrad pre-hook
    log.clear()
    b.sum().backward(inputs=(b,))
    assert log == [1, 2, 2]
    assert b.grad.item() == 3  # retained after the tensor hook, before the node's pre-hooks


@LIBS
def test_unrequested_leaves_hooks_do_not_run(T):
    def boom(*_):
        raise RuntimeError("must not run")

    a = T.tensor(1.0, requires_grad=True)
    a.register_hook(boom)
    b = T.tensor(1.0, requires_grad=True)
    c = a.clone()
    c.grad_fn.next_functions[0][0].register_hook(boom)
    (a + b + c).sum().backward(inputs=[b])
    assert b.grad.item() == 1.0 and a.grad is None


@LIBS
def test_grad_captures_a_node_s_gradient_before_its_hooks_when_the_node_runs(T):
    a = T.tensor(1.0, requires_grad=True)
    b = a * 2
    c = b * 2
    b.register_hook(lambda g: g * 10)
    ga, gb = T.autograd.grad(c, (a, b), retain_graph=True)
    assert (ga.item(), gb.item()) == (40.0, 2.0)
    (gb,) = T.autograd.grad(c, (b,))
    assert gb.item() == 20.0


@LIBS
def test_a_retained_grad_fills_under_grad_and_backward_inputs_counts_once(T):
    x = T.tensor([1.0, 2.0], requires_grad=True)
    y = x * 3
    y.retain_grad()
    z = (y * y).sum()
    T.autograd.grad(z, x, retain_graph=True)
    assert_close(y.grad, [6.0, 12.0])
    z.backward(inputs=[y], retain_graph=True)
    assert_close(y.grad, [12.0, 24.0])
    w = x * 5
    (w * w).sum().backward(inputs=[w])
    assert w.retains_grad
    assert_close(w.grad, [10.0, 20.0])
    assert x.grad is None


@LIBS
def test_grad_on_intermediates_leaves_the_graph_below_usable_with_hooks_present(T):
    leaves = [T.zeros(2, 2, requires_grad=True) for _ in range(4)]
    leaves[0].register_hook(lambda g: None)  # a hook anywhere must not change what is freed
    inter = [x * i + x * x for i, x in enumerate(leaves)]
    loss = sum(v * i for i, v in enumerate(inter)).sum()
    d = list(T.autograd.grad(loss, inter[:2])) + list(T.autograd.grad(loss, inter[2:]))
    T.autograd.backward(inter, d)
    for i, x in enumerate(leaves):
        assert_close(x.grad, np.full((2, 2), i * i, dtype=np.float32))


@LIBS
def test_a_custom_function_on_the_path_runs_once_under_grad_inputs(T):
    runs = []

    class Twice(T.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            runs.append(1)
            return g * 2

    a = T.tensor(1.0, requires_grad=True)
    b = Twice.apply(a)
    b.register_hook(lambda g: g + 1)
    c = b * 3
    ga, gb = T.autograd.grad(c, (a, b))
    assert (ga.item(), gb.item(), len(runs)) == (8.0, 3.0, 1)
