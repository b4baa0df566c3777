"""Graph API and backward / autograd.grad semantics (PyTorch is the oracle)."""
import warnings

import numpy as np
import pytest
from conftest import assert_close

import jitgrad

torch = pytest.importorskip("torch")


def f64(data, requires_grad=False):
    return jitgrad.tensor(data, dtype=jitgrad.float64, requires_grad=requires_grad)


def t64(data, requires_grad=False):
    return torch.tensor(data, dtype=torch.float64, requires_grad=requires_grad)


# ---------------------------------------------------------------- graph API

def test_next_functions_structure():
    x = jitgrad.tensor([2.0], requires_grad=True)
    y = x * 2
    z = y + 3
    nf = z.grad_fn.next_functions
    assert isinstance(nf, tuple) and len(nf) == 2
    assert nf[0][0] is y.grad_fn
    assert nf[0][1] == 0
    assert nf[1] == (None, 0)  # constant operand
    assert type(y.grad_fn).__name__ == "MulBackward0"
    assert type(z.grad_fn).__name__ == "AddBackward0"
    acc, idx = y.grad_fn.next_functions[0]
    assert idx == 0
    assert type(acc).__name__ == "AccumulateGrad"
    assert acc.name() == "torch::autograd::AccumulateGrad"   # torch's C++ node name
    assert acc.variable is x
    assert acc.next_functions == ()
    assert y.grad_fn.next_functions[1] == (None, 0)


def test_next_functions_two_leaves_and_order():
    a = jitgrad.tensor([1.0], requires_grad=True)
    b = jitgrad.tensor([2.0], requires_grad=True)
    y = a - b
    (n0, i0), (n1, i1) = y.grad_fn.next_functions
    assert n0.variable is a and n1.variable is b
    assert (i0, i1) == (0, 0)
    w = b - a
    assert w.grad_fn.next_functions[0][0].variable is b


def test_accumulate_grad_node_is_shared():
    x = jitgrad.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    z = x.exp()
    assert y.grad_fn.next_functions[0][0] is z.grad_fn.next_functions[0][0]
    w = x + x
    assert w.grad_fn.next_functions[0][0] is w.grad_fn.next_functions[1][0]
    assert w.grad_fn.next_functions[0][0] is y.grad_fn.next_functions[0][0]


def test_next_functions_for_non_requires_grad_input():
    x = jitgrad.tensor([1.0, 2.0], requires_grad=True)
    c = jitgrad.tensor([3.0, 4.0])
    y = c * x
    assert y.grad_fn.next_functions[0] == (None, 0)
    assert y.grad_fn.next_functions[1][0].variable is x


def test_grad_fn_name_and_metadata():
    x = jitgrad.tensor([1.0, 2.0], requires_grad=True)
    s = (x ** 2).sum()
    assert s.grad_fn.name() == "SumBackward0"
    assert s.grad_fn.next_functions[0][0].name() == "PowBackward0"
    md = s.grad_fn.metadata
    assert isinstance(md, dict)
    assert md == {}
    md["k"] = 1
    assert s.grad_fn.metadata["k"] == 1  # the same dict each time
    assert x.mean().grad_fn.name() == "MeanBackward0"
    assert x.sum(0).grad_fn.name() == "SumBackward1"
    assert x.mean(0).grad_fn.name() == "MeanBackward1"
    m = jitgrad.ones(2, 3, requires_grad=True)
    assert (m @ m.t()).grad_fn.name() == "MmBackward0"
    assert m.t().grad_fn.name() == "TBackward0"
    sq = jitgrad.ones(3, 3, requires_grad=True)
    assert sq.trace().grad_fn.name() == "TraceBackward0"


def test_walk_graph_names_like_torch():
    def walk(T):
        x = T.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
        w = T.tensor([0.5, -1.0], requires_grad=True)
        out = ((x @ w).tanh() * 2 + x.sum(1)).mean()
        names = []
        stack = [out.grad_fn]
        seen = []  # keep strong references so identity checks are meaningful
        while stack:
            n = stack.pop()
            if n is None or any(n is s for s in seen):
                continue
            seen.append(n)
            names.append(type(n).__name__)
            for nxt, _ in n.next_functions:
                stack.append(nxt)
        return sorted(names)
    assert walk(jitgrad) == walk(torch)


# ---------------------------------------------------------------- backward semantics

def test_backward_scalar_and_one_element():
    x = jitgrad.tensor([2.0], requires_grad=True)
    y = x * x
    y.backward()  # one element tensor: implicit gradient allowed
    assert x.grad.tolist() == [4.0]
    s = jitgrad.tensor(3.0, requires_grad=True)
    (s * s * s).backward()
    assert s.grad.item() == 27.0
    assert s.grad.shape == ()


def test_backward_with_gradient_argument():
    x = f64([1.0, 2.0, 3.0], requires_grad=True)
    y = x * x
    y.backward(gradient=f64([1.0, 0.5, -1.0]))
    assert_close(x.grad, np.array([2.0, 2.0, -6.0]))


def test_grad_does_not_touch_dot_grad():
    x = jitgrad.tensor([1.0], requires_grad=True)
    z = x * 2 * 3
    (g,) = jitgrad.autograd.grad(z, x)
    assert g.tolist() == [6.0]
    assert x.grad is None
    x.grad = jitgrad.tensor([10.0])
    z = x * 2 * 3
    out = jitgrad.autograd.grad(z, [x])
    assert isinstance(out, tuple) and len(out) == 1
    assert x.grad.tolist() == [10.0]


def test_grad_returns_tuple_for_tensor_input():
    x = jitgrad.tensor([1.0], requires_grad=True)
    r = jitgrad.autograd.grad((x * 2).sum(), x)
    assert isinstance(r, tuple) and len(r) == 1
    assert r[0].tolist() == [2.0]


def test_multiple_paths_sum():
    x = jitgrad.tensor([2.0], requires_grad=True)
    loss = x * 3 + x * 2
    loss.backward()
    assert x.grad.tolist() == [5.0]
    y = f64([1.0, 2.0], requires_grad=True)
    a = y.exp()
    b = a * y
    c = (a + b + a.sin() * b).sum()
    c.backward()
    ty = t64([1.0, 2.0], requires_grad=True)
    ta = ty.exp()
    tb = ta * ty
    (ta + tb + ta.sin() * tb).sum().backward()
    assert_close(y.grad, ty.grad)


def test_diamond_graph_each_node_once():
    # x -> a -> (b, c) -> d : the gradient through a must be the sum of both branches
    x = f64([0.3, -0.7], requires_grad=True)
    a = x.tanh()
    d = (a * 2.0 + a.exp()).sum()
    (g,) = jitgrad.autograd.grad(d, x)
    tx = t64([0.3, -0.7], requires_grad=True)
    ta = tx.tanh()
    (tg,) = torch.autograd.grad((ta * 2.0 + ta.exp()).sum(), tx)
    assert_close(g, tg)


def test_leaf_grad_accumulates_across_backward_calls():
    x = f64([1.0, 2.0], requires_grad=True)
    (x * x).sum().backward()
    assert_close(x.grad, [2.0, 4.0])
    (x * 3).sum().backward()
    assert_close(x.grad, [5.0, 7.0])


def test_retain_graph_allows_second_backward_and_accumulates():
    x = f64([1.0, -2.0, 3.0], requires_grad=True)
    loss = (x ** 2).sum()
    loss.backward(retain_graph=True)
    first = x.grad.clone()
    assert_close(first, [2.0, -4.0, 6.0])
    loss.backward()
    assert_close(x.grad, [4.0, -8.0, 12.0])
    assert_close(first, [2.0, -4.0, 6.0])  # clone is unaffected


def test_retain_graph_with_grad():
    x = f64([1.0, 2.0], requires_grad=True)
    y = (x.exp() * x).sum()
    g1 = jitgrad.autograd.grad(y, x, retain_graph=True)[0]
    g2 = jitgrad.autograd.grad(y, x)[0]
    assert_close(g1, g2)


def test_second_backward_without_retain_raises():
    x = jitgrad.tensor([1.0, 2.0], requires_grad=True)
    loss = (x * x).sum()
    loss.backward()
    with pytest.raises(RuntimeError, match=r"^Trying to backward through the graph a second time"):
        loss.backward()
    x2 = jitgrad.tensor([1.0, 2.0], requires_grad=True)
    loss2 = (x2.exp()).sum()
    jitgrad.autograd.grad(loss2, x2)
    with pytest.raises(RuntimeError, match=r"^Trying to backward through the graph a second time"):
        jitgrad.autograd.grad(loss2, x2)


def test_backward_inputs_restricts_accumulation():
    x = f64([1.0, 2.0], requires_grad=True)
    y = f64([3.0, 4.0], requires_grad=True)
    loss = (x * y).sum()
    loss.backward(inputs=[x])
    assert_close(x.grad, [3.0, 4.0])
    assert y.grad is None
    loss2 = (x * y).sum()
    loss2.backward(inputs=y)  # a single tensor is accepted too
    assert_close(y.grad, [1.0, 2.0])
    assert_close(x.grad, [3.0, 4.0])


def test_backward_inputs_non_leaf():
    tx = t64([1.0, 2.0], requires_grad=True)
    ty = tx * 3
    (ty * ty).sum().backward(inputs=[ty])
    x = f64([1.0, 2.0], requires_grad=True)
    y = x * 3
    (y * y).sum().backward(inputs=[y])
    assert_close(y.grad, ty.grad)
    assert x.grad is None


def test_retain_grad_on_nonleaf():
    x = f64([1.0, 2.0], requires_grad=True)
    y = x * 2
    y.retain_grad()
    z = (y * y).sum()
    z.backward()
    assert_close(y.grad, [4.0, 8.0])
    assert_close(x.grad, [8.0, 16.0])
    w = x * 5
    (w.sum()).backward()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns on .grad of a non-leaf
        assert w.grad is None  # non-leaf without retain_grad


def test_grad_multiple_outputs_and_inputs():
    x = f64([0.5, 1.5], requires_grad=True)
    y = f64([2.0, -1.0], requires_grad=True)
    o1 = x * y
    o2 = (x.sin() + y).sum()
    g1 = f64([1.0, -2.0])
    gx, gy = jitgrad.autograd.grad([o1, o2], [x, y], grad_outputs=[g1, None])
    tx = t64([0.5, 1.5], requires_grad=True)
    ty = t64([2.0, -1.0], requires_grad=True)
    tgx, tgy = torch.autograd.grad([tx * ty, (tx.sin() + ty).sum()], [tx, ty],
                                   grad_outputs=[t64([1.0, -2.0]), None])
    assert_close(gx, tgx)
    assert_close(gy, tgy)


def test_grad_of_intermediate():
    x = f64([1.0, 2.0], requires_grad=True)
    h = x.exp()
    out = (h * h).sum()
    (gh,) = jitgrad.autograd.grad(out, h)
    assert_close(gh, 2 * np.exp([1.0, 2.0]))


def test_allow_unused_and_materialize():
    x = jitgrad.tensor([1.0, 2.0], requires_grad=True)
    w = jitgrad.tensor([5.0, 6.0, 7.0], requires_grad=True)
    gx, gw = jitgrad.autograd.grad((x * 2).sum(), [x, w], allow_unused=True)
    assert gx.tolist() == [2.0, 2.0]
    assert gw is None
    gx, gw = jitgrad.autograd.grad((x * 2).sum(), [x, w], allow_unused=True, materialize_grads=True)
    assert gw.tolist() == [0.0, 0.0, 0.0]
    assert gw.shape == (3,)
    gx, gw = jitgrad.autograd.grad((x * 2).sum(), [x, w], materialize_grads=True)
    assert gw.tolist() == [0.0, 0.0, 0.0]


def test_backward_through_detach_stops_gradient():
    x = f64([1.0, 2.0], requires_grad=True)
    y = x * x.detach()
    y.sum().backward()
    assert_close(x.grad, [1.0, 2.0])


def test_grad_of_leaf_wrt_itself():
    x = f64([1.0, 2.0], requires_grad=True)
    (g,) = jitgrad.autograd.grad(x, x, grad_outputs=f64([3.0, 4.0]))
    assert_close(g, [3.0, 4.0])


def test_no_grad_fn_for_constant_branch_but_grad_flows():
    x = f64([1.0, 2.0], requires_grad=True)
    c = f64([3.0, 4.0])
    y = (c * 2).exp() + x
    y.sum().backward()
    assert_close(x.grad, [1.0, 1.0])


# ---------------------------------------------------------------- higher order (create_graph)

SECOND_ORDER = {
    "cube": lambda T, x, w: (x ** 3).sum(),
    "sin": lambda T, x, w: x.sin().sum(),
    "exp": lambda T, x, w: (x.exp() * 2).sum(),
    "tanh": lambda T, x, w: x.tanh().sum(),
    "mul_chain": lambda T, x, w: (x * x * w * x).sum(),
    "matmul": lambda T, x, w: ((w.reshape(2, 2) @ x[:2]) ** 2).sum() + (x @ x) * x.sum(),
    "softmax": lambda T, x, w: (x.softmax(0) * w).sum(),
    "div_sqrt_log": lambda T, x, w: ((x * x + 1).sqrt() / (w * w + 1) + (x * x + 1).log()).sum(),
    "sigmoid_prod": lambda T, x, w: x.sigmoid().prod() + (x * w).max(),
}


@pytest.mark.parametrize("name", sorted(SECOND_ORDER))
def test_second_derivatives_match_torch(name):
    fn = SECOND_ORDER[name]
    rng = np.random.default_rng(len(name))
    xa = rng.uniform(-1.2, 1.2, size=4)
    wa = rng.uniform(-1.2, 1.2, size=4)
    v = rng.standard_normal(4)

    def run(T, mk):
        x = mk(xa, requires_grad=True)
        w = mk(wa, requires_grad=True)
        y = fn(T, x, w)
        (gx,) = T.autograd.grad(y, x, create_graph=True)
        assert gx.requires_grad
        hv_x, hv_w = T.autograd.grad((gx * mk(v)).sum(), [x, w], allow_unused=True)
        return y, gx, hv_x, hv_w

    ty, tg, thx, thw = run(torch, t64)
    jy, jg, jhx, jhw = run(jitgrad, f64)
    assert_close(jy, ty)
    assert_close(jg, tg)
    assert_close(jhx, thx)
    if thw is None:
        assert jhw is None
    else:
        assert_close(jhw, thw)


def test_cube_second_derivative_is_6x():
    x = f64([1.0, 2.0, -3.0], requires_grad=True)
    (g,) = jitgrad.autograd.grad((x ** 3).sum(), x, create_graph=True)
    assert_close(g, 3 * np.array([1.0, 4.0, 9.0]))
    assert g.grad_fn is not None
    g.sum().backward()
    assert_close(x.grad, 6 * np.array([1.0, 2.0, -3.0]))


def test_third_derivative():
    x = f64([0.7], requires_grad=True)
    y = x.sin()
    (g1,) = jitgrad.autograd.grad(y, x, create_graph=True)
    (g2,) = jitgrad.autograd.grad(g1, x, create_graph=True)
    (g3,) = jitgrad.autograd.grad(g2, x)
    assert_close(g1, np.cos([0.7]))
    assert_close(g2, -np.sin([0.7]))
    assert_close(g3, -np.cos([0.7]))


def test_backward_create_graph():
    x = f64([1.5], requires_grad=True)
    y = x ** 4
    y.backward(create_graph=True)
    assert_close(x.grad, [4 * 1.5 ** 3])
    assert x.grad.requires_grad
    g = x.grad
    x.grad = None
    g.backward()
    assert_close(x.grad, [12 * 1.5 ** 2])


def test_without_create_graph_grad_is_constant():
    x = f64([1.5], requires_grad=True)
    (g,) = jitgrad.autograd.grad(x ** 2, x)
    assert g.requires_grad is False
    assert g.grad_fn is None


def test_create_graph_retains_graph_by_default():
    # retain_graph defaults to create_graph: a second pass over the same graph is allowed
    x = f64([0.4, -1.1], requires_grad=True)
    y = (x.sin() * x).sum()
    (g1,) = jitgrad.autograd.grad(y, x, create_graph=True)
    (g2,) = jitgrad.autograd.grad(y, x)
    assert_close(g1, g2)
    assert_close(g1, np.cos([0.4, -1.1]) * [0.4, -1.1] + np.sin([0.4, -1.1]))


def test_backward_on_leaf_itself():
    x = f64([1.0, 2.0], requires_grad=True)
    x.backward(f64([0.5, -1.0]))
    assert_close(x.grad, [0.5, -1.0])
    s = jitgrad.tensor(3.0, requires_grad=True)
    s.backward()
    assert s.grad.item() == 1.0


def test_grad_outputs_accepts_sequence_and_outputs_sequence():
    x = f64([1.0, 2.0], requires_grad=True)
    y = x * x
    (g,) = jitgrad.autograd.grad([y], [x], grad_outputs=[f64([1.0, 1.0])])
    assert_close(g, [2.0, 4.0])


def test_output_nr_of_max_values_and_grad_through_indices_free_path():
    x = f64([[1.0, 5.0, 2.0], [7.0, 0.5, 3.0]], requires_grad=True)
    r = x.max(1)
    assert r.values.output_nr == 0
    assert r.indices.tolist() == [1, 0]
    r.values.sum().backward()
    assert_close(x.grad, [[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
