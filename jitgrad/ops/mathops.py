"""Math and statistics ops composed from the existing primitives: their gradients (first and
higher order) come from the primitives' rules, so no new kernel is needed. Their grad_fn is
the last primitive's node (e.g. var's is DivBackward0 where PyTorch's is VarBackward0).
"""
import math
import warnings

import numpy as np

from jitgrad._core import dtype as _dt
from jitgrad._core.messages import c_name, scalar_name
from jitgrad.graph.tensor import Tensor, tensor, zeros
from jitgrad.graph.tensor import wrap as _wrap
from jitgrad.ops import elementwise as ew
from jitgrad.ops import linalg, reduce, shape
from jitgrad.ops._common import _needs, copy_array, need_tensor, refuse
from jitgrad.ops.shape import _dims, _wrap_dim

_LN2 = math.log(2.0)
_LN10 = math.log(10.0)


def _t(x, like):
    return x if isinstance(x, Tensor) else tensor(x, dtype=like.dtype)


def _safe_root(s, p=2):
    """s ** (1 / p) whose gradient at s == 0 is 0 (PyTorch's norm and std backward), not inf * 0 = nan."""
    zero = ew.eq(s.detach(), 0)
    s = ew.where(zero, 1.0, s)
    return ew.where(zero, 0.0, ew.sqrt(s) if p == 2 else ew.pow(s, 1.0 / p))


# --- statistics ----------------------------------------------------------------------------
def _correction(unbiased, correction):
    if correction is not None:
        return correction
    return 1 if unbiased is None or unbiased else 0


def var(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    if isinstance(dim, bool):  # var(x, False): the old unbiased positional form
        dim, unbiased = None, dim
    _floating_std(input, "var")
    dims = _dims(input, dim) if not (isinstance(dim, (tuple, list)) and len(dim) == 0) else _dims(input, None)
    n = 1
    for d in dims:
        n *= input.shape[d]
    mean = reduce.mean(input, dims, keepdim=True)
    dev = ew.sub(input, mean)
    ss = reduce.sum(ew.mul(dev, dev), dims, keepdim=keepdim)
    denom = n - _correction(unbiased, correction)
    if denom <= 0:
        warnings.warn("var(): degrees of freedom is <= 0. Correction should be strictly less than the reduction "
                      "factor (input numel divided by output numel).", UserWarning, stacklevel=3)
    with np.errstate(divide="ignore", invalid="ignore"):  # PyTorch gives inf / nan without numpy's warning
        return ew.div(ss, float(max(0, denom)))


def _floating_std(x, fn):
    if not x.is_floating_point():
        raise RuntimeError("std and var only support floating point and complex dtypes")


def std(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    return _safe_root(var(input, dim, unbiased, keepdim, correction=correction))


def var_mean(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    v = var(input, dim, unbiased, keepdim, correction=correction)
    if isinstance(dim, bool):
        dim = None
    dims = _dims(input, None if isinstance(dim, (tuple, list)) and len(dim) == 0 else dim)
    return v, reduce.mean(input, dims, keepdim=keepdim)


def std_mean(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    v, m = var_mean(input, dim, unbiased, keepdim, correction=correction)
    return _safe_root(v), m


def logsumexp(input, dim, keepdim=False):
    if not input.is_floating_point():
        input = ew.to_dtype(input, _dt.get_default_dtype())
    dims = _dims(input, dim)
    if not dims and input.ndim == 0:
        return ew.clone(input)
    # shift by the (constant) max for stability; an infinite max shifts by 0
    m = reduce.amax(input.detach(), dims, keepdim=True)
    m = ew.where(isinf(m), 0.0, m)
    s = ew.log(reduce.sum(ew.exp(ew.sub(input, m)), dims, keepdim=True))
    out = ew.add(s, m)
    return out if keepdim else shape.reshape(out, tuple(n for i, n in enumerate(out.shape) if i not in dims))


# --- norms ---------------------------------------------------------------------------------
def vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):  # noqa: A002
    if dtype is not None:
        x = ew.to_dtype(x, dtype)
    if not x.is_floating_point():
        raise RuntimeError(f"linalg.vector_norm: Expected a floating point or complex tensor as input. "
                           f"Got {scalar_name(x._data.dtype)}")
    dims = _dims(x, dim)
    a = ew.abs(x)
    if ord == 2:
        return _safe_root(reduce.sum(ew.mul(x, x), dims, keepdim=keepdim))
    if ord == 1:
        return reduce.sum(a, dims, keepdim=keepdim)
    if ord == math.inf:
        return reduce.amax(a, dims, keepdim=keepdim)
    if ord == -math.inf:
        return reduce.amin(a, dims, keepdim=keepdim)
    if ord == 0:
        return reduce.sum(ew.to_dtype(ew.ne(x, 0), x.dtype), dims, keepdim=keepdim)
    return _safe_root(reduce.sum(ew.pow(a, float(ord)), dims, keepdim=keepdim), ord)


def matrix_norm(A, ord="fro", dim=(-2, -1), keepdim=False, *, dtype=None):  # noqa: A002
    if A.ndim < 2:
        raise RuntimeError("linalg.matrix_norm: The input tensor A must have at least 2 dimensions.")
    if ord == "fro":
        return vector_norm(A, 2, dim, keepdim, dtype=dtype)
    if ord in (1, -1, math.inf, -math.inf):
        d0, d1 = (_wrap_dim(d, A.ndim) for d in dim)
        inner, outer = (d0, d1) if ord in (1, -1) else (d1, d0)
        s = reduce.sum(ew.abs(A), inner, keepdim=True)
        out = reduce.amax(s, outer, keepdim=True) if ord > 0 else reduce.amin(s, outer, keepdim=True)
        return out if keepdim else shape.reshape(out, tuple(n for i, n in enumerate(out.shape) if i not in (d0, d1)))
    raise NotImplementedError(f"linalg.matrix_norm: ord={ord!r} (nuclear and spectral norms need an SVD) "
                              "is not supported by jitgrad")


def linalg_norm(A, ord=None, dim=None, keepdim=False, *, dtype=None):  # noqa: A002
    if isinstance(ord, str) or (dim is not None and isinstance(dim, (tuple, list)) and len(dim) == 2) or \
            (ord is not None and dim is None and A.ndim == 2):
        return matrix_norm(A, "fro" if ord is None else ord, (-2, -1) if dim is None else dim, keepdim, dtype=dtype)
    return vector_norm(A, 2 if ord is None else ord, dim, keepdim, dtype=dtype)


def norm(input, p="fro", dim=None, keepdim=False, dtype=None):
    if p == "fro" or p is None:
        p = 2
    if p == "nuc":
        raise NotImplementedError("norm: p='nuc' (the nuclear norm needs an SVD) is not supported by jitgrad")
    return vector_norm(input, p, dim, keepdim, dtype=dtype)


# --- cumulative ----------------------------------------------------------------------------
def _to_last(x, dim):
    d = _wrap_dim(dim, max(x.ndim, 1))
    return d, (movedim(x, d, -1) if x.ndim else x)


def cumsum(input, dim, *, dtype=None):
    if dtype is not None:
        input = ew.to_dtype(input, dtype)
    elif not input.is_floating_point():
        input = ew.to_dtype(input, _dt.int64)  # PyTorch sums integers and bools in int64
    if input.ndim == 0:
        _wrap_dim(dim, 1)
        return ew.clone(input)
    d, x = _to_last(input, dim)
    n = x.shape[-1]
    if not input.is_floating_point():
        return movedim(tensor(np.cumsum(x._data, -1)), -1, d)
    # a product with an upper-triangular matrix of ones: each output sums its prefix
    upper = tensor(np.triu(np.ones((n, n), dtype=x._data.dtype)))
    return movedim(linalg.matmul(x, upper), -1, d)


def cumprod(input, dim, *, dtype=None):
    if dtype is not None:
        input = ew.to_dtype(input, dtype)
    elif not input.is_floating_point():
        input = ew.to_dtype(input, _dt.int64)
    if input.ndim == 0:
        _wrap_dim(dim, 1)
        return ew.clone(input)
    d, x = _to_last(input, dim)
    if not input.is_floating_point():
        return movedim(tensor(np.cumprod(x._data, -1)), -1, d)
    # running products; exact with zeros (no division), gradients from mul's rule
    cols = [x[..., 0]]
    for k in range(1, x.shape[-1]):
        cols.append(ew.mul(cols[-1], x[..., k]))
    return movedim(shape.stack(cols, -1), -1, d)


def diff(input, n=1, dim=-1, prepend=None, append=None):
    if input.ndim == 0:
        raise RuntimeError("diff expects input to be at least one-dimensional")
    d = _wrap_dim(dim, input.ndim)
    parts = [p for p in (prepend, input, append) if p is not None]
    x = shape.cat(parts, d) if len(parts) > 1 else input
    for _ in range(n):
        m = x.shape[d]
        hi = x[(slice(None),) * d + (slice(1, m),)]
        lo = x[(slice(None),) * d + (slice(0, m - 1),)]
        x = logical_xor(hi, lo) if x._data.dtype.kind == "b" else ew.sub(hi, lo)
    return x


isinf = ew._unary_logic(np.isinf, "isinf")
isposinf = ew._unary_logic(np.isposinf, "isposinf")
isneginf = ew._unary_logic(np.isneginf, "isneginf")
logical_xor = ew._cmp(np.logical_xor, "logical_xor", numbers=False)


# --- pointwise -----------------------------------------------------------------------------
def square(input):
    if input._data.dtype.kind == "b":
        input = ew.to_dtype(input, _dt.int64)
    return ew.mul(input, input)


def rsqrt(input):
    return ew.reciprocal(ew.sqrt(ew._as_float(input)))


def log2(input):
    return ew.div(ew.log(ew._as_float(input)), _LN2)


def log10(input):
    return ew.div(ew.log(ew._as_float(input)), _LN10)


def exp2(input):
    return ew.exp(ew.mul(ew._as_float(input), _LN2))


def hypot(input, other):
    need_tensor("hypot", input, 1)
    need_tensor("hypot", other)
    input, other = ew.promote_float("hypot_cpu", input, other)
    return ew.sqrt(ew.add(ew.mul(input, input), ew.mul(other, other)))


def addcmul(input, tensor1, tensor2, *, value=1):
    need_tensor("addcmul", input, 1)
    need_tensor("addcmul", tensor1, 2)
    need_tensor("addcmul", tensor2, 3)
    if _dt.result_type(input, tensor1, tensor2).kind == "b":
        raise _dt.not_implemented("addcmul_cpu_out", np.bool_)
    prod = ew.mul(tensor1, tensor2)
    return ew.add(input, prod if value == 1 else ew.mul(prod, value))


def addcdiv(input, tensor1, tensor2, *, value=1):
    need_tensor("addcdiv", input, 1)
    need_tensor("addcdiv", tensor1, 2)
    need_tensor("addcdiv", tensor2, 3)
    for t in (tensor1, tensor2):
        if isinstance(t, Tensor) and not t.is_floating_point():
            raise RuntimeError("Integer division with addcdiv is no longer supported, and in a future release "
                               "addcdiv will perform a true division of tensor1 and tensor2. The historic "
                               "addcdiv behavior can be implemented as (input + value * torch.trunc(tensor1 / "
                               "tensor2)).to(input.dtype) for integer inputs and as (input + value * tensor1 / "
                               "tensor2) for float inputs. The future addcdiv behavior is just the latter "
                               "implementation: (input + value * tensor1 / tensor2), for all dtypes.")
    q = ew.div(tensor1, tensor2)
    return ew.add(input, q if value == 1 else ew.mul(q, value))


def lerp(input, end, weight):
    # torch: end of input's dtype; a dimensioned weight too; a 0-d weight promotes like a number
    need_tensor("lerp", end)
    tensor_weight = isinstance(weight, Tensor)
    for name, v in (("end", end), ("weight", weight if tensor_weight and weight._data.ndim else end)):
        if v._data.dtype != input._data.dtype:
            raise RuntimeError(f"expected dtype {c_name(input._data.dtype)} for `{name}` but got dtype "
                               f"{c_name(v._data.dtype)}")
    kernel = "lerp_kernel_tensor" if tensor_weight else "lerp_kernel_scalar"
    if tensor_weight and not weight._data.ndim:
        input, end, weight = ew.promote_float(kernel, input, end, weight)
    refuse(kernel, input, ints=True)
    return ew.add(input, ew.mul(weight, ew.sub(end, input)))


def nan_to_num(input, nan=0.0, posinf=None, neginf=None):
    if not input.is_floating_point():
        return _wrap(copy_array(input._data))  # integers have no nan or inf (clone would make them float)
    info = np.finfo(input._data.dtype)
    posinf = info.max if posinf is None else posinf
    neginf = info.min if neginf is None else neginf
    d = input.detach()
    out = ew.where(ew.isnan(d), float(nan), input)
    out = ew.where(ew.eq(d, math.inf), float(posinf), out)
    return ew.where(ew.eq(d, -math.inf), float(neginf), out)


def isclose(input, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    need_tensor("isclose", input, 1)
    need_tensor("isclose", other)
    if input.dtype != _t(other, input).dtype:
        raise RuntimeError(f"{scalar_name(input._data.dtype)} did not match "
                           f"{scalar_name(_t(other, input)._data.dtype)}")
    a, b = input._data, _t(other, input)._data
    return tensor(np.isclose(a, b, rtol=rtol, atol=atol, equal_nan=equal_nan))


# --- matrices ------------------------------------------------------------------------------
def _tri(input, diagonal, keep_lower, fn):
    if input.ndim < 2:
        raise RuntimeError(f"{fn}: input tensor must have at least 2 dimensions")
    r, c = input.shape[-2:]
    mask = np.tril(np.ones((r, c), dtype=bool), diagonal) if keep_lower else np.triu(np.ones((r, c), dtype=bool),
                                                                                      diagonal)
    # where, not a product with the mask: inf outside the triangle must give 0, not nan
    return ew.where(tensor(mask), input, zeros((), dtype=input.dtype))


def tril(input, diagonal=0):
    return _tri(input, diagonal, True, "tril")


def triu(input, diagonal=0):
    return _tri(input, diagonal, False, "triu")


def outer(input, vec2):
    if input.ndim != 1 or vec2.ndim != 1:
        raise RuntimeError(f"outer: Expected 1-D argument self, but got {input.ndim}-D" if input.ndim != 1 else
                           f"outer: Expected 1-D argument vec2, but got {vec2.ndim}-D")
    return ew.mul(shape.unsqueeze(input, 1), vec2)


def _scaled(x, s):
    return x if s == 1 else ew.mul(x, s)


def _beta_input(input, beta):
    # beta == 0 ignores input, nan and inf included (PyTorch's rule), and its gradient is zeros
    return ew.where(tensor(True), 0.0, input) if beta == 0 else _scaled(input, beta)


def addmv(input, mat, vec, *, beta=1, alpha=1):
    if not input._data.dtype == mat._data.dtype == vec._data.dtype:  # torch promotes none of them
        raise RuntimeError("addmv input tensors must have the same dtype, but got " +
                           ", ".join(scalar_name(t._data.dtype) for t in (input, mat)) +
                           f", and {scalar_name(vec._data.dtype)}")
    out = _scaled(linalg.mv(mat, vec), alpha)
    return ew.add(_beta_input(input, beta), out)


def baddbmm(input, batch1, batch2, *, beta=1, alpha=1):
    if not input._data.dtype == batch1._data.dtype == batch2._data.dtype:
        raise RuntimeError(f"Input dtypes must be the same, got: input {c_name(input._data.dtype)}, batch1: "
                           f"{c_name(batch1._data.dtype)}, batch2: {c_name(batch2._data.dtype)}")
    out = _scaled(linalg.bmm(batch1, batch2), alpha)
    return ew.add(_beta_input(input, beta), out)


def addbmm(input, batch1, batch2, *, beta=1, alpha=1):
    for name, x in (("self", input), ("mat1", batch1)):  # torch's addmm checks, against mat2
        if x._data.dtype != batch2._data.dtype:
            raise RuntimeError(f"{name} and mat2 must have the same dtype, but got {scalar_name(x._data.dtype)} and "
                               f"{scalar_name(batch2._data.dtype)}")
    refuse("addbmm_impl_cpu_", input)
    # summed at the batches' dtype (a plain sum would give int64 for int32)
    out = _scaled(reduce.sum(linalg.bmm(batch1, batch2), 0, dtype=_dt.from_numpy_dtype(batch1._data.dtype)), alpha)
    return ew.add(_beta_input(input, beta), out)


def cross(input, other, dim=None):
    if dim is None:
        dim = next((i for i, n in enumerate(np.broadcast_shapes(tuple(input.shape), tuple(other.shape)))
                    if n == 3), None)
        if dim is None:
            raise RuntimeError("no dimension of size 3 in input")
    return linalg_cross(input, other, dim=dim)


def linalg_cross(input, other, *, dim=-1):
    refuse("cross", input)
    if input._data.dtype != other._data.dtype:  # torch promotes neither
        raise RuntimeError(f"expected scalar type {scalar_name(input._data.dtype)} but found "
                           f"{scalar_name(other._data.dtype)}")
    if input.ndim != other.ndim:
        raise RuntimeError("linalg.cross: inputs must have the same number of dimensions.")
    d = _wrap_dim(dim, input.ndim)
    if input.shape[d] != 3 or other.shape[d] != 3:
        raise RuntimeError(f"linalg.cross: inputs dimension {dim} must have length 3. Got {input.shape[d]} and "
                           f"{other.shape[d]}")

    def comp(x, k):
        return x[(slice(None),) * d + (k,)]

    a = [comp(input, k) for k in range(3)]
    b = [comp(other, k) for k in range(3)]
    c = [ew.sub(ew.mul(a[(k + 1) % 3], b[(k + 2) % 3]), ew.mul(a[(k + 2) % 3], b[(k + 1) % 3])) for k in range(3)]
    return shape.stack(c, d)


# --- shape helpers -------------------------------------------------------------------------
def movedim(input, source, destination):
    if isinstance(source, (tuple, list)) != isinstance(destination, (tuple, list)):
        raise TypeError("movedim() received an invalid combination of arguments - got (Tensor, "
                        f"{type(source).__name__}, {type(destination).__name__})")
    src = source if isinstance(source, (tuple, list)) else (source,)
    dst = destination if isinstance(destination, (tuple, list)) else (destination,)
    if len(src) != len(dst):
        raise RuntimeError(f"movedim: Invalid source or destination dims: source ({list(src)} dims) should "
                           f"contain the same number of dims as destination ({list(dst)} dims)")
    nd = input.ndim
    src = [_wrap_dim(s, max(nd, 1)) for s in src]
    dst = [_wrap_dim(s, max(nd, 1)) for s in dst]
    if nd == 0:
        return shape.permute(input, ())
    order = [None] * nd
    for s, t in zip(src, dst):
        order[t] = s
    rest = iter(i for i in range(nd) if i not in src)
    order = [o if o is not None else next(rest) for o in order]
    return shape.permute(input, *order)


def roll(input, shifts, dims=None):
    if dims is None:
        flat = shape.flatten(input)
        return shape.reshape(roll(flat, shifts, 0), tuple(input.shape))
    shifts = shifts if isinstance(shifts, (tuple, list)) else (shifts,)
    dims = dims if isinstance(dims, (tuple, list)) else (dims,)
    if len(shifts) != len(dims):
        raise RuntimeError(f"shifts and dimensions must align. shifts: {len(shifts)}, dims:{len(dims)}")
    out = input
    for s, dm in zip(shifts, dims):
        d = _wrap_dim(dm, input.ndim)
        n = out.shape[d]
        k = s % n if n else 0
        if k:
            pre = (slice(None),) * d
            out = shape.cat([out[pre + (slice(n - k, n),)], out[pre + (slice(0, n - k),)]], d)
    return out


def meshgrid(*tensors, indexing=None):
    if len(tensors) == 1 and isinstance(tensors[0], (tuple, list)):
        tensors = tuple(tensors[0])
    if indexing is None:
        indexing = "ij"
    if indexing not in ("ij", "xy"):
        raise RuntimeError(f'torch.meshgrid: indexing must be one of "xy" or "ij", but received: {indexing}')
    ts = list(tensors)
    if len({t._data.dtype for t in ts}) > 1:
        raise RuntimeError("meshgrid expects all tensors to have the same dtype")
    swap = indexing == "xy" and len(ts) >= 2
    if swap:
        ts[0], ts[1] = ts[1], ts[0]
    sizes = tuple(t.numel() for t in ts)
    out = []
    for i, t in enumerate(ts):
        view = [1] * len(ts)
        view[i] = -1
        out.append(shape.expand(shape.reshape(t, tuple(view)), sizes))
    if swap:
        out[0], out[1] = out[1], out[0]
    return tuple(out)


def cdist(x1, x2, p=2.0, compute_mode="use_mm_for_euclid_dist_if_necessary"):
    if x1.ndim < 2 or x2.ndim < 2:
        raise RuntimeError(f"cdist only supports at least 2D tensors, X1 got: {x1.ndim}D" if x1.ndim < 2 else
                           f"cdist only supports at least 2D tensors, X2 got: {x2.ndim}D")
    if x1.shape[-1] != x2.shape[-1]:
        raise RuntimeError(f"X1 and X2 must have the same number of columns. X1: {x1.shape[-1]} X2: {x2.shape[-1]}")
    for name, x in (("X1", x1), ("X2", x2)):
        if x._data.dtype.kind != "f":
            raise RuntimeError(f"cdist only supports floating-point dtypes, {name} got: {scalar_name(x._data.dtype)}")
    if x1._data.dtype != x2._data.dtype:
        raise RuntimeError(f"expected scalar type {scalar_name(x1._data.dtype)} but found "
                           f"{scalar_name(x2._data.dtype)}")
    diffs = ew.sub(shape.unsqueeze(x1, -2), shape.unsqueeze(x2, -3))
    return vector_norm(diffs, p, -1)


# --- rounding, hyperbolic and friends ------------------------------------------------------
def _constant_of(x, values):
    """values (computed from x) as a result of x whose gradient is zeros: PyTorch's rule for
    floor, round..., which still require grad."""
    return ew.where(tensor(True), _wrap(values), x)


def _rounding(npfn, name):
    def op(input, **kwargs):
        refuse(name + "_vml_cpu", input)  # ints are kept as they are; bool has no kernel
        if not input.is_floating_point():
            return _wrap(copy_array(input._data))
        return _constant_of(input, npfn(input._data, **kwargs))
    op.__name__ = op.__qualname__ = name
    return op


floor = _rounding(np.floor, "floor")
ceil = _rounding(np.ceil, "ceil")
trunc = _rounding(np.trunc, "trunc")


def round(input, *, decimals=0):  # noqa: A001
    return _rounding(lambda d: np.round(d, decimals), "round")(input)


def frac(input):
    refuse("frac_cpu", input, ints=True)
    return ew.sub(input, trunc(input))


def clamp_min(input, min):  # noqa: A002
    return ew.clamp(input, min=min)


def clamp_max(input, max):  # noqa: A002
    return ew.clamp(input, max=max)


def sinh(input):
    x = ew._as_float(input)
    return ew.div(ew.sub(ew.exp(x), ew.exp(ew.neg(x))), 2.0)


def cosh(input):
    x = ew._as_float(input)
    return ew.div(ew.add(ew.exp(x), ew.exp(ew.neg(x))), 2.0)


def tan(input):
    x = ew._as_float(input)
    return ew.div(ew.sin(x), ew.cos(x))


def logaddexp(input, other):
    need_tensor("logaddexp", input, 1)
    need_tensor("logaddexp", other)
    input, other = ew.promote_float("logaddexp_cpu", input, other)
    # max + log1p(exp(-|a - b|)): no overflow; maximum splits the gradient evenly at a == b, where
    # the difference is taken as 0 (equal infinities would give inf - inf = nan)
    hi = ew.maximum(input, other)
    same = ew.eq(input.detach() if isinstance(input, Tensor) else input,
                 other.detach() if isinstance(other, Tensor) else other)
    gap = ew.where(same, 0.0, ew.sub(input, other))
    return ew.add(hi, ew.log1p(ew.exp(ew.neg(ew.abs(gap)))))


def deg2rad(input):
    return ew.mul(ew._as_float(input), math.pi / 180.0)


def rad2deg(input):
    return ew.mul(ew._as_float(input), 180.0 / math.pi)


def flip(input, dims):
    dims = dims if isinstance(dims, (tuple, list)) else (dims,)
    ds = [_wrap_dim(d, max(input.ndim, 1)) for d in dims]
    if len(set(ds)) != len(ds):
        dup = next(d for d in ds if ds.count(d) > 1)
        raise RuntimeError(f"dim {dup} appears multiple times in the list of dims")
    if input.ndim == 0:
        return ew.clone(input)
    idx = tuple(slice(None, None, -1) if i in ds else slice(None) for i in range(input.ndim))
    # _needs: recorded for grad, or given a tangent in forward mode (not only with requires_grad)
    return ew.clone(input[idx]) if _needs(input) else _wrap(copy_array(input._data[idx]))


def count_nonzero(input, dim=None):
    return _wrap(np.asarray(np.count_nonzero(input._data, axis=None if dim is None else
                                             tuple(_dims(input, dim))), dtype=np.int64))
