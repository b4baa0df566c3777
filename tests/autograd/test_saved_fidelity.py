"""Saved values as PyTorch keeps them (SavedVariable): grad_fn._raw_saved_* with
register_hooks, which operands an op saves, what a double backward saves, and the errors
for a pack hook writing its input and for a saved input detach_()ed. Each scenario runs on
jitgrad and on torch and the results must agree."""
import warnings

import numpy as np
import pytest
from conftest import LIBS

import jitgrad

torch = pytest.importorskip("torch")


def _np(t):
    return None if t is None else t.detach().numpy().copy()


def _inputs(T, leaf):
    base = T.tensor([0.5, -1.25, 2.0], dtype=T.float64, requires_grad=True)
    return base, (base if leaf else 1 + base)


def _raw_hooks_case(T, leaf, pack, unpack):
    base, a = _inputs(T, leaf)
    y = a * a
    y.grad_fn._raw_saved_self.register_hooks(pack, unpack)
    seen = y.grad_fn._saved_self
    same_fn = seen.grad_fn is a.grad_fn if not leaf else None
    y.sum().backward()
    return _np(seen), same_fn, _np(base.grad)


@pytest.mark.parametrize("leaf", [True, False], ids=["leaf", "nonleaf"])
@pytest.mark.parametrize("hooks", ["halve_back", "keep_double"])
def test_register_hooks_on_one_saved_value_matches_torch(leaf, hooks):
    # only _saved_self is hooked: with pack 2x and an identity unpack, d(a*a)/da = a + 2a
    pack, unpack = (lambda x: 2 * x), ((lambda x: x / 2) if hooks == "halve_back" else (lambda x: x))
    j = _raw_hooks_case(jitgrad, leaf, pack, unpack)
    t = _raw_hooks_case(torch, leaf, pack, unpack)
    np.testing.assert_allclose(j[0], t[0])
    assert j[1] == t[1]
    np.testing.assert_allclose(j[2], t[2])


@pytest.mark.parametrize("leaf", [True, False], ids=["leaf", "nonleaf"])
@LIBS
def test_raw_saved_hooks_survive_double_backward(T, leaf):
    base, a = _inputs(T, leaf)
    y = a ** 3
    y.grad_fn._raw_saved_self.register_hooks(lambda x: x, lambda x: x)
    g, = T.autograd.grad(y.sum(), base, create_graph=True)
    g.sum().backward()
    np.testing.assert_allclose(_np(base.grad), 6 * (_np(a)))
    if not leaf:
        assert y.grad_fn._saved_self.grad_fn is a.grad_fn


def _errors(T):
    """The message each misuse of a SavedTensor raises (type, start of message)."""
    out = {}

    def catch(key, fn):
        try:
            fn()
            out[key] = None
        except (RuntimeError, TypeError) as e:
            out[key] = (type(e).__name__, str(e).split("\n")[0][:60])

    a = T.tensor([1.0, 2.0], dtype=T.float64, requires_grad=True)
    y = a * a
    raw = y.grad_fn._raw_saved_self
    out["same object"] = y.grad_fn._raw_saved_self is raw
    catch("not callable", lambda: raw.register_hooks(1, lambda x: x))
    catch("no args", lambda: raw.register_hooks())
    # (each node is kept alive while its SavedTensor is used: torch's SavedTensor does not hold its node)
    p = a * a
    catch("pack arity", lambda: p.grad_fn._raw_saved_self.register_hooks(lambda x, b: x, lambda x: x))
    raw.register_hooks(lambda x: x, lambda x: x)
    catch("twice", lambda: raw.register_hooks(lambda x: x, lambda x: x))
    z = a * a
    z.grad_fn._raw_saved_self.register_hooks(lambda x: 1, lambda x: 1)
    catch("unpack not a tensor", lambda: z.grad_fn._saved_self)
    w = a * a
    w.sum().backward()
    catch("freed", lambda: w.grad_fn._raw_saved_self.register_hooks(lambda x: x, lambda x: x))
    with T.autograd.graph.saved_tensors_hooks(lambda x: x, lambda x: x):
        v = a * a
    catch("default hooks then register", lambda: v.grad_fn._raw_saved_other.register_hooks(lambda x: x, lambda x: x))
    u = a * T.tensor([3.0, 4.0], dtype=T.float64)  # other's gradient is not needed: self is not saved
    catch("None", lambda: u.grad_fn._raw_saved_self.register_hooks(lambda x: x, lambda x: x))

    def double_in_place(x):
        x *= 2
        return x
    q = a * 1 * a
    catch("pack writes input (register_hooks)",
          lambda: q.grad_fn._raw_saved_self.register_hooks(double_in_place, lambda x: x))

    def inc(x):
        x += 1
        return x

    def default_pack():
        with T.autograd.graph.saved_tensors_hooks(inc, lambda x: x):
            T.exp(a)
    catch("pack writes input (saved_tensors_hooks)", default_pack)
    return out


def test_saved_tensor_errors_match_torch():
    j, t = _errors(jitgrad), _errors(torch)
    assert j.keys() == t.keys()
    for key in j:
        assert j[key] == t[key] or (j[key] and t[key] and j[key][0] == t[key][0] and key == "pack arity"), key


def _saves_only_needed(T):
    packed = []
    x = T.tensor([1.0, 2.0, 3.0], dtype=T.float64, requires_grad=True)
    y = T.tensor([4.0, 5.0, 6.0], dtype=T.float64)
    with T.autograd.graph.saved_tensors_hooks(lambda t: packed.append(_np(t)) or t, lambda t: t):
        z = x * y
    out = (len(packed), z.grad_fn._saved_self, _np(z.grad_fn._saved_other))
    plain = x * y
    return out + (plain.grad_fn._saved_self, _np(plain.grad_fn._saved_other),
                  (y * x).grad_fn._saved_other, _np((x / y).grad_fn._saved_other))


def test_only_the_operands_a_gradient_reads_are_saved():
    j, t = _saves_only_needed(jitgrad), _saves_only_needed(torch)
    assert j[0] == t[0] == 1
    for a, b in zip(j[1:], t[1:]):
        if b is None:
            assert a is None
        else:
            np.testing.assert_allclose(a, b)


def _double_backward_factors(T):
    """PyTorch's documented count of what a double backward of a**3 saves: a pack hook that
    doubles each value scales the second derivative by 2 per saved value the path reads."""
    out = []
    ga = T.tensor([0.5, 1.5, -2.0], dtype=T.float64)
    for hook_forward, hook_backward in [(True, False), (False, True), (True, True)]:
        a = ga.clone().requires_grad_()
        hooks = T.autograd.graph.saved_tensors_hooks(lambda x: 2 * x, lambda x: x)
        if hook_forward:
            with hooks:
                s = (a ** 3).sum()
        else:
            s = (a ** 3).sum()
        if hook_backward:
            with hooks:
                g, = T.autograd.grad(s, a, create_graph=True)
                g.sum().backward()
        else:
            g, = T.autograd.grad(s, a, create_graph=True)
            g.sum().backward()
        out.append(_np(a.grad) / _np(6 * a))
    return np.array(out)


def test_double_backward_saves_what_torch_saves():
    np.testing.assert_allclose(_double_backward_factors(jitgrad), _double_backward_factors(torch))


@LIBS
def test_pack_runs_once_per_saved_value(T):
    a = T.ones(3, requires_grad=True)
    with T.autograd.graph.saved_tensors_hooks(lambda x: warnings.warn("pack") or x, lambda x: x):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            a * a
    assert len(w) == 2
    count = []
    b = T.randn(3, requires_grad=True)
    y = b * b
    with T.autograd.graph.saved_tensors_hooks(lambda x: count.append(1) or x, lambda x: x):
        T.autograd.grad(y.sum(), b, create_graph=True)
    assert len(count) == 2  # grad * b and grad * b: the incoming gradient needs none


@LIBS
def test_detach_in_place_of_a_saved_input_raises_at_backward(T):
    a = T.tensor(1.0, requires_grad=True).clone()
    b = a.sin()
    a.detach_()
    with pytest.raises(RuntimeError, match="Trying to use a saved tensor that has been detached in-place"):
        b.backward()
    # exp saves its output, not its input: detaching the input is harmless
    a = T.tensor(1.0, requires_grad=True).clone()
    b = a.exp()
    a.detach_()
    b.backward()
    # a product saves each operand for the other's gradient
    x = T.tensor([2.0, 3.0], requires_grad=True)
    c = x * 1
    y = c * c
    c.detach_()
    with pytest.raises(RuntimeError, match="Trying to use a saved tensor that has been detached in-place"):
        y.sum().backward()


def _call_nodes(T):
    x = T.tensor([0.5, 1.0, 2.0], dtype=T.float64, requires_grad=True)
    w = T.tensor([[1.5], [-2.0]], dtype=T.float64, requires_grad=True)
    g = T.tensor([1.0, 2.0, 3.0], dtype=T.float64)
    e = x.exp()
    one = e.grad_fn(g)
    m = w * x  # broadcast: each input's gradient comes back at its own shape
    both = m.grad_fn(T.ones(2, 3, dtype=T.float64))
    with T.no_grad():
        quiet = e.grad_fn(g)
    return [_np(one), type(one.grad_fn).__name__, [_np(b) for b in both], quiet.requires_grad]


def _call_edge_cases(T):
    out = []

    def catch(fn):
        try:
            r = fn()
            out.append(r if r is None or isinstance(r, tuple) and not r else _np(r))
        except (TypeError, RuntimeError) as e:
            out.append((type(e).__name__, str(e)[:50]))
    x = T.tensor([1.0, 2.0], dtype=T.float64, requires_grad=True)
    e = x.exp()
    catch(lambda: e.grad_fn())
    catch(lambda: e.grad_fn(T.ones(2), T.ones(2)))
    catch(lambda: e.grad_fn(None))
    catch(lambda: (x * 1).grad_fn.next_functions[0][0](T.ones(2, dtype=T.float64)))  # AccumulateGrad adds
    out.append(_np(x.grad))
    e.sum().backward()
    catch(lambda: e.grad_fn(T.ones(2, dtype=T.float64)))

    class Id(T.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            return a * 1

        @staticmethod
        def backward(ctx, g):
            return g
    catch(lambda: Id.apply(x).grad_fn(T.ones(2, dtype=T.float64)))
    return out


def test_calling_nodes_edge_cases_match_torch():
    j, t = _call_edge_cases(jitgrad), _call_edge_cases(torch)
    assert len(j) == len(t)
    for a, b in zip(j, t):
        if isinstance(b, np.ndarray):
            np.testing.assert_allclose(a, b)
        else:
            assert a == b


def test_grad_fn_nodes_are_callable_like_torch():
    j, t = _call_nodes(jitgrad), _call_nodes(torch)
    np.testing.assert_allclose(j[0], t[0])
    assert j[1] == t[1]
    for a, b in zip(j[2], t[2]):
        np.testing.assert_allclose(a, b)
    assert j[3] == t[3] is False


@LIBS
def test_raw_saved_names_are_listed(T):
    y = T.randn(3, requires_grad=True) * T.randn(3, requires_grad=True)
    names = dir(y.grad_fn)
    assert {"_saved_self", "_saved_other", "_raw_saved_self", "_raw_saved_other", "__call__"} <= set(names)


_PRODUCTS = {
    "mm": lambda T, x, w, b: x @ w,
    "addmm": lambda T, x, w, b: T.addmm(b, x, w),
    "linear": lambda T, x, w, b: T.nn.functional.linear(x, w.t(), b),
    "linear_nobias": lambda T, x, w, b: T.nn.functional.linear(x, w.t()),
    "mm_transposed": lambda T, x, w, b: w.t() @ x.t(),
    "mv": lambda T, x, w, b: w.t() @ x.sum(0),
}


def _product_saves(T, name, x_grad):
    rng = np.random.default_rng(3)
    x = T.tensor(rng.standard_normal((2, 3)), requires_grad=x_grad)
    w = T.tensor(rng.standard_normal((3, 4)), requires_grad=True)
    b = T.tensor(rng.standard_normal(4), requires_grad=True)
    shapes = []
    with T.autograd.graph.saved_tensors_hooks(lambda t: shapes.append(tuple(t.shape)) or t * 1, lambda t: t):
        y = _PRODUCTS[name](T, x, w, b)
    node = y.grad_fn
    exposed = {a: None if getattr(node, a) is None else tuple(getattr(node, a).shape)
               for a in ("_saved_" + n for n in ("self", "mat1", "mat2", "vec")) if hasattr(node, a)}
    (y * y).sum().backward()
    return shapes, exposed, [_np(t.grad) for t in (x, w, b)]


@pytest.mark.parametrize("x_grad", [False, True], ids=["x_const", "x_grad"])
@pytest.mark.parametrize("name", sorted(_PRODUCTS))
def test_products_save_each_operand_only_for_the_other(name, x_grad):
    # nn.Linear on data: torch packs the input once and keeps no weight
    j, t = _product_saves(jitgrad, name, x_grad), _product_saves(torch, name, x_grad)
    assert sorted(j[0]) == sorted(t[0])  # what is packed (torch packs mat2 before self / mat1; jitgrad in order)
    assert j[1] == t[1]
    for a, b in zip(j[2], t[2]):
        assert (a is None) == (b is None)
        if a is not None:
            np.testing.assert_allclose(a, b, rtol=1e-12)


def _write_after_forward(T, n, case):
    """An in-place write between forward and backward to a value the op did not save is
    no error (torch never saved it); to one it saved, PyTorch's version error."""
    a = T.ones(n, dtype=T.float64, requires_grad=True)
    x = a * 1
    if case == "mul_unsaved":      # x * const: only const is saved (for x's gradient)
        z = x * T.full((n,), 3.0, dtype=T.float64)
        x.add_(1)
    elif case == "mul_saved":      # const * x: const is saved; writing it is an error
        c = T.full((n,), 3.0, dtype=T.float64)
        z = x * c
        c.add_(1)
    elif case == "mm_saved":       # a product saves the constant operand for x's gradient
        c = T.full((n, 1), 2.0, dtype=T.float64)
        z = x.reshape(1, n) @ c
        c.add_(1)
    elif case == "linear_weight":  # nn.Linear on data: the weight is not saved
        w = T.ones(2, n, dtype=T.float64, requires_grad=True)
        z = T.nn.functional.linear(T.ones(3, n, dtype=T.float64), w) + x.sum()
        with T.no_grad():
            w.mul_(2)
    else:                          # a linear whose input needs a gradient saves the weight
        w = T.ones(2, n, dtype=T.float64, requires_grad=True)
        z = T.nn.functional.linear(x.reshape(1, n), w)
        with T.no_grad():
            w.mul_(2)
    try:
        z.sum().backward()
    except RuntimeError as e:
        return str(e)[:70]
    return _np(a.grad).tolist()


@pytest.mark.parametrize("case", ["mul_unsaved", "mul_saved", "mm_saved", "linear_weight", "linear_input"])
@pytest.mark.parametrize("n", [1, 3], ids=["one_element", "three"])
def test_in_place_writes_check_only_what_was_saved(n, case):
    assert _write_after_forward(jitgrad, n, case) == _write_after_forward(torch, n, case)


# ops whose create_graph backward builds the graph PyTorch's does (same values packed)
_SECOND_ORDER = {
    "exp": lambda a, b: a.exp(), "log": lambda a, b: a.log(), "sin": lambda a, b: a.sin(),
    "sqrt": lambda a, b: a.sqrt(), "pow2": lambda a, b: a ** 2, "pow3": lambda a, b: a ** 3,
    "mul": lambda a, b: a * b, "div": lambda a, b: a / b, "rdiv": lambda a, b: 2 / a,
    "sub_scalar": lambda a, b: (a - 1.0) * b, "square": lambda a, b: a * a, "mean": lambda a, b: a.mean() * b,
    "clamp": lambda a, b: a.clamp(0.5, 2.0), "matmul": lambda a, b: a.reshape(1, 3) @ b.reshape(3, 1),
    "pow_tensor": lambda a, b: a ** b, "exp_of_product": lambda a, b: (a * b).exp(),
}


def _second_order(T, name):
    a = T.tensor([0.5, 1.5, 2.5], dtype=T.float64, requires_grad=True)
    b = T.tensor([1.5, 0.7, 1.2], dtype=T.float64, requires_grad=True)
    y = _SECOND_ORDER[name](a, b).sum()
    packs = []
    with T.autograd.graph.saved_tensors_hooks(lambda t: packs.append(tuple(t.shape)) or t.clone(), lambda t: t):
        ga, gb = T.autograd.grad(y, (a, b), create_graph=True, allow_unused=True, materialize_grads=True)
        hess = T.autograd.grad((ga * ga).sum() + (gb * gb).sum(), (a, b), allow_unused=True)
    return sorted(packs), [_np(g) for g in (ga, gb, *hess)]


@pytest.mark.parametrize("name", sorted(_SECOND_ORDER))
def test_create_graph_backward_packs_what_torch_packs(name):
    (jp, jv), (tp, tv) = _second_order(jitgrad, name), _second_order(torch, name)
    assert jp == tp
    for x, y in zip(jv, tv):
        assert (x is None) == (y is None)
        if x is not None:
            np.testing.assert_allclose(x, y, rtol=1e-12)


def _disable_hooks(T):
    out = []
    a = T.tensor([1.0, 2.0], dtype=T.float64, requires_grad=True)

    def catch(fn):
        try:
            fn()
            out.append(None)
        except RuntimeError as e:
            out.append(str(e))

    def enter(ctx):
        with ctx:
            pass
    with T.autograd.graph.disable_saved_tensors_hooks("no hooks here"):
        catch(lambda: enter(T.autograd.graph.saved_tensors_hooks(lambda x: x, lambda x: x)))
        catch(lambda: enter(T.autograd.graph.save_on_cpu()))
        y = a * a
        catch(lambda: y.grad_fn._raw_saved_self.register_hooks(lambda x: x, lambda x: x))  # still allowed
    with T.autograd.graph.saved_tensors_hooks(lambda x: x, lambda x: x):
        catch(lambda: enter(T.autograd.graph.disable_saved_tensors_hooks("hooks are active")))
    catch(lambda: enter(T.autograd.graph.saved_tensors_hooks(lambda x: x, lambda x: x)))  # enabled again
    with T.autograd.graph.save_on_cpu(pin_memory=False):
        z = (a * a).exp()
    z.sum().backward()
    out.append(_np(a.grad).tolist())
    return out


def test_disable_saved_tensors_hooks_and_save_on_cpu_match_torch():
    assert _disable_hooks(jitgrad) == _disable_hooks(torch)


def _read_after_write(T, n):
    out = []
    a = T.ones(n, dtype=T.float64, requires_grad=True)
    b, c = a * 1, a * 2
    y = b * c
    b.add_(1)
    for name in ("_saved_self", "_saved_other"):
        try:
            out.append(_np(getattr(y.grad_fn, name)).tolist())
        except RuntimeError as e:
            out.append(str(e)[:80])
    return out


@pytest.mark.parametrize("n", [1, 3], ids=["one_element", "three"])
def test_reading_a_saved_value_written_in_place_raises(n):
    # the one-element row checks per node (its values are copies); torch checks per value
    j, t = _read_after_write(jitgrad, n), _read_after_write(torch, n)
    assert j[0] == t[0]
    assert j[1] == t[1] or n == 1


def _saved_tensor_accessors(T):
    a = T.tensor([1.0, -2.0], dtype=T.float64, requires_grad=True)
    y = a * a
    raw = y.grad_fn._raw_saved_self
    out = [raw.data is a, raw.unpack() is a, raw.unpack_hook is None]
    unpack = (lambda x: x)  # noqa: E731
    raw.register_hooks(lambda x: 2 * x, unpack)
    out += [_np(raw.data).tolist(), _np(raw.unpack()).tolist(), raw.unpack_hook is unpack]
    z = a * 3.0  # self is not saved: nothing to read
    out += [z.grad_fn._raw_saved_self.data, z.grad_fn._raw_saved_self.unpack()]
    return out


def test_saved_tensor_data_unpack_and_unpack_hook_match_torch():
    assert _saved_tensor_accessors(jitgrad) == _saved_tensor_accessors(torch)
