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
    x = jitgrad.tensor(np.ones((2, 6)))
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
