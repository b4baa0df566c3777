"""Indexing by tensor and ordering ops (ops/gathers.py) against PyTorch in float64:
values, indices, first and second order gradients (create_graph), integer inputs,
in-place variants, and torch's errors for bad indices (raised before anything is written)."""
import numpy as np
import pytest
import torch
from conftest import assert_close, to_np

import jitgrad as J
from jitgrad.compiler import GraphBreak

rng = np.random.default_rng(13)
X34 = rng.standard_normal((3, 4))
X234 = rng.standard_normal((2, 3, 4))
SRC = rng.standard_normal((3, 4))
V = rng.standard_normal(4)


def _idx(T, a):
    return T.tensor(np.asarray(a, dtype=np.int64))


# name -> (input arrays, fn(T, *leaves)); every input requires grad
CASES = {
    "gather": ([X34], lambda T, x: T.gather(x, 1, _idx(T, [[1, 2, 2], [0, 0, 3], [3, 1, 0]]))),
    "gather_dim0_smaller": ([X34], lambda T, x: x.gather(0, _idx(T, [[2, 1], [2, 0]]))),
    "gather_3d": ([X234], lambda T, x: x.gather(-1, _idx(T, rng_idx((2, 3, 5), 4)))),
    "take_along_dim": ([X34], lambda T, x: T.take_along_dim(x, T.argsort(x, 1), 1)),
    "take_along_dim_flat": ([X34], lambda T, x: T.take_along_dim(x, _idx(T, [0, 11, 5, 5]))),
    "take_along_dim_negative": ([X34], lambda T, x: T.take_along_dim(x, _idx(T, [[-1], [0], [-4]]), 1)),
    "gather_int32": ([X34], lambda T, x: x.gather(1, _idx(T, [[1], [0], [3]]).to(T.int32))),
    "index_add_int32": ([X34, SRC[:, :1]], lambda T, x, s: x.index_add(1, _idx(T, [3]).to(T.int32), s)),
    "take_along_dim_bcast": ([X34], lambda T, x: T.take_along_dim(x, _idx(T, [[0, 3]]), 1)),
    "index_select": ([X34], lambda T, x: T.index_select(x, 1, _idx(T, [3, 0, 3]))),
    "index_select_dim0": ([X234], lambda T, x: x.index_select(0, _idx(T, [1, 1, 0]))),
    "masked_select": ([X34], lambda T, x: T.masked_select(x, x > 0.2)),
    "masked_select_bcast": ([X34], lambda T, x: x.masked_select(T.tensor([True, False, True, True]))),
    "masked_select_input_bcast": ([V], lambda T, x: x.masked_select(T.tensor(X34 > 0))),
    "scatter_src": ([X34, SRC[:, :2]], lambda T, x, s: x.scatter(1, _idx(T, [[3, 0], [1, 2], [0, 3]]), s)),
    "scatter_value": ([X34], lambda T, x: T.scatter(x, 0, _idx(T, [[2, 0, 1, 1]]), 1.5)),
    "scatter_add": ([X34, SRC[:, :3]], lambda T, x, s: x.scatter_add(1, _idx(T, [[3, 3, 0], [1, 2, 1], [0, 0, 0]]), s)),
    "index_add": ([X34, SRC[:, :2]], lambda T, x, s: x.index_add(1, _idx(T, [2, 2]), s, alpha=2.0)),
    "index_fill": ([X34], lambda T, x: x.index_fill(1, _idx(T, [0, 2]), -2.0)),
    "index_copy": ([X34, SRC[:2]], lambda T, x, s: x.index_copy(0, _idx(T, [2, 0]), s)),
    "sort": ([X34], lambda T, x: T.sort(x, 1).values),
    "sort_desc_dim0": ([X234], lambda T, x: x.sort(dim=0, descending=True)[0]),
    "topk": ([X34], lambda T, x: T.topk(x, 2).values),
    "topk_smallest_dim0": ([X34], lambda T, x: x.topk(2, dim=0, largest=False)[0]),
    "kthvalue": ([X34], lambda T, x: T.kthvalue(x, 2, 1).values),
    "kthvalue_keepdim": ([X234], lambda T, x: x.kthvalue(3, 1, keepdim=True)[0]),
    "median_all": ([X34], lambda T, x: T.median(x)),
    "median_ties": ([np.array([1.0, 2.0, 2.0, 3.0, 2.0])], lambda T, x: x.median()),
    "median_dim": ([X34], lambda T, x: T.median(x, 1).values),
    "median_dim_keepdim": ([X234], lambda T, x: x.median(0, keepdim=True)[0]),
    "mode": ([np.array([[1.0, 2.0, 2.0, 1.0, 3.0], [0.5, 0.5, 0.25, 2.0, 0.25]])], lambda T, x: T.mode(x).values),
}


def rng_idx(shape, n):
    return np.random.default_rng(3).integers(0, n, shape)


def _leaves(T, arrays):
    return [T.tensor(a.copy(), dtype=T.float64, requires_grad=True) for a in arrays]


def _run(T, name):
    arrays, fn = CASES[name]
    leaves = _leaves(T, arrays)
    out = fn(T, *leaves)
    w = T.tensor(np.linspace(0.5, 1.5, max(out.numel(), 1)).reshape(tuple(out.shape)), dtype=T.float64)
    grads = T.autograd.grad((out * w).sum(), leaves, create_graph=True, allow_unused=True)
    used = [g for g in grads if g is not None and g.requires_grad]
    # second order: differentiate a nonlinear function of the first gradients
    gg = (T.autograd.grad(sum((g * g).sum() for g in used), leaves, allow_unused=True) if used
          else [None] * len(leaves))
    return out, grads, gg


@pytest.mark.parametrize("name", sorted(CASES))
def test_values_and_gradients_match_torch(name):
    jo, jg, jgg = _run(J, name)
    to, tg, tgg = _run(torch, name)
    assert tuple(jo.shape) == tuple(to.shape)
    assert_close(jo, to)
    for a, b in zip(jg, tg):
        assert (a is None) == (b is None)
        if b is not None:
            assert_close(a, b)
    for a, b in zip(jgg, tgg):
        assert_close(a if a is not None else np.zeros(1), b if b is not None else np.zeros(1))


def test_indices_match_torch():
    for T in (J, torch):
        x = T.tensor(X234)
        res = [T.sort(x, 1).indices, x.sort(descending=True).indices, T.argsort(x, 0), x.argsort(descending=True),
               T.topk(x, 3).indices, x.topk(1, 0, largest=False).indices, T.kthvalue(x, 2, 1).indices,
               x.median(2).indices, x.median(1, keepdim=True).indices, T.max(x, 1).indices]
        if T is J:
            jres = res
        else:
            for a, b in zip(jres, res):
                assert a.dtype == J.int64 and tuple(a.shape) == tuple(b.shape)
                np.testing.assert_array_equal(to_np(a), to_np(b))


def test_stable_sort_ties_and_nan():
    data = [[3.0, 1.0, float("nan"), 1.0, 3.0, 2.0, 1.0]]
    for desc in (False, True):
        j = J.sort(J.tensor(data), descending=desc, stable=True)
        t = torch.sort(torch.tensor(data), descending=desc, stable=True)
        np.testing.assert_array_equal(to_np(j.indices), to_np(t.indices))
        np.testing.assert_array_equal(to_np(j.values), to_np(t.values))
    for T in (J, torch):
        v = T.tensor([[1.0, float("nan"), 2.0, 0.0]])
        r = T.median(v, 1)
        assert np.isnan(to_np(r.values)).all() and to_np(r.indices).tolist() == [1]
        assert np.isnan(to_np(T.median(v)))


def test_integer_inputs():
    a = [[3, 1, 2, 2], [0, 5, 5, 1]]
    for fn in (lambda T, x: T.sort(x, dim=1, stable=True).values, lambda T, x: T.sort(x, dim=1, stable=True).indices,
               lambda T, x: x.topk(2).values, lambda T, x: x.gather(1, _idx(T, [[0], [3]])),
               lambda T, x: x.index_select(0, _idx(T, [1])), lambda T, x: T.masked_select(x, x > 1),
               lambda T, x: x.scatter(1, _idx(T, [[0], [1]]), 7), lambda T, x: x.scatter_add(0, _idx(T, [[1, 0]]), x),
               lambda T, x: x.index_fill(1, _idx(T, [1]), 9), lambda T, x: T.mode(x, 1).values,
               lambda T, x: T.mode(x, 1).indices, lambda T, x: x.median(), lambda T, x: x.kthvalue(1).values,
               lambda T, x: (x > 1).sort(dim=1, stable=True).indices):
        j, t = fn(J, J.tensor(a)), fn(torch, torch.tensor(a))
        assert str(j.dtype) == str(t.dtype), (j.dtype, t.dtype)
        np.testing.assert_array_equal(to_np(j), to_np(t))


def test_float32_stays_float32():
    for fn in (lambda T, x: x.gather(1, _idx(T, [[1], [0], [2]])), lambda T, x: x.sort(0).values,
               lambda T, x: x.scatter_add(0, _idx(T, [[1, 2]]), x), lambda T, x: x.median(),
               lambda T, x: x.index_fill(0, _idx(T, [1]), 2.0), lambda T, x: T.masked_select(x, x > 0)):
        j = fn(J, J.tensor(X34, dtype=J.float32, requires_grad=True))
        t = fn(torch, torch.tensor(X34, dtype=torch.float32, requires_grad=True))
        assert j.dtype == J.float32 and t.dtype == torch.float32
        np.testing.assert_allclose(to_np(j), to_np(t), rtol=1e-6)


def test_return_types_are_named_tuples():
    x = J.tensor(X34)
    for r, name in ((J.sort(x), "sort"), (x.topk(1), "topk"), (x.kthvalue(1), "kthvalue"), (x.median(0), "median"),
                    (x.mode(0), "mode"), (x.max(0), "max")):
        values, indices = r
        assert type(r).__name__ == name and r.values is values and r.indices is indices


def test_nonzero_argwhere_unique_bincount_searchsorted_one_hot():
    for fn in (lambda T: T.nonzero(T.tensor([[0, 1], [1, 1]])), lambda T: T.tensor([0.0, 2.0, 0.0]).nonzero(),
               lambda T: T.argwhere(T.tensor([[0, 1], [1, 0]])), lambda T: T.nonzero(T.tensor(3)),
               lambda T: T.unique(T.tensor([3, 1, 3, 2])),
               lambda T: T.tensor([[1, 2], [1, 2], [0, 1]]).unique(dim=0),
               lambda T: T.bincount(T.tensor([1, 1, 4])), lambda T: T.tensor([0, 2]).bincount(minlength=5),
               lambda T: T.bincount(T.tensor([1, 2, 1]), T.tensor([0.5, 1.0, 2.0])),
               lambda T: T.bincount(T.tensor([1, 2, 1]), T.tensor([0.5, 1.0, 2.0], dtype=T.float64)),
               lambda T: T.bincount(T.tensor([1, 2, 1]), T.tensor([1, 2, 3])),
               lambda T: T.searchsorted(T.tensor([1.0, 2, 3]), T.tensor([[2.0, 2.5], [0, 4]])),
               lambda T: T.searchsorted(T.tensor([1.0, 2, 3]), T.tensor([2.0, 3.0]), right=True),
               lambda T: T.searchsorted(T.tensor([1.0, 2, 3]), T.tensor([2.0]), side="right", out_int32=True),
               lambda T: T.searchsorted(T.tensor([[1.0, 2, 3], [0, 5, 6]]), T.tensor([[2.0, 2.5], [5, 7]])),
               lambda T: T.searchsorted(T.tensor([3.0, 1, 2]), T.tensor([2.5]), sorter=T.tensor([1, 2, 0])),
               lambda T: T.nn.functional.one_hot(T.tensor([1, 0, 3])),
               lambda T: T.nn.functional.one_hot(T.tensor([[1], [0]]), 4)):
        j, t = fn(J), fn(torch)
        assert str(j.dtype) == str(t.dtype) and tuple(j.shape) == tuple(t.shape), (j, t)
        np.testing.assert_array_equal(to_np(j), to_np(t))
    j = J.searchsorted(J.tensor([1.0, 2, 3]), 2.5)
    assert j.shape == () and int(j) == 2


def test_nonzero_as_tuple_and_unique_flags():
    for T in (J, torch):
        a = T.tensor([[0, 1], [1, 1]])
        r = (T.nonzero(a, as_tuple=True) + T.nonzero(T.tensor(3), as_tuple=True)
             + T.unique(T.tensor([[3, 1], [3, 2]]), return_inverse=True, return_counts=True)
             + T.unique(T.tensor([3, 1, 3]), return_counts=True))
        if T is J:
            jr = r
    assert len(jr) == len(r)
    for a, b in zip(jr, r):
        assert str(a.dtype) == str(b.dtype) and tuple(a.shape) == tuple(b.shape)
        np.testing.assert_array_equal(to_np(a), to_np(b))


def test_not_differentiable_results_do_not_require_grad():
    x = J.tensor([1.0, 3.0, 1.0], requires_grad=True)
    for r in (x.argsort(), x.nonzero(), J.searchsorted(x, x), x.sort().indices):
        assert not r.requires_grad


@pytest.mark.parametrize("op", ["scatter_", "scatter_value_", "scatter_add_", "index_add_", "index_fill_",
                                "index_copy_"])
def test_in_place_variants_match_torch(op):
    def run(T):
        x = T.tensor(X34.copy(), dtype=T.float64, requires_grad=True)
        s = T.tensor((SRC[:2, :2] if op.startswith("scatter") else SRC).copy(), dtype=T.float64, requires_grad=True)
        y = x * 1.0
        i2 = _idx(T, [[3, 0], [1, 1]])
        r = {"scatter_": lambda: y.scatter_(1, i2, s),
             "scatter_value_": lambda: y.scatter_(1, i2, -3.0),
             "scatter_add_": lambda: y.scatter_add_(1, i2, s),
             "index_add_": lambda: y.index_add_(0, _idx(T, [2, 2, 0]), s),
             "index_fill_": lambda: y.index_fill_(0, _idx(T, [1]), 4.0),
             "index_copy_": lambda: y.index_copy_(0, _idx(T, [2, 0, 1]), s)}[op]()
        assert r is y and y._version == 1
        (y * y).sum().backward()
        return y, x.grad, s.grad
    for a, b in zip(run(J), run(torch)):
        if b is None:
            assert a is None
        else:
            assert_close(a, b)


def test_in_place_on_a_leaf_requiring_grad_is_rejected_like_torch():
    for T in (J, torch):
        x = T.zeros(3, requires_grad=True)
        with pytest.raises(RuntimeError, match="a leaf Variable that requires grad is being used in an in-place"):
            x.index_fill_(0, _idx(T, [1]), 1.0)


def _err(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001  (the type is what is compared)
        return type(e), str(e).split("\n")[0]
    raise AssertionError("no error")


ERRORS = {
    "gather_out_of_range": lambda T, x: x.gather(1, _idx(T, [[5]])),
    "gather_negative": lambda T, x: x.gather(1, _idx(T, [[-1]])),
    "gather_float_index": lambda T, x: x.gather(1, T.tensor([[1.0]])),
    "gather_ndim": lambda T, x: x.gather(1, _idx(T, [1])),
    "gather_size": lambda T, x: x.gather(1, _idx(T, [[1]] * 4)),
    "gather_dim": lambda T, x: x.gather(2, _idx(T, [[1]])),
    "index_select_range": lambda T, x: x.index_select(1, _idx(T, [4])),
    "index_select_float": lambda T, x: x.index_select(1, T.tensor([1.0])),
    "index_select_scalar": lambda T, x: x[0, 0].index_select(0, _idx(T, [0, 0])),
    "index_select_2d": lambda T, x: x.index_select(1, _idx(T, [[1]])),
    "scatter_range": lambda T, x: x.scatter(1, _idx(T, [[5]]), 1.0),
    "scatter_dtype": lambda T, x: x.scatter(1, _idx(T, [[1]]), x.float()),
    "scatter_add_range": lambda T, x: x.scatter_add(0, _idx(T, [[3]]), x),
    "index_add_range": lambda T, x: x.index_add(1, _idx(T, [5]), x[:, :1]),
    "index_fill_range": lambda T, x: x.index_fill(1, _idx(T, [5]), 2.0),
    "index_add_float": lambda T, x: x.index_add(1, T.tensor([1.0]), x[:, :1]),
    "index_add_count": lambda T, x: x.index_add(1, _idx(T, [1]), x[:, :2]),
    "index_fill_int32": lambda T, x: x.index_fill(1, _idx(T, [1]).to(T.int32), 1.0),
    "index_copy_int32": lambda T, x: x.index_copy(1, _idx(T, [1]).to(T.int32), x[:, :1]),
    "index_copy_count": lambda T, x: x.index_copy(1, _idx(T, [1]), x[:, :2]),
    "scatter_float_index": lambda T, x: x.scatter(1, T.tensor([[1.0]]), 1.0),
    "take_along_dim_flat_negative": lambda T, x: T.take_along_dim(x, _idx(T, [0, -1])),
    "take_along_dim_int32": lambda T, x: T.take_along_dim(x, _idx(T, [[1]]).to(T.int32), 1),
    "index_copy_range": lambda T, x: x.index_copy(1, _idx(T, [5]), x[:, :1]),
    "masked_select_mask": lambda T, x: x.masked_select(_idx(T, [1, 0, 1, 1])),
    "topk_k": lambda T, x: x.topk(5),
    "kthvalue_k": lambda T, x: x.kthvalue(0),
    "bincount_negative": lambda T, x: T.bincount(_idx(T, [-1])),
    "bincount_float": lambda T, x: T.bincount(T.tensor([1.0])),
    "one_hot_big": lambda T, x: T.nn.functional.one_hot(_idx(T, [1, 5]), 3),
    "one_hot_float": lambda T, x: T.nn.functional.one_hot(T.tensor([1.0])),
    "one_hot_negative": lambda T, x: T.nn.functional.one_hot(_idx(T, [-1])),
    "median_empty_dim": lambda T, x: T.zeros(2, 0).median(1),
    "kthvalue_empty_dim": lambda T, x: T.zeros(2, 0).kthvalue(1, 1),
    "mode_empty_dim": lambda T, x: T.zeros(2, 0).mode(1),
    "searchsorted_shapes": lambda T, x: T.searchsorted(x, T.tensor([[1.0], [2.0]])),
}


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_errors_match_torch(name):
    je = _err(lambda: ERRORS[name](J, J.tensor(X34)))
    te = _err(lambda: ERRORS[name](torch, torch.tensor(X34)))
    assert je[0] is te[0] and te[1].startswith(je[1][:40]) and je[1], (je, te)


def test_a_bad_index_writes_nothing():
    for fn in (lambda x: x.scatter_(1, J.tensor([[0, 9]]), 1.0), lambda x: x.index_add_(0, J.tensor([0, 7]), x[:2]),
               lambda x: x.index_fill_(0, J.tensor([1, 3]), 1.0), lambda x: x.scatter_add_(0, J.tensor([[1, 3]]), x)):
        x = J.tensor(X34.copy())
        with pytest.raises((RuntimeError, IndexError)):
            fn(x)
        np.testing.assert_array_equal(to_np(x), X34)
        assert x._version == 0


def test_a_bad_index_into_a_one_element_tensor_leaves_its_saved_uses_valid():
    x = J.tensor([2.0], requires_grad=True)
    y = x * 1.0
    z = y * y  # saves y
    with pytest.raises(RuntimeError, match="index 3 is out of bounds"):
        y.scatter_(0, J.tensor([3]), 1.0)
    z.backward()
    assert_close(x.grad, [4.0])


def test_in_place_through_a_view_matches_torch():
    def run(T):
        x = T.tensor(X34.copy(), requires_grad=True)
        y = x * 2.0
        y[1].index_fill_(0, _idx(T, [0, 3]), 0.5)
        y[:, 2].scatter_add_(0, _idx(T, [0, 0]), x[0, :2])
        (y ** 2).sum().backward()
        return y, x.grad
    for a, b in zip(run(J), run(torch)):
        assert_close(a, b)


def test_gradients_by_finite_differences():
    x = J.tensor(X34, requires_grad=True)
    s = J.tensor(SRC, requires_grad=True)
    idx = J.tensor([[3, 0], [1, 1], [2, 2]])
    for fn, ins in ((lambda a: a.sort(1).values * a, (x,)), (lambda a, b: a.scatter_add(1, idx, b) ** 2, (x, s)),
                    (lambda a: a.median(), (x,)), (lambda a, b: a.scatter(1, idx[:, :1], b) ** 2, (x, s))):
        assert J.autograd.gradcheck(fn, ins)


@pytest.mark.parametrize("name", ["gather", "index_select", "masked_select", "scatter_src", "scatter_add", "index_add",
                                  "index_fill", "sort", "topk", "median_all", "median_dim", "kthvalue"])
def test_forward_mode_tangents_match_torch(name):
    arrays, fn = CASES[name]
    tangents = [np.random.default_rng(5).standard_normal(a.shape) for a in arrays]

    def run(T):
        import_fw = T.autograd.forward_ad
        with import_fw.dual_level():
            duals = [import_fw.make_dual(T.tensor(a.copy(), dtype=T.float64), T.tensor(t, dtype=T.float64))
                     for a, t in zip(arrays, tangents)]
            return import_fw.unpack_dual(fn(T, *duals))
    (jp, jt), (tp, tt) = run(J), run(torch)
    assert_close(jp, tp)
    assert_close(jt, tt)


def test_compiled_step_with_data_dependent_positions_runs_eagerly_with_eager_results():
    w = J.tensor(X34.copy(), requires_grad=True)

    def step(w, idx):
        loss = (w.gather(1, idx) ** 2).sum() + w.sort(1).values[:, 0].sum()
        loss.backward()
        return loss

    fast = J.compile(step)
    for idx in ([[0], [1], [2]], [[3], [3], [0]], [[1], [0], [2]]):
        w.grad = None
        got = fast(w, J.tensor(idx))
        g = w.grad.detach().numpy().copy()
        w.grad = None
        want = step(w, J.tensor(idx))
        assert_close(got, want)
        assert_close(g, w.grad)
    with pytest.raises(GraphBreak, match="gather reads its positions from tensor data"):
        J.compile(step, fullgraph=True)(w, J.tensor([[0], [1], [2]]))


EDGE = {
    "sort_0d": lambda T: T.sort(T.tensor(3.0)),
    "topk_0d": lambda T: T.topk(T.tensor(3.0), 1),
    "gather_0d": lambda T: T.tensor(3.0).gather(0, T.tensor(0)),
    "index_select_0d": lambda T: T.tensor(3.0).index_select(0, T.tensor(0)),
    "sort_empty": lambda T: T.zeros(0).sort(),
    "sort_empty_dim": lambda T: T.zeros(2, 0).sort(1),
    "masked_select_none": lambda T: T.zeros(3).masked_select(T.zeros(3) > 1),
    "nonzero_empty": lambda T: T.zeros(0, 2).nonzero(),
    "unique_empty": lambda T: T.unique(T.zeros(0)),
    "gather_empty_index": lambda T: T.zeros(3, 4).gather(1, T.zeros(3, 0, dtype=T.int64)),
    "median_0d": lambda T: T.tensor(3.0).median(),
    "median_empty": lambda T: T.zeros(0).median(),
    "kthvalue_0d": lambda T: T.tensor(3.0).kthvalue(1),
    "median_0d_dim": lambda T: T.tensor(3.0).median(0),
    "mode_0d": lambda T: T.tensor(3.0).mode(),
    "argsort_0d": lambda T: T.tensor(3.0).argsort(),
    "index_fill_tensor_value": lambda T: T.ones(2, 3).index_fill(1, T.tensor([2]), T.tensor(7.0)),
    "topk_empty": lambda T: T.zeros(2, 0).topk(0, 1),
    "mode_no_rows": lambda T: T.zeros(0, 3).mode(1),
    "median_no_rows": lambda T: T.zeros(0, 3).median(1),
    "scatter_value_keyword": lambda T: T.tensor([[1.0, 2.0], [3.0, 4.0]]).scatter(1, T.tensor([[1], [0]]), value=5.0),
}


@pytest.mark.parametrize("name", sorted(EDGE))
def test_zero_dim_and_empty_inputs_match_torch(name):
    j, t = EDGE[name](J), EDGE[name](torch)
    j, t = (j, t) if isinstance(t, tuple) else ((j,), (t,))
    assert len(j) == len(t)
    for a, b in zip(j, t):
        assert str(a.dtype) == str(b.dtype) and tuple(a.shape) == tuple(b.shape)
        np.testing.assert_array_equal(to_np(a), to_np(b))


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_mode_with_many_ties_matches_torch(dim):
    a = np.random.default_rng(dim + 4).integers(0, 4, (5, 6, 7))
    for dt in ("int64", "float64"):
        j = J.tensor(a.astype(dt)).mode(dim, keepdim=dim == 1)
        t = torch.tensor(a.astype(dt)).mode(dim, keepdim=dim == 1)
        for x, y in zip(j, t):
            assert tuple(x.shape) == tuple(y.shape)
            np.testing.assert_array_equal(to_np(x), to_np(y))


def test_where_with_the_condition_alone_is_nonzero_as_tuple():
    for T in (J, torch):
        c = T.tensor([[True, False], [True, True]])
        r = T.where(c) + (T.where(c, T.ones(2), 0.0),)
        if T is J:
            jr = r
        with pytest.raises(TypeError, match="where\\(\\) received an invalid combination of arguments"):
            T.where(c, T.ones(2))
    for a, b in zip(jr, r):
        assert str(a.dtype) == str(b.dtype)
        np.testing.assert_array_equal(to_np(a), to_np(b))
    x = J.tensor([1.0, -2.0], requires_grad=True)
    J.where(x > 0, x, x * 3.0).sum().backward()
    assert_close(x.grad, [1.0, 3.0])
