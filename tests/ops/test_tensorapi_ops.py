"""Everyday Tensor API against torch 2.13: the new_* factories, dtype conversions, storage
queries (stride, storage_offset, is_contiguous...), the random initialisers and samplers
with their generator= keyword, torch.tensor's inference of numpy scalars, numel,
set_printoptions and torch.accelerator."""
import numpy as np
import pytest
from conftest import both, err_of

import jitgrad

torch = pytest.importorskip("torch")
LIBS = [jitgrad, torch]


# ============================================================================= new_* and dtypes
@pytest.mark.parametrize("dtype", ["float32", "float64", "int64"])
def test_new_factories_take_self_dtype(dtype):
    def run(T):
        x = T.ones(2, 3, dtype=getattr(T, dtype))
        return [x.new_zeros(2, 3), x.new_zeros((4,)), x.new_ones(2), x.new_full((2, 2), 7), x.new_tensor([1, 2]),
                x.new_tensor([1.5], dtype=T.float64), x.new_zeros(2, dtype=T.int64), x.new_empty(3).shape]
    both(run)


def test_new_tensor_keeps_a_tensor_s_dtype_and_is_a_detached_copy():
    for T in LIBS:
        x = T.zeros(2, dtype=T.float64)
        src = T.tensor([1, 2], dtype=T.int64)
        with pytest.warns(UserWarning, match="^To copy construct from a tensor, it is recommended"):
            y = x.new_tensor(src)
        assert y.dtype == T.float64
        src.add_(1)
        assert y.tolist() == [1, 2]
        with pytest.warns(UserWarning):
            w = x.new_tensor(T.ones(2, requires_grad=True))
        assert not w.requires_grad and x.new_ones(2, requires_grad=True).requires_grad


def test_type_as_int_bool_long():
    def run(T):
        x = T.tensor([[-1.5, 0.0, 2.7]], dtype=T.float64)
        return [x.int(), x.long(), x.bool(), x.type_as(T.zeros(1, dtype=T.int64)), x.int().type_as(x)]
    both(run)


def test_int_conversion_of_a_requires_grad_tensor_stops_the_graph():
    for T in LIBS:
        x = T.ones(2, requires_grad=True)
        assert not x.int().requires_grad and not x.bool().requires_grad


def test_type_as_keeps_the_graph():
    def run(T):
        x = T.tensor([1.0, 2.0], dtype=T.float32, requires_grad=True)
        y = x.type_as(T.zeros(1, dtype=T.float64))
        (g,) = T.autograd.grad((y * y).sum(), x)
        return [y.dtype == T.float64, g]
    both(run, "float32")


def test_half_is_a_clear_type_error():
    assert err_of(lambda: jitgrad.ones(2).half()) == (
        "TypeError", "jitgrad has no float16 dtype: half() is not supported (use float() or double())")


# ============================================================================= storage queries
def _views(T):
    x = T.arange(24, dtype=T.float64).reshape(2, 3, 4)
    return {"plain": x, "transposed": x.transpose(0, 2), "sliced": x[:, 1:, ::2], "row": x[1], "expanded":
            T.ones(3, 1).expand(3, 4), "t": x[0].t(), "scalar": T.tensor(2.0), "permuted": x.permute(1, 0, 2)}


@pytest.mark.parametrize("case", ["plain", "transposed", "sliced", "row", "expanded", "t", "scalar", "permuted"])
def test_stride_offset_contiguity_sizes(case):
    def run(T):
        v = _views(T)[case]
        c = v.contiguous()
        return [v.stride(), v.storage_offset(), v.is_contiguous(), v.element_size(), v.nbytes, v.itemsize,
                c.is_contiguous(), c.stride(), c, (c is v) == v.is_contiguous(),
                [v.stride(d) for d in range(-v.dim(), v.dim())]]
    both(run)


def test_stride_dim_out_of_range():
    same_err = {err_of(lambda: T.ones(2, 3).stride(2)) for T in LIBS}
    assert len(same_err) == 1 and next(iter(same_err))[0] == "IndexError"


def test_data_ptr_is_shared_by_views_and_differs_after_contiguous():
    for T in LIBS:
        x = T.zeros(3, 4, dtype=T.float64)
        assert x[0].data_ptr() == x.data_ptr()
        assert x[1].data_ptr() == x.data_ptr() + 4 * 8
        assert x.t().contiguous().data_ptr() != x.data_ptr()
        assert x.contiguous().data_ptr() == x.data_ptr()


def test_contiguous_copy_is_differentiable():
    def run(T):
        x = T.arange(6, dtype=T.float64).reshape(2, 3).requires_grad_()
        y = x.t().contiguous()
        (g,) = T.autograd.grad((y * T.arange(6, dtype=T.float64).reshape(3, 2)).sum(), x, create_graph=True)
        return [type(y.grad_fn).__name__, g]
    both(run)


def test_numel():
    for T in LIBS:
        assert T.numel(T.zeros(2, 3)) == 6 and T.numel(T.tensor(1.0)) == 1
    assert err_of(jitgrad.numel, [1, 2]) == err_of(torch.numel, [1, 2])


# ============================================================================= tensor() inference
@pytest.mark.parametrize("data", [[np.float64(1.5)], [np.float32(1.5)], [1.5, np.float64(2)], [np.int64(3)],
                                  [[np.float64(1)], [2.0]], [1.5, 2.5], [np.float32(1.5), 2]],
                         ids=["f64", "f32", "mixed", "i64", "nested", "py", "f32-int"])
def test_tensor_infers_numpy_scalars_in_lists(data):
    both(lambda T: T.tensor(data))


# ============================================================================= random initialisers
def test_uniform_with_a_generator_draws_torch_numbers():
    for dtype in ("float32", "float64"):
        def run(T):
            g = T.Generator().manual_seed(7)
            return [T.empty(5, dtype=getattr(T, dtype)).uniform_(-2, 3, generator=g),
                    T.rand(4, generator=g, dtype=getattr(T, dtype)), T.rand(2, 2, generator=T.Generator())]
        both(run, dtype)


def test_manual_seed_returns_the_default_generator():
    for T in LIBS:
        g = T.manual_seed(3)
        assert g is T.default_generator and g.initial_seed() == 3
    a = (jitgrad.manual_seed(5), jitgrad.rand(3))[1]
    b = (jitgrad.manual_seed(5), jitgrad.rand(3))[1]
    assert a.tolist() == b.tolist()


@pytest.mark.parametrize("op", ["uniform_", "normal_", "exponential_", "bernoulli_", "random_"])
def test_initialisers_are_reproducible_from_a_generator(op):
    args = {"uniform_": (), "normal_": (1.0, 2.0), "exponential_": (0.5,), "bernoulli_": (0.3,), "random_": (0, 9)}[op]
    a = getattr(jitgrad.empty(1000, dtype=jitgrad.float64), op)(*args, generator=jitgrad.Generator().manual_seed(1))
    b = getattr(jitgrad.empty(1000, dtype=jitgrad.float64), op)(*args, generator=jitgrad.Generator().manual_seed(1))
    assert a.tolist() == b.tolist()


def test_initialiser_distributions():
    jitgrad.manual_seed(0)
    n = 200_000
    x = jitgrad.empty(n, dtype=jitgrad.float64)
    u = x.uniform_(2, 4).numpy()
    assert u.min() >= 2 and u.max() < 4 and abs(u.mean() - 3) < 0.01
    z = x.normal_(1.0, 2.0).numpy()
    assert abs(z.mean() - 1) < 0.02 and abs(z.std() - 2) < 0.02
    e = x.exponential_(4.0).numpy()
    assert e.min() >= 0 and abs(e.mean() - 0.25) < 0.005
    b = x.bernoulli_(0.3).numpy()
    assert set(np.unique(b)) <= {0.0, 1.0} and abs(b.mean() - 0.3) < 0.01
    r = jitgrad.empty(n, dtype=jitgrad.int64).random_(3, 7).numpy()
    assert set(np.unique(r)) == {3, 4, 5, 6}
    r = jitgrad.empty(n, dtype=jitgrad.int64).random_(5).numpy()
    assert set(np.unique(r)) == {0, 1, 2, 3, 4}
    g = jitgrad.Generator().manual_seed(0)
    zg = jitgrad.empty(n, dtype=jitgrad.float64).normal_(generator=g).numpy()
    assert abs(zg.mean()) < 0.02 and abs(zg.std() - 1) < 0.02


def test_initialisers_return_self_bump_the_version_and_respect_leaf_rules():
    for T in LIBS:
        x = T.zeros(4, dtype=T.float64)
        v = x._version
        assert x.uniform_() is x and x.normal_() is x and x.bernoulli_() is x
        assert x._version > v
        w = T.zeros(3, requires_grad=True)
        e = err_of(w.uniform_)
        assert e[0] == "RuntimeError" and "a leaf Variable that requires grad" in e[1]
        with T.no_grad():
            w.normal_()


def test_initialiser_on_a_view_writes_the_base():
    for T in LIBS:
        x = T.zeros(3, 4, dtype=T.float64)
        x[1].uniform_(5, 6)
        a = x.numpy()
        assert (a[1] >= 5).all() and (a[0] == 0).all() and (a[2] == 0).all()


def test_initialiser_on_a_non_leaf_gives_a_zero_gradient():
    def run(T):
        a = T.ones(3, dtype=T.float64, requires_grad=True)
        y = a * 2
        y.uniform_()
        (g,) = T.autograd.grad(y.sum(), a)
        return g
    both(run)


@pytest.mark.parametrize("call", ["uniform_(2, 1)", "normal_(0, -1)", "exponential_(0)", "bernoulli_(1.5)",
                                  "random_(3, 3)"])
def test_initialiser_errors(call):
    errs = [err_of(lambda T=T: eval("T.zeros(3, dtype=T.float64)." + call)) for T in LIBS]
    assert errs[0] is not None and errs[0][0] == errs[1][0] and errs[1][1].startswith(errs[0][1][:25]), errs


def test_float_only_initialisers_reject_integers():
    for call in ("uniform_()", "normal_()", "exponential_()"):
        errs = [err_of(lambda T=T: eval("T.zeros(3, dtype=T.int64)." + call)) for T in LIBS]
        assert errs[0] == errs[1], errs


@pytest.mark.parametrize("shape,wrap", [((3, 3), False), ((5, 3), False), ((5, 3), True), ((3, 5), False),
                                        ((2, 2, 2), False), ((7, 2), True)])
def test_fill_diagonal(shape, wrap):
    def run(T):
        x = T.zeros(shape, dtype=T.float64)
        return x.fill_diagonal_(2.5, wrap=wrap)
    both(run)


def test_fill_diagonal_gradient_and_errors():
    def run(T):
        a = T.arange(1.0, 10.0, dtype=T.float64).reshape(3, 3).requires_grad_()
        y = a * a
        y.fill_diagonal_(0.0)
        (g,) = T.autograd.grad(y.sum(), a, create_graph=True)
        (gg,) = T.autograd.grad(g.sum(), a)
        return [g, gg]
    both(run)
    for shape in ((3,), (2, 3, 3)):
        errs = [err_of(lambda T=T: T.zeros(shape).fill_diagonal_(1)) for T in LIBS]
        assert errs[0] == errs[1], errs


# ============================================================================= samplers
def test_bernoulli_values_dtype_and_zero_gradient():
    jitgrad.manual_seed(0)
    p = jitgrad.tensor([0.0, 1.0, 0.5] * 20000, dtype=jitgrad.float64)
    b = jitgrad.bernoulli(p)
    assert b.dtype == jitgrad.float64 and b[0::3].sum() == 0 and b[1::3].sum() == 20000
    assert abs(b[2::3].mean().item() - 0.5) < 0.02
    assert abs(p.bernoulli().mean().item() - 0.5) < 0.01 and jitgrad.bernoulli(p, 0.0).sum() == 0

    def run(T):
        q = T.full((4,), 0.5, dtype=T.float64, requires_grad=True)
        y = T.bernoulli(q, generator=T.Generator().manual_seed(0))
        (g,) = T.autograd.grad((y * 3).sum(), q)
        return [y.requires_grad, g]
    both(run)


def test_bernoulli_errors():
    for call in (lambda T: T.bernoulli(T.tensor([1.5])), lambda T: T.bernoulli(T.tensor([1, 0]))):
        errs = [err_of(call, T) for T in LIBS]
        assert errs[0][0] == errs[1][0] and errs[0][1][:20] == errs[1][1][:20], errs


def test_multinomial():
    jitgrad.manual_seed(0)
    w = jitgrad.tensor([0.0, 1.0, 3.0])
    d = jitgrad.multinomial(w, 40000, replacement=True)
    counts = np.bincount(d.numpy(), minlength=3)
    assert d.dtype == jitgrad.int64 and counts[0] == 0 and abs(counts[2] / counts[1] - 3) < 0.15
    rows = jitgrad.tensor([[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 5.0, 1.0]])
    s = rows.multinomial(2)
    assert s.shape == (2, 2) and len(set(s[0].tolist())) == 2 and sorted(s[1].tolist()) == [2, 3]

    def run(T):
        g = T.Generator().manual_seed(11)
        return T.multinomial(T.tensor([0.2, 0.3, 0.5], dtype=T.float64), 6, True, generator=g)
    both(run)  # with replacement and a generator: torch's own draws


@pytest.mark.parametrize("call", ["T.multinomial(T.tensor([1.0, 2.0]), 3)", "T.multinomial(T.tensor([1.0, -1.0]), 1)",
                                  "T.multinomial(T.tensor([1.0]), 0)", "T.multinomial(T.ones(1, 1, 2), 1)",
                                  "T.multinomial(T.tensor([0.0, 0.0]), 1)"])
def test_multinomial_errors(call):
    errs = [err_of(lambda T=T: eval(call)) for T in LIBS]
    assert errs[0] is not None and errs[0] == errs[1], errs


def test_normal_forms_shapes_dtypes_and_zero_gradients():
    def run(T):
        mean = T.zeros(3, 1, dtype=T.float64, requires_grad=True)
        std = T.ones(4, dtype=T.float64, requires_grad=True)
        a = T.normal(mean, std)
        b = T.normal(mean, 2.0)
        c = T.normal(0.0, std)
        d = T.normal(1.0, 2.0, size=(2, 5))
        gm, gs = T.autograd.grad((a * a).sum() + b.sum() + c.sum(), (mean, std))
        return [a.shape, b.shape, c.shape, d.shape, str(a.dtype), str(d.dtype), a.requires_grad, gm, gs]
    both(run)
    jitgrad.manual_seed(0)
    m = jitgrad.normal(jitgrad.full((100000,), 3.0), 0.5).numpy()
    assert abs(m.mean() - 3) < 0.01 and abs(m.std() - 0.5) < 0.01


def test_normal_errors():
    for call in (lambda T: T.normal(T.zeros(2), -1.0), lambda T: T.normal(0.0, -1.0, size=(2,))):
        errs = [err_of(call, T) for T in LIBS]
        assert errs[0][0] == errs[1][0] and errs[0][1][:20] == errs[1][1][:20], errs


def test_like_factories():
    def run(T):
        x = T.zeros(2, 3, dtype=T.float64)
        i = T.randint_like(x, 10)
        j = T.randint_like(x, 5, 8)
        ia, ja = i.numpy(), j.numpy()
        return [T.rand_like(x).shape, str(T.randn_like(x).dtype), str(i.dtype), i.shape,
                bool(((ia >= 0) & (ia < 10)).all()), bool(((ja >= 5) & (ja < 8)).all())]
    both(run)


def test_a_generator_draw_leaves_the_global_generator_alone():
    jitgrad.manual_seed(4)
    expected = jitgrad.rand(3).tolist()
    jitgrad.manual_seed(4)
    jitgrad.rand(5, generator=jitgrad.Generator())
    jitgrad.randn(5, generator=jitgrad.Generator())
    assert jitgrad.rand(3).tolist() == expected
    for T in LIBS:
        assert err_of(lambda: T.randn(2, dtype=T.int64, generator=T.Generator())) == \
            err_of(lambda: T.randn(2, dtype=T.int64))


def test_generator_keyword_type_error():
    for T in LIBS:
        e = err_of(lambda: T.rand(2, generator=3))
        assert e[0] == "TypeError"


# ============================================================================= printing, accelerator
@pytest.mark.parametrize("opts", [{}, {"precision": 2}, {"sci_mode": False}, {"sci_mode": True}, {"threshold": 5},
                                  {"linewidth": 40}, {"threshold": 10, "edgeitems": 1}, {"profile": "full"},
                                  {"profile": "short"}])
def test_set_printoptions_changes_repr(opts):
    arrays = [np.arange(2000, dtype=np.float32).reshape(40, 50) / 7, np.arange(1500), np.linspace(-1, 1, 12).reshape(3, 4),
              np.array([1e-5, 1.0, 3.0]), np.arange(24.0).reshape(2, 3, 4),
              np.random.RandomState(0).randn(5000).reshape(10, 10, 50)]
    try:
        for T in LIBS:
            T.set_printoptions(**opts)
        for a in arrays:
            assert repr(jitgrad.tensor(a)) == repr(torch.tensor(a))
    finally:
        for T in LIBS:
            T.set_printoptions(profile="default")


def test_accelerator_without_a_device():
    assert jitgrad.accelerator.is_available() == jitgrad.cuda.is_available()
    if not jitgrad.cuda.is_available():
        assert jitgrad.accelerator.current_accelerator() is None
    else:
        assert jitgrad.accelerator.current_accelerator() == jitgrad.device("cuda")
