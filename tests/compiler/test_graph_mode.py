"""A compiled function that returns tensors requiring grad, with no backward() of its own
(torch.compile(model)'s usual use): each replay hands back a graph of its own, which a
backward outside the compiled code runs through as through an eager one."""
import numpy as np
import pytest
from compile_helpers import assert_plan, close, close_params

import jitgrad


class Net(jitgrad.nn.Module):
    def __init__(self, dtype):
        super().__init__()
        self.w = jitgrad.nn.Parameter(jitgrad.tensor(np.linspace(-1.0, 1.0, 6), dtype=dtype))
        self.b = jitgrad.nn.Parameter(jitgrad.tensor(np.linspace(0.5, -0.5, 6), dtype=dtype))

    def forward(self, x):
        h = (self.w * x + self.b).tanh()
        return h * h.sigmoid(), h.sum(0)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_compiled_module_trains_with_backward_outside(dtype):
    dt = getattr(jitgrad, dtype)
    eager, twin = Net(dt), Net(dt)
    compiled = jitgrad.compile(twin)
    opts = [jitgrad.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (eager, compiled)]
    rng = np.random.default_rng(0)
    for k in range(4):
        x = jitgrad.tensor(rng.standard_normal((3, 6)), dtype=dt)
        for m, opt in zip((eager, compiled), opts):
            opt.zero_grad()
            a, s = m(x)
            assert a.requires_grad and a.grad_fn is not None
            ((a * a).mean() + s.sum()).backward()
            opt.step()
        close_params(list(compiled.parameters()), list(eager.parameters()), dtype, f"call {k}")
    assert_plan(compiled._compiled)


def test_two_forwards_before_one_backward_and_an_argument_that_requires_grad():
    eager, twin = Net(jitgrad.float64), Net(jitgrad.float64)
    compiled = jitgrad.compile(twin)
    rng = np.random.default_rng(1)
    for k in range(3):
        xs = [rng.standard_normal((2, 6)) for _ in range(2)]
        grads = []
        for m in (eager, compiled):
            x1 = jitgrad.tensor(xs[0], requires_grad=True)
            x2 = jitgrad.tensor(xs[1], requires_grad=True)
            (m(x1)[1] * m(x2)[1]).sum().backward()
            grads.append((x1.grad, x2.grad))
        close(grads[1], grads[0], msg=f"call {k}: the arguments' .grad")
        close_params(list(compiled.parameters()), list(eager.parameters()), msg=f"call {k}")
    assert_plan(compiled._compiled)


def test_a_parameter_changed_in_place_before_backward_is_caught_as_in_eager():
    m = jitgrad.compile(Net(jitgrad.float64))
    x = jitgrad.tensor(np.ones((2, 6)), requires_grad=True)  # (so w * x saves w)
    m(x)  # recorded
    a, _ = m(x)  # replayed: a graph over this call's values
    with jitgrad.no_grad():
        m.w.mul_(2.0)
    with pytest.raises(RuntimeError, match="one of the variables needed for gradient computation has been modified"):
        a.sum().backward()


def test_each_call_keeps_its_own_values():
    """The graph of an earlier call reads that call's values, not the latest call's."""
    eager, twin = Net(jitgrad.float64), Net(jitgrad.float64)
    compiled = jitgrad.compile(twin)
    x1, x2 = (jitgrad.tensor(np.full((2, 6), v)) for v in (0.3, -1.7))
    outs = {}
    for name, m in (("eager", eager), ("compiled", compiled)):
        m(x1)
        first = m(x1)[0]
        m(x2)  # a later call before the first one's backward
        first.sum().backward()
        outs[name] = [p.grad for p in m.parameters()]
    close(outs["compiled"], outs["eager"])


# --- in-place writes between a compiled forward and backward(), against PyTorch ------------------
class Saver:
    """Modules whose graphs save a parameter, a buffer, the arguments or their own output (or
    not: x * w saves no w when x needs no gradient), built alike for jitgrad and torch."""

    def __init__(self, lib, kind):
        dt = lib.float64
        m = lib.nn.Module()
        m.w = lib.nn.Parameter(lib.tensor(np.linspace(-1.0, 1.0, 6), dtype=dt))
        m.s = lib.nn.Parameter(lib.tensor(0.7, dtype=dt))
        m.register_buffer("scale", lib.tensor(np.linspace(0.5, 1.5, 6), dtype=dt))
        forward = {"tanh": lambda x, c: (m.w * x).tanh(),          # saves x (w's gradient) and its result
                   "w*x": lambda x, c: (m.w * x + c).sum(0),      # saves x only
                   "s*x": lambda x, c: (x * m.s).exp(),            # one-element s, not saved
                   "s*w*x": lambda x, c: (m.s * m.w * x).sum(),    # one-element s, saved
                   "w*c": lambda x, c: (m.w * c).sum(0),           # a one-element argument, saved
                   "buffer": lambda x, c: (m.w * m.scale * x).sum(),
                   "x*c*w": lambda x, c: (x * c * m.w).sum(),
                   # views of an argument or a parameter saved: they share its version
                   "x[0]*w": lambda x, c: (x[0] * m.w).sum(),
                   "x.t()@w": lambda x, c: (x.t() @ m.w.reshape(2, 3)).sum(),
                   "x.view*w": lambda x, c: (x.view(12)[3:9] * m.w).sum(),
                   "w[1:]*x": lambda x, c: (m.w[1:] * x[0, 1:]).tanh().sum()}[kind]
        m.forward = forward
        self.m, self.lib = m, lib


WRITES = {  # what is written in place (under no_grad) between the forward and backward()
    "w.mul_": lambda m, x, c, out: m.w.mul_(2.0),
    "w.zero_": lambda m, x, c, out: m.w.zero_(),
    "w[0] = 5": lambda m, x, c, out: m.w.__setitem__(0, 5.0),
    "w.copy_": lambda m, x, c, out: m.w.copy_(m.w * 0 + 1),
    "w.data.mul_ (not seen)": lambda m, x, c, out: m.w.data.mul_(2.0),
    "s.mul_": lambda m, x, c, out: m.s.mul_(2.0),
    "scale.mul_": lambda m, x, c, out: m.scale.mul_(2.0),
    "x.mul_": lambda m, x, c, out: x.mul_(2.0),
    "c.add_": lambda m, x, c, out: c.add_(1.0),
    "out.mul_": lambda m, x, c, out: out.mul_(2.0),
    "SGD step": lambda m, x, c, out: m.w.sub_(0.1 * m.w),
    "nothing": lambda m, x, c, out: None,
}


def _inplace_then_backward(lib, kind, write, compiled, which, x_grad):
    """The error message, or the parameters' gradients, of backward() through call `which`
    of three after `write`."""
    m = Saver(lib, kind).m
    f = jitgrad.compile(m) if compiled else m
    calls = []
    for k in range(3):
        x = lib.tensor(np.linspace(0.1, 0.9, 12).reshape(2, 6) * (k + 1), dtype=lib.float64, requires_grad=x_grad)
        c = lib.tensor(0.5 + k, dtype=lib.float64)
        calls.append((f(x, c), x, c))
    out, x, c = calls[which]
    with lib.no_grad():
        WRITES[write](m, x, c, out)
    try:
        out.sum().backward()
    except RuntimeError as e:
        return str(e)
    return [None if p.grad is None else p.grad.numpy().copy() for p in (m.w, m.s)]


@pytest.mark.parametrize("kind", ["tanh", "w*x", "s*x", "s*w*x", "w*c", "buffer", "x*c*w", "x[0]*w", "x.t()@w",
                                  "x.view*w", "w[1:]*x"])
def test_an_in_place_write_before_backward_raises_where_eager_raises(kind):
    """torch's eager result for every write, on the last call's graph and on an earlier
    one's, with and without a gradient for the argument: its "modified by an inplace
    operation" error, or its gradients (a write to a value no gradient reads is no error)."""
    torch = pytest.importorskip("torch")
    for which, x_grad in ((2, False), (0, False), (2, True)):
        for write in WRITES:
            want = _inplace_then_backward(torch, kind, write, False, which, x_grad)
            got = _inplace_then_backward(jitgrad, kind, write, True, which, x_grad)
            msg = f"{kind}, {write}, call {which}, x requires grad: {x_grad}"
            if isinstance(want, str):
                assert isinstance(got, str), f"{msg}: torch raised {want[:80]!r}, compiled gave {got}"
                assert got.startswith("one of the variables needed for gradient computation has been modified "
                                      "by an inplace operation"), f"{msg}: {got}"
                assert want.startswith(got[:90]), msg
            else:
                assert not isinstance(got, str), f"{msg}: compiled raised {got[:80]!r}, torch did not"
                close(got, [None if g is None else g for g in want], msg=msg)


def test_a_returned_tensor_without_grad_that_the_graph_saved_is_checked():
    """The step returns a mask it multiplied by (saved for the gradient): writing into the
    returned mask before backward() raises, as in eager, where the mask is the saved tensor."""
    torch = pytest.importorskip("torch")

    def run(lib, compiled, write):
        m = lib.nn.Module()
        m.w = lib.nn.Parameter(lib.tensor(np.linspace(-1.0, 1.0, 6), dtype=lib.float64))

        def forward(x):
            mask = (x > 0.3).to(x.dtype)
            return (m.w * x * mask).sum(), mask
        m.forward = forward
        f = jitgrad.compile(m) if compiled else m
        for k in range(3):
            out, mask = f(lib.tensor(np.linspace(0.0, 1.0, 6) * (k + 1) / 2, dtype=lib.float64))
        if write:
            mask.mul_(2.0)
        try:
            out.backward()
        except RuntimeError as e:
            return str(e)[:90]
        return m.w.grad.numpy().copy()
    for write in (False, True):
        want, got = run(torch, False, write), run(jitgrad, True, write)
        if write:
            assert got == want == ("one of the variables needed for gradient computation has been modified by an "
                                   "inplace opera"), got
        else:
            close(got, want)


@pytest.mark.parametrize("mode", ["create_graph", "anomaly"])
def test_the_python_engine_reads_each_calls_saved_values(mode):
    """backward(create_graph=True) and anomaly mode run a compiled module's graph on the
    Python engine, which reads the saved values themselves: those of the call that made the
    graph (an earlier call's too), as eager's."""
    got = {}
    for name, compiled in (("eager", False), ("compiled", True)):
        m = Net(jitgrad.float64)
        f = jitgrad.compile(m) if compiled else m
        outs = [f(jitgrad.tensor(np.linspace(-1.0, 1.0, 12).reshape(2, 6) * (k + 1))) for k in range(3)]
        grads = []
        for a, s in (outs[2], outs[0]):
            loss = (a * a).sum() + s.sum()
            if mode == "create_graph":
                (g,) = jitgrad.autograd.grad(loss, m.w, create_graph=True)
                assert g.requires_grad
                grads.append(jitgrad.autograd.grad((g * g).sum(), m.b)[0])
            else:
                with pytest.warns(UserWarning), jitgrad.autograd.detect_anomaly():
                    grads.append(jitgrad.autograd.grad(loss, m.w)[0])
        got[name] = grads
    close(got["compiled"], got["eager"])
