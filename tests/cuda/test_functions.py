"""numpy's functions on device arrays (gpu/kernels/reduce.py, functions.py, indexing.py):
each against numpy on the same data, with numpy's result dtypes and errors: reductions
(both kernel layouts), creation with like=, joins and views, advanced indexing for
reading, assignment and np.add.at, and the same-device rule."""
import numpy as np
import pytest

from jitgrad.gpu.array import DeviceArray
from jitgrad.gpu.kernels import reduce as gpu_reduce

MIXED = "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!"


def dev(x):
    return DeviceArray.from_host(np.asarray(x))


def same(got, want, exact=False):
    """got (a DeviceArray) holds want (numpy's result): shape, dtype and values."""
    assert isinstance(got, DeviceArray), type(got)
    want = np.asarray(want)
    host = got.get()
    assert host.shape == want.shape and host.dtype == want.dtype, (host.shape, host.dtype, want.shape, want.dtype)
    if exact or want.dtype.kind not in "fc":
        np.testing.assert_array_equal(host, want)
    else:
        rtol = {np.dtype(np.float64): 1e-12, np.dtype(np.float32): 1e-5}.get(want.dtype, 1e-3)
        np.testing.assert_allclose(host, want, rtol=rtol, atol=1e-12)


@pytest.fixture
def x(rng):
    return rng.standard_normal((3, 4, 5))


# -- reductions ---------------------------------------------------------------------------------------
REDUCTIONS = [np.sum, np.prod, np.mean, np.max, np.min, np.amax, np.amin, np.all, np.any, np.count_nonzero]
AXES = [None, 0, -1, (0, 2), (1,), ()]


@pytest.mark.parametrize("fn", REDUCTIONS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("axis", AXES, ids=str)
@pytest.mark.parametrize("keepdims", [False, True])
def test_reductions_match_numpy(fn, axis, keepdims, x):
    x = np.where(np.abs(x) < 0.3, 0.0, x)  # zeros, for all/any/count_nonzero
    same(fn(dev(x), axis=axis, keepdims=keepdims), fn(x, axis=axis, keepdims=keepdims))


@pytest.mark.parametrize("fn", [np.argmax, np.argmin], ids=lambda f: f.__name__)
@pytest.mark.parametrize("axis", [None, 0, 1, -1])
@pytest.mark.parametrize("keepdims", [False, True])
def test_argmax_argmin_match_numpy(fn, axis, keepdims, x):
    same(fn(dev(x), axis=axis, keepdims=keepdims), fn(x, axis=axis, keepdims=keepdims))


@pytest.mark.parametrize("fn", [np.sum, np.mean, np.max, np.min, np.argmax, np.argmin, np.prod, np.any],
                         ids=lambda f: f.__name__)
@pytest.mark.parametrize("shape,axis", [((3, 70), 1), ((70, 3), 0), ((2, 40, 3), (0, 1)), ((90,), None)])
def test_long_rows_take_the_block_per_row_kernel(fn, shape, axis, rng):
    x = rng.uniform(0.9, 1.1, shape)  # products stay finite
    if fn in (np.argmax, np.argmin) and isinstance(axis, tuple):
        with pytest.raises(TypeError, match="'tuple' object cannot be interpreted as an integer"):
            fn(dev(x), axis=axis)
        return
    kept = np.prod([n for d, n in enumerate(shape) if axis is not None and d not in np.atleast_1d(axis)])
    cols = x.size // kept
    assert cols >= gpu_reduce.BLOCK_COLS  # the block-per-row layout, with its shared-memory tree
    same(fn(dev(x), axis=axis), fn(x, axis=axis))


@pytest.mark.parametrize("fn", [np.sum, np.mean, np.max, np.min, np.prod, np.all, np.any, np.count_nonzero],
                         ids=lambda f: f.__name__)
def test_few_long_rows_are_split_over_blocks(fn, rng, monkeypatch):
    # the thresholds scaled down to simulator sizes: segments of 16, rows of at least 100
    monkeypatch.setattr(gpu_reduce, "SPLIT_COLS", 100)
    monkeypatch.setattr(gpu_reduce, "SEGMENT", 16)
    x = rng.uniform(0.95, 1.05, (2, 130, 3))
    x[1, 5:, 0] = 0.0
    t = x.transpose(1, 0, 2)
    for a, axis in [(x, None), (x, (1, 2)), (t, (0, 2)), (t, None), (x, 1)]:
        rows, cols = gpu_reduce._plan(dev(a), axis)[2:]
        assert (gpu_reduce._segments(gpu_reduce.SUM, rows, cols) > 1) == (cols >= 100)
        same(fn(dev(a), axis=axis), fn(a, axis=axis))


def test_argmax_ties_and_nan_follow_numpy():
    x = np.array([[1.0, 3.0, 3.0, 0.0], [np.nan, 2.0, np.nan, 5.0], [2.0, 2.0, 2.0, 2.0]])
    long = np.tile(x, (1, 20))  # the same, through the block kernel
    for a in (x, long):
        for fn in (np.argmax, np.argmin, np.max, np.min):
            same(fn(dev(a), axis=1), fn(a, axis=1))
        same(np.argmax(dev(a)), np.argmax(a))
        same(np.sum(dev(a), axis=1), np.sum(a, axis=1))


@pytest.mark.parametrize("view", [lambda a: a.transpose(2, 0, 1), lambda a: a[:, ::2, 1:], lambda a: a[::-1, 1],
                                  lambda a: np.broadcast_to(a[:, :1], (3, 6, 5))])
def test_reductions_read_views_in_place(view, x):
    for fn in (np.sum, np.max, np.argmin, np.mean):
        for axis in (None, 0, -1):
            same(fn(view(dev(x)), axis=axis), fn(view(x), axis=axis))


def test_contiguous_dims_are_merged_for_the_kernels(rng):
    x = rng.standard_normal((2, 3, 1, 4, 5))
    kept, red = gpu_reduce._geom(dev(x), (0, 1)), gpu_reduce._geom(dev(x), (2, 3, 4))
    assert kept == ((6,), (20,)) and red == ((20,), (1,))
    assert gpu_reduce._geom(dev(x).transpose(4, 3, 2, 1, 0), (0, 1, 2)) == ((5, 4), (1, 5))
    assert gpu_reduce._geom(dev(x), ()) == ((1,), (0,))
    for axis in ((0, 1), (2, 3, 4), (0, 3), (1, 2)):
        same(np.sum(dev(x), axis=axis), np.sum(x, axis=axis))
        same(np.argmax(dev(x).reshape(6, 20), axis=1), np.argmax(x.reshape(6, 20), axis=1))


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.bool_, np.float32, np.float64])  # jitgrad's dtypes
def test_result_dtypes_are_numpys(dtype, rng):
    x = rng.integers(0, 3, (4, 6)).astype(dtype)
    d = dev(x)
    for fn in (np.sum, np.prod, np.max, np.min, np.all, np.any, np.argmax, np.count_nonzero):
        same(fn(d, axis=0), fn(x, axis=0))
        same(fn(d), fn(x))
    same(np.mean(d, axis=1), np.mean(x, axis=1))
    same(np.sum(d, axis=1, dtype=np.float64), np.sum(x, axis=1, dtype=np.float64))
    same(np.sum(d, axis=0, dtype=np.int32), np.sum(x, axis=0, dtype=np.int32))
    same(np.mean(d, dtype=np.float32), np.mean(x, dtype=np.float32))


def test_ufunc_reduce_methods_and_array_methods(x):
    d = dev(x)
    same(np.add.reduce(d), np.add.reduce(x))  # the ufunc's default axis is 0
    same(np.add.reduce(d, axis=(0, 1), keepdims=True), np.add.reduce(x, axis=(0, 1), keepdims=True))
    same(np.maximum.reduce(d, axis=-1), np.maximum.reduce(x, axis=-1))
    same(np.minimum.reduce(d, axis=None), np.minimum.reduce(x, axis=None))
    same(np.multiply.reduce(d, 1), np.multiply.reduce(x, 1))
    b = x > 0
    same(np.logical_and.reduce(dev(b), axis=2), np.logical_and.reduce(b, axis=2))
    same(np.logical_or.reduce(dev(b), axis=0), np.logical_or.reduce(b, axis=0))
    same(d.sum(axis=1, keepdims=True), x.sum(axis=1, keepdims=True))
    same(d.mean(), x.mean())
    same(d.max(axis=0), x.max(axis=0))
    same(d.min(), x.min())
    same(d.prod(axis=(0, 1)), x.prod(axis=(0, 1)))
    same(d.argmax(axis=1), x.argmax(axis=1))
    same(d.argmin(), x.argmin())
    same(d.T.flatten(), x.T.flatten())
    same(d[:, :1].squeeze(), x[:, :1].squeeze())
    for got, want in zip(dev(b).nonzero(), b.nonzero()):
        same(got, want)
    same(dev(b).all(axis=1), b.all(axis=1))
    same(dev(b).any(), b.any())
    assert float(np.sum(d)) == pytest.approx(float(x.sum()), rel=1e-12)


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # the simulator's 0/0 for an empty mean
def test_empty_reductions(rng):
    e = np.zeros((0, 3))
    for fn in (np.sum, np.prod, np.all, np.any, np.count_nonzero):
        same(fn(dev(e), axis=0), fn(e, axis=0))
        same(fn(dev(e)), fn(e))
    same(np.max(dev(e), axis=1), np.max(e, axis=1))  # no rows: nothing to reduce
    with pytest.raises(ValueError, match="^zero-size array to reduction operation maximum which has no identity"):
        np.max(dev(e), axis=0)
    with pytest.raises(ValueError, match="^zero-size array to reduction operation minimum which has no identity"):
        np.min(dev(e))
    with pytest.raises(ValueError, match="^attempt to get argmax of an empty sequence"):
        np.argmax(dev(e))
    assert np.isnan(np.mean(dev(e)).get())


def test_trace_and_diagonal(rng):
    a = rng.standard_normal((4, 6))
    for k in (0, 2, -1, 7):
        same(np.trace(dev(a), offset=k), np.trace(a, offset=k))
        same(np.diagonal(dev(a), k), np.diagonal(a, k))
    i = rng.integers(-5, 5, (3, 3)).astype(np.int32)
    same(np.trace(dev(i)), np.trace(i))  # int32 -> int64, as numpy
    b = rng.standard_normal((2, 3, 4))
    same(np.diagonal(dev(b), 1, 0, 2), np.diagonal(b, 1, 0, 2))


def test_reductions_refuse_what_they_do_not_do(x):
    with pytest.raises(TypeError, match="not supported on cuda tensors by jitgrad yet"):
        np.sum(dev(x), where=dev(x > 0))
    with pytest.raises(np.exceptions.AxisError):
        np.sum(dev(x), axis=3)
    with pytest.raises(ValueError, match="duplicate value in 'axis'"):
        np.sum(dev(x), axis=(0, 0))


# -- creation with like= -----------------------------------------------------------------------------
def test_creation_with_like_makes_device_arrays():
    like = dev(np.zeros(1))
    same(np.zeros((2, 3), like=like), np.zeros((2, 3)))
    same(np.zeros(4, np.int32, like=like), np.zeros(4, np.int32))
    same(np.ones((2,), dtype=np.float32, like=like), np.ones((2,), dtype=np.float32))
    e = np.empty((3, 2), np.int64, like=like)
    assert isinstance(e, DeviceArray) and e.shape == (3, 2) and e.dtype == np.int64
    same(np.full((2, 2), 7, like=like), np.full((2, 2), 7))
    same(np.full(3, 2.5, dtype=np.float32, like=like), np.full(3, 2.5, dtype=np.float32))
    same(np.full((2, 3), dev(np.arange(3.0)), like=like), np.full((2, 3), np.arange(3.0)))
    for args in [(5,), (2, 9), (2, 9, 3), (10, 0, -3), (0.5, 2.0, 0.25), (3, 1)]:
        same(np.arange(*args, like=like), np.arange(*args))
    same(np.arange(4, dtype=np.float32, like=like), np.arange(4, dtype=np.float32))
    for args, kw in [((3,), {}), ((2, 4), {}), ((4, 3), {"k": 1}), ((3, 5), {"k": -2}), ((3,), {"dtype": np.int32})]:
        same(np.eye(*args, like=like, **kw), np.eye(*args, **kw))
    host = np.arange(6.0).reshape(2, 3)
    same(np.array(host, like=like), host)
    same(np.array([[1, 2], [3, 4]], dtype=np.float32, like=like), np.array([[1, 2], [3, 4]], dtype=np.float32))
    same(np.asarray([1.5, 2.5], like=like), np.asarray([1.5, 2.5]))
    d = dev(host)
    assert np.asarray(d, like=like) is d  # device data is not copied
    assert np.array(d, like=like) is not d
    same(np.asarray(d, dtype=np.float32, like=like), host.astype(np.float32))
    same(np.array(np.float64(3.0), ndmin=2, like=like), np.array(3.0, ndmin=2))


def test_like_functions_keep_shape_and_dtype(x):
    d = dev(x.astype(np.float32))
    same(np.zeros_like(d), np.zeros_like(x, np.float32))
    same(np.ones_like(d, dtype=np.int64), np.ones_like(x, dtype=np.int64))
    same(np.full_like(d, 3), np.full_like(x.astype(np.float32), 3))
    same(np.zeros_like(d, shape=(2,)), np.zeros(2, np.float32))
    e = np.empty_like(d)
    assert isinstance(e, DeviceArray) and e.shape == x.shape and e.dtype == np.float32
    same(np.zeros_like(d[:, ::2].T), np.zeros_like(x[:, ::2].T, np.float32))


# -- joins, selection, views -------------------------------------------------------------------------
def test_concatenate_and_stack(rng):
    a, b, c = rng.standard_normal((2, 3)), rng.standard_normal((4, 3)), rng.standard_normal((2, 3))
    same(np.concatenate([dev(a), dev(b)]), np.concatenate([a, b]))
    same(np.concatenate([dev(a), dev(c)], axis=-1), np.concatenate([a, c], axis=-1))
    same(np.concatenate([dev(a), dev(b.T[:, :2])], axis=None), np.concatenate([a, b.T[:, :2]], axis=None))
    same(np.concatenate([dev(a.T), dev(c.T)], axis=1), np.concatenate([a.T, c.T], axis=1))  # strided inputs
    i = np.arange(3, dtype=np.int32).reshape(1, 3)
    same(np.concatenate([dev(a), dev(i)]), np.concatenate([a, i]))  # numpy's result dtype
    same(np.concatenate([dev(np.zeros((0, 3))), dev(a)]), np.concatenate([np.zeros((0, 3)), a]))
    for axis in (0, 1, 2, -1):
        same(np.stack([dev(a), dev(c)], axis=axis), np.stack([a, c], axis=axis))
    with pytest.raises(ValueError, match="^all the input array dimensions except for the concatenation axis"):
        np.concatenate([dev(a), dev(b)], axis=1)
    with pytest.raises(ValueError, match="^all input arrays must have the same shape"):
        np.stack([dev(a), dev(b)])
    with pytest.raises(ValueError, match="^zero-dimensional arrays cannot be concatenated"):
        np.concatenate([dev(np.float64(1.0)), dev(np.float64(2.0))])


def test_where(rng):
    c = rng.random((3, 4)) > 0.5
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((1, 4))
    same(np.where(dev(c), dev(a), dev(b)), np.where(c, a, b))
    same(np.where(dev(c), dev(a), 0.0), np.where(c, a, 0.0))
    same(np.where(dev(c[:, :1]), 1.5, dev(b)), np.where(c[:, :1], 1.5, b))
    f = a.astype(np.float32)
    same(np.where(dev(c), dev(f), 2.0), np.where(c, f, 2.0))  # a Python float is weak: float32
    same(np.where(dev(c), dev(f), np.float64(2.0)), np.where(c, f, np.float64(2.0)))
    same(np.where(dev(c), dev(a.T.T), np.array(1.0)), np.where(c, a, np.array(1.0)))  # a host 0-d is a scalar
    same(np.where(dev(a > 0), 1, 0), np.where(a > 0, 1, 0))
    for got, want in zip(np.where(dev(c)), np.where(c)):
        same(got, want)


def test_isclose_and_allclose():
    a = np.array([1.0, np.nan, np.inf, -np.inf, 1e-9, 5.0, np.nan])
    b = np.array([[1.0 + 1e-7, np.nan, np.inf, np.inf, 0.0, 5.1, 1.0]])
    for kw in ({}, {"equal_nan": True}, {"rtol": 0.05}, {"atol": 0.0}):
        same(np.isclose(dev(a), dev(b), **kw), np.isclose(a, b, **kw))
    assert np.allclose(dev(a[:1]), dev(b[:, :1])) is True
    assert np.allclose(dev(a), dev(a), equal_nan=True) and not np.allclose(dev(a), dev(a))
    i = np.arange(4, dtype=np.int64)
    same(np.isclose(dev(i), 2), np.isclose(i, 2))


def test_views_share_the_buffer(x):
    d = dev(x)
    cases = [
        (lambda m: np.moveaxis(m, 0, -1), True), (lambda m: np.moveaxis(m, (0, 1), (2, 0)), True),
        (lambda m: np.expand_dims(m, 1), True), (lambda m: np.expand_dims(m, (0, -1)), True),
        (lambda m: np.squeeze(m[:1, :, :1]), True), (lambda m: np.squeeze(m[:, :1], axis=1), True),
        (lambda m: np.transpose(m), True), (lambda m: np.transpose(m, (1, 0, 2)), True),
        (lambda m: np.swapaxes(m, 0, 2), True), (lambda m: np.flip(m), True), (lambda m: np.flip(m, 1), True),
        (lambda m: np.flip(m, (0, 2)), True), (lambda m: np.broadcast_to(m[:, :1], (2, 3, 4, 5)), True),
        (lambda m: np.reshape(m, (12, 5)), True), (lambda m: np.reshape(m, -1), True), (lambda m: np.ravel(m), True),
        (lambda m: np.ascontiguousarray(m, like=m), True), (lambda m: np.ascontiguousarray(m.T, like=m), False),
        (lambda m: np.copy(m), False), (lambda m: np.repeat(m, 2, axis=1), False), (lambda m: np.repeat(m, 3), False),
        (lambda m: np.reshape(m.T, (5, 12)), False),
    ]
    for k, (f, view) in enumerate(cases):
        got = f(d)
        same(got, f(x), exact=True)
        assert (got.buf is d.buf) == view, k
    assert np.shape(d) == x.shape and np.ndim(d) == 3 and np.size(d) == x.size and np.size(d, 1) == 4
    assert np.result_type(d, 1.0) == np.float64 and np.result_type(dev(x.astype(np.float32)), 2.0) == np.float32
    assert np.result_type(dev(np.ones(2, np.int32)), np.int64) == np.int64
    with pytest.raises(ValueError, match="cannot select an axis to squeeze out"):
        np.squeeze(d, 0)


# -- advanced indexing ---------------------------------------------------------------------------------
A = np.arange(4 * 5 * 6, dtype=np.float64).reshape(4, 5, 6)
MASK0 = np.array([True, False, True, True])
MASK12 = (A[0] % 3) == 1
KEYS = [
    [0, 2], [[0, 1], [3, 2]], [-1, 0, -4], [], (slice(None), [1, 3]), (Ellipsis, [0, -1]),
    ([0, 1], slice(None), [2, 3]),            # not adjacent: the advanced dims go first
    (slice(None), [0, 1], [2, 3]),            # adjacent: in place
    (0, slice(None), [1, 2]),                 # an int is advanced: not adjacent
    (slice(None), 0, [1, 2]),                 # adjacent
    (slice(1, 3), None, [0, 4]), ([1, 2], None, [0, 4]), (slice(None), [0, 1, 2], None, [0, 1, 2]),
    (np.array([[0], [3]]), np.array([1, 2, 4])),  # broadcasting index arrays
    (slice(None, None, -1), [1, 1, 1], slice(1, None, 2)), MASK0, (Ellipsis, MASK12[0]), (1, MASK12),
    (MASK0, slice(None), [5, 0, 1]), (slice(None), MASK12), A > 100, (True,), (False,), (Ellipsis, True),
    (np.array(2),), ([1], 2, 3),
]


def _key_on_device(key):
    key = key if isinstance(key, tuple) else (key,)
    return tuple(dev(k) if isinstance(k, (list, np.ndarray)) and np.asarray(k).size else k for k in key)


@pytest.mark.parametrize("key", KEYS, ids=range(len(KEYS)))
def test_getitem_advanced_matches_numpy(key):
    want = A[key]
    same(dev(A)[key], want, exact=True)  # host indices move to the device
    same(dev(A)[_key_on_device(key)], want, exact=True)


@pytest.mark.parametrize("key", KEYS[:10], ids=range(10))
def test_getitem_advanced_on_views(key):
    v = np.ascontiguousarray(A.transpose(1, 0, 2))[:, ::-1]
    d = dev(A).transpose(1, 0, 2)[:, ::-1]
    same(d[key], v[key], exact=True)


@pytest.mark.parametrize("key", KEYS, ids=range(len(KEYS)))
def test_setitem_advanced_matches_numpy(key, rng):
    want = A.copy()
    want[key] = -1.0
    d = dev(A)
    d[key] = -1.0
    same(d, want, exact=True)
    targets = np.arange(A.size).reshape(A.shape)[key].ravel()
    if len(set(targets.tolist())) < targets.size:
        return  # a repeated target: which value lands is not defined (as in PyTorch on CUDA)
    vals = rng.standard_normal(A[key].shape[-1:])  # broadcast along the leading dims
    want = A.copy()
    want[key] = vals
    d = dev(A)
    d[_key_on_device(key)] = dev(vals)
    same(d, want, exact=True)


def test_setitem_from_the_same_array_reads_a_copy():
    a = np.arange(10.0)
    d = dev(a)
    d[[1, 2, 3]] = d[0:3]  # overlapping: numpy reads the values before writing
    a[[1, 2, 3]] = a[0:3]
    same(d, a, exact=True)
    d[dev(np.array([9, 8, 7]))] = d[7:]
    a[[9, 8, 7]] = a[7:]
    same(d, a, exact=True)


def test_setitem_mask_and_cast():
    a = np.arange(6, dtype=np.int64)
    d = dev(a)
    d[dev(a % 2 == 0)] = 7.9  # cast to the array's dtype, as numpy
    a[a % 2 == 0] = 7.9
    same(d, a)
    f = dev(np.zeros(4, np.float32))
    f[[0, 3]] = dev(np.array([1.5, 2.5]))
    same(f, np.array([1.5, 0, 0, 2.5], np.float32))


def test_index_errors_are_numpys():
    d = dev(A)
    cases = [
        ([4], r"^index 4 is out of bounds for axis 0 with size 4$"),
        ((slice(None), [0, -6]), r"^index -6 is out of bounds for axis 1 with size 5$"),
        ((0, [1], 9), r"^index 9 is out of bounds for axis 2 with size 6$"),
        (np.array([1.0]), r"^arrays used as indices must be of integer \(or boolean\) type"),
        ([1.0], r"^only integers, slices"),
        (np.ones(3, bool), r"^boolean index did not match indexed array along axis 0; size of axis is 4 but size "
                           r"of corresponding boolean axis is 3"),
        (([0, 1], [0, 1, 2]), r"^shape mismatch: indexing arrays could not be broadcast together with shapes "
                              r"\(2,\) \(3,\)"),
        (([0], 0, 0, 0), r"^too many indices for array: array is 3-dimensional, but 4 were indexed"),
        (([0], Ellipsis, Ellipsis), r"^an index can only have a single ellipsis"),
        (([0], "a"), r"^only integers, slices"),
    ]
    for key, msg in cases:
        with pytest.raises(IndexError, match=msg):
            A[key]
        with pytest.raises(IndexError, match=msg):
            d[key]
    before = d.get()
    with pytest.raises(IndexError, match="out of bounds"):
        d[[0, 7]] = 1.0  # checked before anything is written
    same(d, before, exact=True)
    with pytest.raises(IndexError, match="out of bounds"):
        np.add.at(d, ([0, 1], [5, 0]), 1.0)
    same(d, before, exact=True)


def test_setitem_refuses_host_values():
    d = dev(A)
    with pytest.raises(RuntimeError, match="^" + MIXED.replace("!", "")):
        d[[0, 1]] = np.zeros((2, 5, 6))
    with pytest.raises(ValueError, match="^shape mismatch: value array of shape"):
        d[[0, 1]] = dev(np.zeros(3))


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int64, np.int32])
def test_add_at_accumulates_repeats(dtype, rng):
    a = np.zeros((4, 3), dtype)
    idx = np.array([0, 2, 0, 0, 3, 2])
    vals = rng.integers(-5, 5, (6, 3)).astype(dtype)
    d = dev(a)
    np.add.at(a, idx, vals)
    np.add.at(d, dev(idx), dev(vals))
    same(d, a)
    np.add.at(a, (idx, [0, 1, 0, 2, 2, 0]), dtype(1))
    np.add.at(d, (idx, [0, 1, 0, 2, 2, 0]), dtype(1))
    same(d, a)
    flat = np.zeros(12, dtype)
    fd = dev(flat)
    np.add.at(flat, [11, 0, 11], vals[:3, 0])
    np.add.at(fd, [11, 0, 11], dev(vals[:3, 0]))
    same(fd, flat)


def test_add_at_errors():
    with pytest.raises(TypeError, match="numpy.add.at on a cuda array of dtype bool"):
        np.add.at(dev(np.zeros(3, bool)), [0], True)
    with pytest.raises(RuntimeError, match="^" + MIXED.replace("!", "")):
        np.add.at(dev(np.zeros(3)), [0, 1], np.ones(2))


def test_take_and_along_axis(rng):
    a = rng.standard_normal((3, 4))
    idx = np.array([[0, 3], [2, 2], [1, 0]])
    same(np.take(dev(a), [5, 0, 11]), np.take(a, [5, 0, 11]))
    same(np.take(dev(a), dev(np.array([3, 1])), axis=1), np.take(a, [3, 1], axis=1))
    same(np.take(dev(a), 2, axis=0), np.take(a, 2, axis=0))
    same(np.take(dev(a), [[0, 1]], axis=-2), np.take(a, [[0, 1]], axis=-2))
    with pytest.raises(IndexError, match="^index 12 is out of bounds for axis 0 with size 12"):
        np.take(dev(a), [12])
    same(np.take_along_axis(dev(a), dev(idx), axis=1), np.take_along_axis(a, idx, axis=1))
    i0 = np.array([[2, 0, 1, 1]])
    same(np.take_along_axis(dev(a), i0, axis=0), np.take_along_axis(a, i0, axis=0))  # broadcast over dim 1
    same(np.take_along_axis(dev(a), dev(np.array([11, 0])), axis=None), np.take_along_axis(a, np.array([11, 0]), axis=None))
    with pytest.raises(ValueError, match="must have the same number of dimensions"):
        np.take_along_axis(dev(a), dev(np.array([0])), axis=1)
    b, d = a.copy(), dev(a)
    np.put_along_axis(b, idx[:, :1], -9.0, axis=1)
    np.put_along_axis(d, dev(idx[:, :1]), -9.0, axis=1)
    same(d, b)
    vals = np.array([[4.0, 5.0, 6.0, 7.0]])
    np.put_along_axis(b, i0, vals, axis=0)
    np.put_along_axis(d, dev(i0), dev(vals), axis=0)
    same(d, b)


@pytest.mark.parametrize("shape", [(0,), (7,), (3, 4), (2, 3, 5), (40, 130)])
def test_nonzero_and_flatnonzero(shape, rng):
    m = rng.random(shape) < 0.4
    for got, want in zip(np.nonzero(dev(m)), np.nonzero(m)):
        same(got, want)
    same(np.flatnonzero(dev(m)), np.flatnonzero(m))
    x = np.where(m, rng.standard_normal(shape), 0.0)
    same(np.flatnonzero(dev(x).T), np.flatnonzero(x.T))  # strided, not bool
    with pytest.raises(ValueError, match="^Calling nonzero on 0d arrays is not allowed"):
        np.nonzero(dev(np.array(True)))


def test_bincount(rng):
    x = rng.integers(0, 6, 20)
    same(np.bincount(dev(x)), np.bincount(x))
    same(np.bincount(dev(x), minlength=10), np.bincount(x, minlength=10))
    w = rng.standard_normal(20)
    same(np.bincount(dev(x), weights=dev(w)), np.bincount(x, weights=w))
    same(np.bincount(dev(np.zeros(0, np.int64)), minlength=3), np.bincount(np.zeros(0, np.int64), minlength=3))
    with pytest.raises(ValueError, match="must have no negative elements"):
        np.bincount(dev(np.array([1, -1])))


# -- devices and unsupported functions ------------------------------------------------------------------
def test_host_arrays_are_another_device():
    d = dev(np.ones((2, 3)))
    host = np.ones((2, 3))
    mask = dev(host > 0)
    for f in (lambda: np.concatenate([d, host]), lambda: np.stack([host, d]), lambda: np.where(mask, host, d),
              lambda: np.where(mask, d, host), lambda: np.where(host > 0, d, 1.0)):
        with pytest.raises(RuntimeError, match="^" + MIXED.replace("!", "")):
            f()
    same(np.where(mask, d, np.array(2.0)), np.ones((2, 3)))  # a host 0-d array is a scalar


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.bool_])
def test_unique_of_integers(dtype, rng):
    x = rng.integers(0, 2 if dtype == np.bool_ else 9, (4, 7)).astype(dtype)
    same(np.unique(dev(x)), np.unique(x))
    same(np.unique(dev(x).T[1:]), np.unique(x.T[1:]))
    same(np.unique(dev(np.zeros(0, dtype))), np.unique(np.zeros(0, dtype)))
    if dtype != np.bool_:
        neg = np.array([-7, 3, -7, 100, 0], dtype)
        same(np.unique(dev(neg)), np.unique(neg))


def test_unsupported_functions_name_themselves():
    with pytest.raises(TypeError, match=r"^numpy\.unique on cuda tensors is supported by jitgrad for integer arrays"):
        np.unique(dev(np.ones(3)))
    with pytest.raises(TypeError, match=r"^numpy\.unique on cuda tensors is supported by jitgrad for integer arrays"):
        np.unique(dev(np.ones(3, np.int64)), return_counts=True)
    with pytest.raises(TypeError, match=r"^numpy\.searchsorted is not supported on cuda tensors by jitgrad yet"):
        np.searchsorted(dev(np.arange(3)), dev(np.ones(3)))
    with pytest.raises(TypeError, match="per-element repeat counts is not supported"):
        np.repeat(dev(np.ones(3)), [1, 2, 3])


# -- every launch is one the PTX check compiles ------------------------------------------------------
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # int products wrap, as numpy's
def test_launches_are_declared_for_the_ptx_check(rng):
    """The argument types these functions launch their kernels with, over jitgrad's dtypes,
    are all in the modules' PTX_SIGNATURES (which gpu/ptx.py compiles for a real GPU)."""
    ptx = pytest.importorskip("jitgrad.gpu.ptx", reason="gpu/ptx.py (the PTX check) arrives with gpu-bench's branch")
    if not ptx.config.ENABLE_CUDASIM:
        pytest.skip("launches are recorded under the simulator (CI); on a GPU the PTX check covers them")
    with ptx.recording_launches() as seen:
        for dt in ("float32", "float64", "int64", "int32", "bool"):
            x = dev((rng.standard_normal((3, 40, 2)) > 0).astype(dt) if dt == "bool"
                    else (rng.standard_normal((3, 40, 2)) * 3).astype(dt))
            for fn in (np.sum, np.prod, np.max, np.min, np.all, np.any, np.argmax, np.argmin, np.count_nonzero):
                for axis in (None, 1, (0, 2)):
                    if fn in (np.argmax, np.argmin) and isinstance(axis, tuple):
                        continue
                    fn(x, axis=axis)
            np.mean(x, axis=1, dtype=np.float64)
            np.sum(x, axis=0, dtype=np.float32)
            np.trace(x[:, :, 0])
            x[[0, 2]]
            x[dev(np.array([True, False, True]))]
            np.concatenate([x, x])
            np.where(dev(np.ones((3, 40, 2), bool)), x, x)
            np.isclose(x, x)
            np.flatnonzero(x)
            np.take_along_axis(x, dev(np.zeros((3, 1, 2), np.int64)), axis=1)
            y = x.copy()
            y[[0, 1]] = x[[2, 0]]
            if dt != "bool":
                np.arange(5, dtype=dt, like=x)
                np.add.at(y, dev(np.array([0, 0])), x[:2])
        np.unique(dev(np.array([3, 1, 3], np.int64)))
        np.bincount(dev(np.array([3, 1, 3])), weights=dev(np.ones(3)))
        np.bincount(dev(np.array([3, 1, 3])))
    mine = [line for line in ptx.undeclared(seen) if ".kernels.copy." not in line]
    assert not mine, "\n".join(mine)
