"""Graph breaks: what a plan cannot replay runs eagerly, with eager's results.

A step that runs Python on tensor values (.item() in a branch), a custom Function, a
hook, an in-place op, autograd.grad ... cannot be replayed from arrays. Its signature
then runs eagerly every call (never a stale recorded value); under fullgraph=True the
first call raises GraphBreak naming the reason and the line of user code; explain()
lists the breaks. Each step below marks the offending line with `# break`.
"""
import numpy as np
import pytest
from compile_helpers import assert_plan, breaks, close, close_params, entries, line_of

import jitgrad
from jitgrad.compiler import GraphBreak
from jitgrad.compiler.api import _Eager


def ten(a, rg=False):
    return jitgrad.tensor(np.asarray(a, dtype=np.float64), requires_grad=rg)


class Square(jitgrad.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2.0 * g * x


def custom_function(w, opt, x):
    loss = Square.apply(w * x).sum()  # break
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


def tensor_hook(w, opt, x):
    y = w * x
    y.register_hook(lambda g: g * 2.0)  # break
    loss = y.tanh().sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


def item_branch(w, opt, x):
    loss = (w * x).sum()
    if loss.item() > 0:  # break
        loss = loss * 3.0
    else:
        loss = -loss
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


def bool_branch(w, opt, x):
    s = (w * x).sum()
    loss = (s * 0.1).exp() if s > 0 else s * s  # break
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


def float_of_tensor(w, opt, x):
    loss = (w * x).sum()
    scale = float(loss.detach())  # break
    loss = loss * (2.0 if scale > 0 else -1.0)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss, scale


def tolist(w, opt, x):
    y = w * x
    vals = y.tolist()  # break
    loss = (y * max(vals)).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


def numpy_read(w, opt, x):
    y = w * x
    big = np.asarray(x) > 0  # break
    loss = jitgrad.where(jitgrad.tensor(big), y, y * 0.5).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


def in_place(w, opt, x):
    y = w * x
    y.mul_(2.0)  # break
    loss = y.tanh().sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


def item_assignment(w, opt, x):
    y = w * x
    y[0] = 0.0  # break
    loss = y.sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


def autograd_grad(w, opt, x):
    loss = ((w * x).tanh() ** 2).sum()
    (g,) = jitgrad.autograd.grad(loss, [w])  # break
    w.grad = g
    opt.step()
    opt.zero_grad()
    return loss.detach(), g


def retain_grad(w, opt, x):
    y = w * x
    y.retain_grad()  # break
    loss = y.tanh().sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss, y.grad


def create_graph(w, opt, x):
    loss = ((w * x).tanh() ** 2).sum()
    loss.backward(create_graph=True)  # break
    with jitgrad.no_grad():
        gnorm = (w.grad * w.grad).sum()
    opt.step()
    opt.zero_grad()
    return loss.detach(), gnorm


def step_with_closure(w, opt, x):
    def closure():
        opt.zero_grad()
        loss = ((w * x).tanh() ** 2).sum()
        loss.backward()
        return loss
    return opt.step(closure)  # break


def node_hook(w, opt, x):
    y = w * x
    y.grad_fn.register_hook(lambda gi, go: tuple(None if g is None else g * 0.5 for g in gi))
    loss = y.tanh().sum()
    loss.backward()  # break
    opt.step()
    opt.zero_grad()
    return loss


def saved_tensors_hooks(w, opt, x):
    with jitgrad.autograd.graph.saved_tensors_hooks(lambda t: t * 1.0, lambda t: t):
        loss = (w * x * 0.1).exp().sum()
    loss.backward()  # break
    opt.step()
    opt.zero_grad()
    return loss


# step -> what the break's reason says
STEPS = {
    custom_function: "custom autograd.Function Square",
    tensor_hook: "tensor hook",
    item_branch: "Tensor.item()",
    bool_branch: "bool() of a tensor",
    float_of_tensor: "Tensor.item()",
    tolist: "Tensor.tolist()",
    numpy_read: "converted to a numpy array",
    in_place: "in-place op",
    item_assignment: "item assignment",
    autograd_grad: "autograd.grad()",
    retain_grad: "retain_grad()",
    create_graph: "create_graph=True",
    step_with_closure: "optimizer.step(closure)",
    node_hook: "hooks",
    saved_tensors_hooks: "saved-tensor hooks",
}
IDS = [f.__name__ for f in STEPS]


def twins(body):
    """body over a parameter and an SGD optimizer, built twice: (eager step, its
    parameter, compiled step, its parameter)."""
    made = []
    for _ in range(2):
        w = ten([0.5, -1.0, 2.0], rg=True)
        opt = jitgrad.optim.SGD([w], lr=0.05, momentum=0.5)
        made.append((lambda x, w=w, opt=opt: body(w, opt, x), w))
    (eager, we), (step, wc) = made
    return eager, we, step, wc


# inputs whose loss changes sign: a branch on a value takes both sides
INPUTS = [[1.0, 0.5, 2.0], [-1.0, -0.5, -2.0], [2.0, 1.0, 1.5], [-3.0, 0.5, -1.0]]


@pytest.mark.parametrize("body", list(STEPS), ids=IDS)
def test_a_break_runs_eagerly_with_eagers_results(body):
    eager, we, step, wc = twins(body)
    c = jitgrad.compile(step)
    for k, x in enumerate(INPUTS):
        close(c(ten(x)), eager(ten(x)), msg=f"call {k}")
        close_params([wc], [we], msg=f"call {k}")
    (e,) = entries(c)
    assert type(e) is _Eager
    assert any(STEPS[body] in reason for reason, _ in e.breaks), e.breaks


# breaks found when the plan is built, after the step ran (the others stop it where they are)
AFTER_THE_STEP = {node_hook, saved_tensors_hooks}


@pytest.mark.parametrize("body", list(STEPS), ids=IDS)
def test_fullgraph_raises_naming_the_reason_and_the_line(body):
    _, _, step, wc = twins(body)
    c = jitgrad.compile(step, fullgraph=True)
    with pytest.raises(GraphBreak, match="fullgraph=True") as info:
        c(ten(INPUTS[0]))
    msg = str(info.value)
    assert STEPS[body] in msg and msg.endswith(f" at {line_of(body, '# break')}"), msg
    assert entries(c) == []
    if body not in AFTER_THE_STEP:  # raised at the break: no backward, no update happened
        assert wc.grad is None
        close(wc, ten([0.5, -1.0, 2.0]))
    assert not jitgrad._core.capture.state.on


@pytest.mark.parametrize("body", [item_branch, in_place, custom_function], ids=["item", "in_place", "function"])
def test_explain_lists_the_breaks(body):
    _, _, step, _ = twins(body)
    out = jitgrad.compiler.explain(step, ten(INPUTS[0]))
    assert out.graph_break_count == len(out.break_reasons) >= 1
    assert out.graph_count == 0
    first = out.break_reasons[0]
    assert STEPS[body] in first and first.endswith(f"({line_of(body, '# break')})")
    text = str(out)
    assert "Graph Break Count: " in text and "Break Reason 1: " + first in text


def test_explain_of_a_clean_step_and_its_call_forms():
    w = ten([0.5, -1.0], rg=True)

    def step(x):
        loss = (x * w).tanh().sum()
        loss.backward()
        return loss

    out = jitgrad.compiler.explain(step, ten([1.0, 2.0]))
    assert (out.graph_count, out.graph_break_count, out.break_reasons) == (1, 0, [])
    assert out.op_count == 3  # mul, tanh, sum
    assert "Graph Count: 1" in str(out)
    assert jitgrad.compiler.explain(step)(ten([1.0, 2.0])).op_count == 3
    c = jitgrad.compile(step)
    assert jitgrad.compiler.explain(c, ten([1.0, 2.0])).op_count == 3
    assert entries(c) == []  # explain records on a compiled function of its own


def test_a_break_belongs_to_its_signature_only():
    """.item() only for 2-d inputs: the 1-d signature keeps its plan."""
    w = ten([0.5, -1.0, 2.0], rg=True)

    def step(x):
        loss = (x * w).sum()
        if x.dim() == 2 and loss.item() > 0:
            loss = loss * 2.0
        return loss.detach() if loss.requires_grad else loss

    c = jitgrad.compile(step)
    with jitgrad.no_grad():
        for k in range(3):
            close(c(ten([1.0, 2.0, k])), step(ten([1.0, 2.0, k])))
            close(c(ten([[1.0, 2.0, k]])), step(ten([[1.0, 2.0, k]])))
    kinds = [type(e).__name__ for e in entries(c)]
    assert kinds == ["_Entry", "_Eager"]
    assert "Tensor.item()" in breaks(c)[0][0]


def test_hooks_on_a_parameter_run_every_call():
    """A hook registered on a leaf before the step, or between calls, runs as eagerly."""
    eager, we, step, wc = twins(lambda w, opt, x: _loss_step(w, opt, x))
    c = jitgrad.compile(step)
    seen = {"eager": [], "compiled": []}
    for k, x in enumerate(INPUTS):
        if k == 1:  # after a plan was made
            we.register_hook(lambda g: (seen["eager"].append(k), g * 10.0)[1])
            wc.register_hook(lambda g: (seen["compiled"].append(k), g * 10.0)[1])
        if k == 2:
            we.register_post_accumulate_grad_hook(lambda p: seen["eager"].append("post"))
            wc.register_post_accumulate_grad_hook(lambda p: seen["compiled"].append("post"))
        close(c(ten(x)), eager(ten(x)), msg=f"call {k}")
        close_params([wc], [we], msg=f"call {k}")
    assert seen["compiled"] == seen["eager"] and len(seen["eager"]) == 5


def test_a_hook_on_an_argument_runs():
    def step(x):
        loss = (x * x).sum()
        loss.backward()
        return loss

    c = jitgrad.compile(step)
    for k in range(3):
        xe, xc = ten([1.0, 2.0 + k], rg=True), ten([1.0, 2.0 + k], rg=True)
        if k == 2:
            xe.register_hook(lambda g: g * 3.0)
            xc.register_hook(lambda g: g * 3.0)
        close(c(xc), step(xe))
        close(xc.grad, xe.grad, msg=f"call {k}")


def _loss_step(w, opt, x):
    loss = ((w * x).tanh() ** 2).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


def test_a_clean_step_under_fullgraph_replays():
    eager, we, step, wc = twins(_loss_step)
    c = jitgrad.compile(step, fullgraph=True)
    for k, x in enumerate(INPUTS):
        close(c(ten(x)), eager(ten(x)), msg=f"call {k}")
        close_params([wc], [we], msg=f"call {k}")
    assert_plan(c)


def test_reading_a_grad_from_before_the_step_breaks():
    """A .grad accumulated before the step is not a value of the plan: eager."""
    eager, we, step, wc = twins(lambda w, opt, x: ((w * x).sum() * w.grad.sum()))
    for w in (we, wc):
        (w * 2.0).sum().backward()
    c = jitgrad.compile(step)
    with jitgrad.no_grad():
        for k, x in enumerate(INPUTS):
            for w in (we, wc):
                w.grad = ten([1.0, k, -1.0])
            close(c(ten(x)), eager(ten(x)), msg=f"call {k}")
    assert "reads a .grad made before the step" in breaks(c)[0][0]
