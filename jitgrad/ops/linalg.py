"""Linear algebra: matmul (mm, dot, mv, bmm), addmm (and linear, which torch records as
addmm / mm over the weight's t()), trace. Each entry sits below its forward."""
import numpy as np

from jitgrad._core import dtype as _dtype
from jitgrad._core.messages import scalar_name
from jitgrad._core.meta import MetaArray
from jitgrad._core.modes import _packing, _saved_hooks
from jitgrad.gpu.array import KERNELS as _KERNELS
from jitgrad.gpu.array import DeviceArray as _DeviceArray
from jitgrad.graph.record import record
from jitgrad.graph.spec import alias, structural
from jitgrad.graph.tensor import Tensor
from jitgrad.graph.tensor import wrap as _wrap
from jitgrad.kernels.blas import mm as _mm
from jitgrad.kernels.linalg import f_addmm, f_matmul, f_trace, k_addmm, k_matmul, k_trace
from jitgrad.ops._common import _broadcast_error, _cap, _needs, _operand_error, traced
from jitgrad.ops.reduce import sum_to, traced_as
from jitgrad.ops.shape import RESHAPE_ALIAS, _view_like, reshape, t, transpose

_ndarray = np.ndarray


def matmul(a, b):
    if not (isinstance(a, Tensor) and isinstance(b, Tensor)):
        raise _operand_error("matmul", *((a, 1) if not isinstance(a, Tensor) else (b, 2)))
    ad, bd = a._data, b._data
    if (type(ad) is _ndarray and type(bd) is _ndarray and ad.ndim == 2 and bd.ndim == 2 and ad.shape[1] == bd.shape[0]
            and ad.dtype == bd.dtype and ad.dtype.kind != "b"):
        # host matrix @ matrix, the common case: what the checks below let through, unchanged
        return _matmul_out(MATMUL, a, b, ad, bd, _mm(ad, bd))
    if ad.ndim == 0 or bd.ndim == 0:
        raise RuntimeError(f"both arguments to matmul need to be at least 1D, but they are {ad.ndim}D and {bd.ndim}D")
    device = _same_device(ad, bd)  # as torch: before the sizes, which the device's kernel checks
    if ad.ndim == 1 and bd.ndim == 1:
        if ad.shape[0] != bd.shape[0]:
            raise RuntimeError(f"inconsistent tensor size, expected tensor [{ad.shape[0]}] and src [{bd.shape[0]}] to "
                               f"have the same number of elements, but got {ad.shape[0]} and {bd.shape[0]} elements respectively")
        spec = DOT
    elif ad.ndim == 2 and bd.ndim == 2:
        if ad.shape[1] != bd.shape[0]:
            raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({ad.shape[0]}x{ad.shape[1]} and "
                               f"{bd.shape[0]}x{bd.shape[1]})")
        spec = MATMUL
    elif ad.ndim <= 2 and bd.ndim <= 2:
        k_a = ad.shape[-1]
        k_b = bd.shape[0]
        if k_a != k_b:
            raise RuntimeError(f"size mismatch, got input ({ad.shape[0]}), mat ({ad.shape[0]}x{k_a}), vec ({k_b})"
                               if bd.ndim == 1 else
                               f"size mismatch, got input ({bd.shape[1]}), mat ({bd.shape[0]}x{bd.shape[1]}), vec ({k_a})")
        spec = MV if bd.ndim == 1 else MATMUL
    else:
        spec = BMM
        ka = ad.shape[-1]
        kb = bd.shape[-2] if bd.ndim > 1 else bd.shape[0]
        if ka != kb:
            raise RuntimeError(f"Expected size for first two dimensions of batch2 tensor to be: "
                               f"[{int(np.prod(ad.shape[:-2]))}, {ka}] but got: [{int(np.prod(bd.shape[:-2]))}, {kb}].")
    if spec is BMM and ad.dtype.kind == "b":  # torch's bmm checks its kernel's dtype before the operands agree
        raise _dtype.not_implemented("bmm", ad.dtype)
    if ad.dtype != bd.dtype:
        raise RuntimeError(f"expected m1 and m2 to have the same dtype, but got: {a.dtype.name} != {b.dtype.name}"
                           .replace("float64", "double").replace("float32", "float"))
    if ad.dtype.kind == "b":  # torch has no bool matrix product
        raise _dtype.not_implemented(_BOOL_KERNEL.get(spec, "addmm_impl_cpu_"), ad.dtype)
    try:
        # host matrix @ matrix: ndarray.dot (blas.mm) runs the same gemm (bit for bit) with less dispatch
        out = (np.matmul(ad, bd) if device else _mm(ad, bd) if spec is MATMUL and ad.ndim == 2
               else np.asarray(np.matmul(ad, bd)))
    except ValueError as e:  # batch dims that do not broadcast: torch's message (infer_size over them)
        raise _broadcast_error(ad.shape[:-2], bd.shape[:-2] if bd.ndim > 1 else ()) if spec is BMM \
            else RuntimeError(str(e)) from None
    except TypeError:
        if MetaArray in (type(ad), type(bd)):  # ndarray.dot refuses it in its own words
            np.matmul(np.asarray(ad), np.asarray(bd))  # raises the meta tensor's NotImplementedError
        raise
    return _matmul_out(spec, a, b, ad, bd, out)


def _matmul_out(spec, a, b, ad, bd, out):
    res = _wrap(out)
    if not _needs(a, b):
        if _cap.on and _cap.mine():
            traced_as(spec, res, (a, b), (ad, bd), (), None, lambda x, y: np.asarray(np.matmul(x, y)))
        return res
    return record(spec, res, (a, b), (ad, bd))




def _on_device(x):
    """Whether array x is a CUDA one (a DeviceArray): the ops' one test for the device."""
    return isinstance(x, _DeviceArray)


def _same_device(*arrays):
    """Whether the arrays (None: an absent operand) are on the device; PyTorch's error when
    some are and some are not."""
    present = [isinstance(a, _DeviceArray) for a in arrays if a is not None]
    if any(present) and not all(present):
        raise RuntimeError("Expected all tensors to be on the same device, but found at least two devices, "
                           "cuda:0 and cpu!")
    return bool(present) and present[0]


def _like(x):
    """numpy's like= argument for a creation function to allocate where array x is."""
    return {"like": x} if isinstance(x, _DeviceArray) else {}


def _as_array(x):
    """A saved value as an array: host values as ndarrays, device ones as they are."""
    return x if isinstance(x, _DeviceArray) else np.asarray(x)


def matmul_rule(grad, ri):
    # each operand is saved for the other's gradient only (save_users): compute what is wanted.
    # Shapes change only where they must, so that a create_graph graph has torch's nodes
    sa, sb = ri.in_shape(0), ri.in_shape(1)
    sa2 = (1,) + sa if len(sa) == 1 else sa
    sb2 = sb + (1,) if len(sb) == 1 else sb
    g = _shaped(grad, np.broadcast_shapes(sa2[:-2], sb2[:-2]) + (sa2[-2], sb2[-1]))
    ga = gb = None
    if ri.needs(0):
        ga = _shaped(sum_to(matmul(g, _mT(_shaped(ri.saved_input(1, 1), sb2))), sa2), sa)
    if ri.needs(1):
        gb = _shaped(sum_to(matmul(_mT(_shaped(ri.saved_input(0, 0), sa2)), g), sb2), sb)
    return (ga, gb)


def _shaped(x, shape):
    return x if tuple(x.shape) == tuple(shape) else reshape(x, shape)


def _mT(x):
    """The last two dimensions swapped: t() for a matrix (TBackward0, as torch's mm rule)."""
    return t(x) if x.ndim == 2 else transpose(x, -1, -2)


def _product_jvp(a, b, ta, tb):
    """The product is bilinear: t_a @ b + a @ t_b (None: a zero tangent)."""
    left = None if ta is None else matmul(ta, b)
    right = None if tb is None else matmul(a, tb)
    return right if left is None else left if right is None else left + right


def matmul_jvp(ci, tangents):
    return _product_jvp(ci.input(0), ci.input(1), *tangents)


# saved: both operands, under torch's names per node (MmBackward0: self, mat2; DotBackward0:
# self, tensor; MvBackward0: self, vec). torch's bmm node is UnsafeViewBackward0 over a
# BmmBackward0 it keeps the operands in, so there they are internal.
MATMUL = structural("matmul", "MmBackward0", saves=("self", "mat2"), args=("self", "mat2"), rule=matmul_rule,
                    kernel=k_matmul, fwd_kernel=f_matmul, forward=matmul, jvp=matmul_jvp, save_users=((1,), (0,)))
DOT = alias("dot", MATMUL, "DotBackward0", saves=("self", "tensor"), args=("self", "tensor"))
MV = alias("mv", MATMUL, "MvBackward0", saves=("self", "vec"), args=("self", "vec"))
BMM = alias("bmm", MATMUL, "UnsafeViewBackward0", saves=("_self", "_mat2"), args=("_self", "_mat2"))
# the kernel torch names when it refuses bool operands
_BOOL_KERNEL = {DOT: "dot", MV: "addmv_impl_cpu", BMM: "bmm"}




def addmm(input, mat1, mat2, *, beta=1, alpha=1):
    """beta * input + alpha * (mat1 @ mat2), input broadcast to the product's shape."""
    for name, m in (("mat1", mat1), ("mat2", mat2)):
        if m._data.ndim != 2:
            raise RuntimeError(f"{name} must be a matrix, got {m._data.ndim}-D tensor")
    n, m = mat1._data.shape[0], mat2._data.shape[1]
    try:
        np.broadcast_shapes(input._data.shape, (n, m))
    except ValueError:
        raise RuntimeError(f"The expanded size of the tensor ({m}) must match the existing size "
                           f"({input._data.shape[-1]}) at non-singleton dimension 1.  Target sizes: [{n}, {m}].  "
                           f"Tensor sizes: [{', '.join(str(d) for d in input._data.shape)}]") from None
    return _mm_into(ADDMM, input, mat1, mat2, float(beta), float(alpha))


def _mm_into(spec, input, a, b, beta=1.0, alpha=1.0, weight=None):
    """The addmm primitive (and linear's bias-free mm when input is None). A transposed
    operand, such as linear's W.t(), is saved as its contiguous base, flagged, instead of
    being copied into a contiguous transpose. weight: linear's, when b is weight.t()."""
    ad, bd = a._data, b._data
    _same_device(None if input is None else input._data, ad, bd)
    if ad.shape[1] != bd.shape[0]:
        raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({ad.shape[0]}x{ad.shape[1]} and "
                           f"{bd.shape[0]}x{bd.shape[1]})")
    if input is None and ad.dtype != bd.dtype:
        raise RuntimeError(f"expected m1 and m2 to have the same dtype, but got: {ad.dtype.name} != {bd.dtype.name}"
                           .replace("float64", "double").replace("float32", "float"))
    if input is not None and not (input._data.dtype == ad.dtype == bd.dtype):
        for name, x in (("self", input._data), ("mat1", ad)):  # torch checks the input against mat2 first
            if x.dtype != bd.dtype:
                got = " and ".join(scalar_name(d) for d in (x.dtype, bd.dtype))
                raise RuntimeError(f"{name} and mat2 must have the same dtype, but got {got}")
    if ad.dtype.kind == "b":  # torch has no bool matrix product
        raise _dtype.not_implemented("addmm_impl_cpu_", ad.dtype)
    res = _wrap(_addmm_data(None if input is None else input._data, ad, bd, beta, alpha))
    inputs = (a, b) if input is None else (input, a, b)
    if not _needs(*inputs):
        if _cap.on and _cap.mine():
            _traced_mm(spec, res, inputs, beta, alpha, weight)
        return res
    if weight is not None and _cap.on and _cap.mine():
        return _recorded_linear(spec, res, inputs, beta, alpha, weight)
    packing = _packing[0] and _saved_hooks.stack  # packed values keep the operands as they are
    ta = int(not packing and not _c_contiguous(ad) and _c_contiguous(ad.T))
    tb = int(not packing and not _c_contiguous(bd) and _c_contiguous(bd.T))
    return record(spec, res, inputs, (ad.T if ta else ad, bd.T if tb else bd), (beta, alpha),
                  spec.pack_ints(n=ad.shape[0], k=ad.shape[1], m=bd.shape[1], ta=ta, tb=tb))


def _addmm_data(inp, ad, bd, beta, alpha):
    """beta * inp + alpha * ad @ bd (inp None: the product alone). On the host ndarray.dot
    (ad @ bd bit for bit, with less dispatch) and numpy's in-place updates; on the device
    one gemm whose epilogue adds beta times the input, broadcast into the output first."""
    if isinstance(ad, _DeviceArray):
        out = _DeviceArray.empty((ad.shape[0], bd.shape[1]), ad.dtype)
        if inp is not None and beta != 0.0:
            out[...] = inp
        return _KERNELS["gemm"](ad, bd, out, alpha, beta if inp is not None else 0.0)
    prod = _mm(ad, bd)
    if alpha != 1.0:
        prod *= alpha
    if inp is not None and beta != 0.0:
        prod += inp * beta if beta != 1.0 else inp
    return prod


def _c_contiguous(x):
    return x.flags["C_CONTIGUOUS"]  # item access: ndarray's flags and DeviceArray's dict both have it


# jitgrad.compile and linear's x @ W.t(): the backward reads W.t() as its contiguous base,
# the weight itself (tb). The instruction is reported reading the weight too, which its
# forward kernel's gemm reads transposed: the replay then copies no transpose of it (on a
# 784 x 512 weight a transposed copy costs about what the forward's product does).
def _recorded_linear(spec, res, inputs, beta, alpha, weight):
    """_mm_into's recording of linear while jitgrad.compile records: the row as _mm_into
    makes it; the instruction reads the weight when the row saves it (tb)."""
    ad, bd = inputs[-2]._data, inputs[-1]._data
    packing = _packing[0] and _saved_hooks.stack
    ta = int(not packing and not _c_contiguous(ad) and _c_contiguous(ad.T))
    tb = int(not packing and not _c_contiguous(bd) and _c_contiguous(bd.T))
    saved = (ad.T if ta else ad, bd.T if tb else bd)
    ints = spec.pack_ints(n=ad.shape[0], k=ad.shape[1], m=bd.shape[1], ta=ta, tb=tb)
    _cap.on = False  # reported below, not by record()
    try:
        res = record(spec, res, inputs, saved, (beta, alpha), ints)
    finally:
        _cap.on = True
    if tb:
        _cap.rec.struct(spec, res, inputs[:-1] + (weight,), (saved[0], weight._data), (beta, alpha), ints)
    else:
        _cap.rec.struct(spec, res, inputs, saved, (beta, alpha), ints)
    return res


def _traced_mm(spec, res, inputs, beta, alpha, weight):
    """An addmm not recorded for grad, to jitgrad.compile: no backward reads its operands,
    so they are saved as they are (untransposed), but for linear's contiguous weight."""
    ad, bd = inputs[-2]._data, inputs[-1]._data
    n, k, m = ad.shape[0], ad.shape[1], bd.shape[1]
    if weight is not None and res._data.dtype.kind == "f" and _c_contiguous(weight._data):
        traced(spec, res, inputs[:-1] + (weight,), (ad, weight._data), (beta, alpha),
               spec.pack_ints(n=n, k=k, m=m, ta=0, tb=1))
    else:
        traced_as(spec, res, inputs, (ad, bd), (beta, alpha), spec.pack_ints(n=n, k=k, m=m, ta=0, tb=0),
                  lambda *arrays: _addmm_again(arrays, beta, alpha))


def _addmm_again(arrays, beta, alpha):
    """_mm_into's product on (input,) mat1, mat2 arrays: jitgrad.compile replays an
    integer one in Python."""
    prod = arrays[-2] @ arrays[-1]
    if alpha != 1.0:
        prod *= alpha
    if len(arrays) == 3 and beta != 0.0:
        prod += arrays[0] * beta if beta != 1.0 else arrays[0]
    return prod


def linear(input, weight, bias=None):
    """input @ weight.t() + bias as torch records it: AddmmBackward0 (MmBackward0 without a
    bias) over TBackward0 of the weight; other than 2-D input with a bias is viewed as 2-D
    around the addmm; without a bias it is a matmul."""
    try:
        x = input._data
    except AttributeError:
        raise _operand_error("linear", input, 1) from None
    wt = t(weight)
    w = wt._data
    spec = LINEAR_MM if bias is None else ADDMM
    if x.ndim == 2 and w.ndim == 2:
        try:
            return _mm_into(spec, bias, input, wt, weight=weight)
        except ValueError:  # numpy's, for a bias that does not broadcast: torch's is expand()'s
            if bias is not None:
                bias.expand(x.shape[0], w.shape[1])
            raise
    if x.ndim == 0 or w.ndim == 0:
        raise RuntimeError(f"both arguments to linear need to be at least 1D, but they are {x.ndim}D and {w.ndim}D")
    if x.ndim == 0 or x.shape[-1] != wt._data.shape[0] or (bias is None and x.ndim == 1):
        out = matmul(input, wt)  # and matmul raises torch's error for bad shapes
        return out if bias is None else out + bias
    out = _mm_into(spec, bias, reshape(input, (-1, x.shape[-1])), wt, weight=weight)
    shape = x.shape[:-1] + (wt._data.shape[1],)
    return reshape(out, shape) if bias is not None else _view_like(RESHAPE_ALIAS, out, out._data.reshape(shape))




def addmm_rule(grad, ri):
    """beta * input + alpha * A @ B: input gets beta * grad summed to its shape, A gets
    alpha * grad @ B^T, B gets alpha * A^T @ grad (no input when the row has two inputs)."""
    beta, alpha = ri.floats(2)
    nin = ri.n_inputs()
    g = grad * alpha if alpha != 1.0 else grad
    # mat1 is saved for mat2's gradient only and mat2 for mat1's (save_users)
    ga = matmul(g, t(_mm_operand(ri, 1))) if ri.needs(nin - 2) else None
    gb = matmul(t(_mm_operand(ri, 0)), g) if ri.needs(nin - 1) else None
    if nin == 2:
        return (ga, gb)
    gi = sum_to(grad, ri.in_shape(0))
    return (gi * beta if beta != 1.0 else gi, ga, gb)


def _mm_operand(ri, k):
    """Saved operand k (0: mat1, 1: mat2; the row's last two inputs) of an addmm row as a
    Tensor with its input's grad_fn; a transposed one (ta / tb) was saved as its base."""
    p = ri.iparams()
    j = ri.n_inputs() - 2 + k
    shape, transposed = ((p.n, p.k), p.ta) if k == 0 else ((p.k, p.m), p.tb)
    if not transposed or ri.tape.hooked(ri.row, k) is not None:
        return ri.saved_input(k, j)
    return ri.input(j, _as_array(ri.saved(k, shape[::-1])).reshape(shape[::-1]).T)


def addmm_jvp(ci, tangents):
    """beta * t_input + alpha * (t_mat1 @ mat2 + mat1 @ t_mat2); linear_mm has no input
    (and beta = alpha = 1). Scaled only where the factor is not 1, as torch's maybe_multiply."""
    beta, alpha = ci.floats(2)
    nin = ci.n_inputs()
    prod = _product_jvp(ci.input(nin - 2), ci.input(nin - 1), *tangents[nin - 2:])
    if prod is not None and alpha != 1.0:
        prod = prod * alpha
    t_in = tangents[0] if nin == 3 else None
    if t_in is None:
        return prod
    t_in = t_in * beta if beta != 1.0 else t_in
    return t_in if prod is None else prod + t_in


# iparams: mat1 is n x k, mat2 k x m; ta / tb: that operand was saved as its transpose's
# contiguous base (linear's W.t()); fparams: beta, alpha
ADDMM = structural("addmm", "AddmmBackward0", args=("self", "mat1", "mat2"), saves=("mat1", "mat2"),
                   saved_as={"mat1": _mm_operand, "mat2": _mm_operand}, rule=addmm_rule, kernel=k_addmm,
                   fwd_kernel=f_addmm, iparams=("n", "k", "m", "ta", "tb"), fparams=("beta", "alpha"), forward=_mm_into,
                   jvp=addmm_jvp, save_users=((2,), (1,)))
# x @ W.t() without a bias: addmm's kernel, no input; torch's node is MmBackward0 (self, mat2)
LINEAR_MM = alias("linear_mm", ADDMM, "MmBackward0", args=("self", "mat2"), saves=("self", "mat2"),
                  saved_as={"self": _mm_operand, "mat2": _mm_operand}, fparams=("_beta", "_alpha"), forward=linear,
                  save_users=((1,), (0,)))


def mm(a, b):
    if a._data.ndim != 2:
        raise RuntimeError("self must be a matrix")
    if b._data.ndim != 2:
        raise RuntimeError("mat2 must be a matrix")
    return matmul(a, b)


def dot(a, b):
    if a._data.ndim != 1 or b._data.ndim != 1:
        raise RuntimeError(f"1D tensors expected, but got {a._data.ndim}D and {b._data.ndim}D tensors")
    return matmul(a, b)


def mv(a, b):
    return matmul(a, b)


def bmm(a, b):
    return matmul(a, b)


def trace(x):
    d = x._data
    if d.ndim != 2:
        raise RuntimeError("trace: expected a matrix, but got tensor with dim " + str(d.ndim))
    if d.dtype.kind == "b":
        raise _dtype.not_implemented("trace", d.dtype)
    kind = d.dtype if d.dtype.kind == "f" else np.dtype(np.int64)
    res = _wrap(np.trace(d, dtype=kind) if _on_device(d) else np.asarray(np.trace(d), dtype=kind))
    if not _needs(x):
        if _cap.on and _cap.mine():
            traced_as(TRACE, res, (x,), (), (), None, lambda a: np.asarray(np.trace(a), dtype=np.int64))
        return res
    return record(TRACE, res, (x,))




def trace_rule(grad, ri):
    rows, cols = ri.in_shape(0)
    return (grad * _wrap(np.eye(rows, cols, dtype=grad._data.dtype, **_like(grad._data))),)


TRACE = structural("trace", "TraceBackward0", rule=trace_rule, kernel=k_trace, fwd_kernel=f_trace, forward=trace,
                   jvp=lambda ci, tangents: trace(tangents[0]))  # linear
