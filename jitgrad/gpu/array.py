"""DeviceArray: numpy's strided-array model over a numba.cuda device buffer.

An array is (buf, offset, shape, estrides, dtype): `buf` is the 1-D device allocation
(shared by every view of it), `offset` and `estrides` are in elements. Views (reshape of
contiguous data, transpose, basic indexing, broadcast_to) make a new DeviceArray over the
same buf; everything else runs a kernel.

numpy code reaches the device through numpy's own protocols: a ufunc on a DeviceArray
calls `__array_ufunc__`, which looks the ufunc up in UFUNCS; a numpy function calls
`__array_function__`, which looks it up in FUNCTIONS. The kernel modules (gpu/kernels/)
fill both tables when the first device array is made. A missing entry raises TypeError
naming the function: code must never quietly fall back to the host. Converting to numpy
(`np.asarray`, `__array__`) raises PyTorch's error for `.numpy()` on a CUDA tensor.
"""
import numpy as np

from jitgrad.gpu import driver

UFUNCS = {}      # numpy ufunc -> fn(method, inputs, kwargs) (gpu/kernels/ fill it)
FUNCTIONS = {}   # numpy function -> implementation with numpy's signature
KERNELS = {}     # name -> launcher the array core itself needs ("copy", "fill")

TO_NUMPY = ("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor to host "
            "memory first.")


def _c_strides(shape):
    st, acc = [], 1
    for d in reversed(shape):
        st.append(acc)
        acc *= d
    return tuple(reversed(st))


def _prod(shape):
    n = 1
    for d in shape:
        n *= d
    return n


class DeviceArray:
    __slots__ = ("buf", "offset", "shape", "estrides", "dtype")
    __array_priority__ = 2000   # above Tensor's: ndarray (op) DeviceArray defers to us

    def __init__(self, buf, offset, shape, estrides, dtype):
        self.buf, self.offset, self.shape, self.estrides, self.dtype = buf, offset, tuple(shape), tuple(estrides), dtype

    # -- making ------------------------------------------------------------------------
    @staticmethod
    def empty(shape, dtype):
        shape = tuple(int(d) for d in shape)
        dtype = np.dtype(dtype)
        return DeviceArray(driver.alloc(_prod(shape), dtype), 0, shape, _c_strides(shape), dtype)

    @staticmethod
    def from_host(a):
        a = np.asarray(a)
        c = np.ascontiguousarray(a).reshape(a.shape)  # ascontiguousarray makes a 0-d array 1-d
        return DeviceArray(driver.to_device(c), 0, c.shape, _c_strides(c.shape), c.dtype)

    def get(self):
        """A host (numpy) copy."""
        src = self if self.is_c_contiguous() else self.copy()
        out = np.empty(self.shape, self.dtype)
        if out.size:
            src.buf[src.offset:src.offset + out.size].copy_to_host(out.reshape(-1))
        return out

    # -- numpy's metadata -----------------------------------------------------------------
    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size(self):
        return _prod(self.shape)

    @property
    def itemsize(self):
        return self.dtype.itemsize

    @property
    def nbytes(self):
        return self.size * self.dtype.itemsize

    @property
    def strides(self):
        return tuple(s * self.dtype.itemsize for s in self.estrides)

    def is_c_contiguous(self):
        want = 1
        for d, s in zip(reversed(self.shape), reversed(self.estrides)):
            if d != 1 and s != want:
                return False
            want *= d
        return True

    @property
    def flags(self):
        return {"C_CONTIGUOUS": self.is_c_contiguous(), "WRITEABLE": True}

    @property
    def device(self):
        return "cuda:0"

    @property
    def base(self):
        """The storage every view shares, the device buffer: in-place writes are counted on it
        (_core/versions.py), as numpy's base array is for host arrays."""
        return self.buf

    @property
    def ptr(self):
        """Device address of the first element (element `offset` of buf)."""
        return driver.pointer(self.buf) + self.offset * self.dtype.itemsize

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of unsized object")
        return self.shape[0]

    def __repr__(self):
        return f"DeviceArray({self.get()!r}, device='cuda:0')"

    # -- no silent host round trips --------------------------------------------------------
    def __array__(self, dtype=None, copy=None):
        raise TypeError(TO_NUMPY)

    def item(self):
        if self.size != 1:
            raise ValueError("can only convert an array of size 1 to a Python scalar")
        return self.get().reshape(-1)[0].item()

    def tolist(self):
        return self.get().tolist()

    def __float__(self):
        return float(self.item())

    def __int__(self):
        return int(self.item())

    def __bool__(self):
        if self.size != 1:
            raise ValueError("The truth value of an array with more than one element is ambiguous. "
                             "Use a.any() or a.all()")
        return bool(self.item())

    def __index__(self):
        if self.dtype.kind not in "iub" or self.size != 1:
            raise TypeError("only integer scalar arrays can be converted to a scalar index")
        return int(self.item())

    # -- the protocols -----------------------------------------------------------------------
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        fn = UFUNCS.get(ufunc)
        if fn is None:
            return _unsupported(f"numpy.{ufunc.__name__}" + ("" if method == "__call__" else f".{method}"))
        return fn(method, inputs, kwargs)

    def __array_function__(self, func, types, args, kwargs):
        fn = FUNCTIONS.get(func)
        if fn is None:
            return _unsupported(f"numpy.{func.__name__}")
        return fn(*args, **kwargs)

    # -- views ---------------------------------------------------------------------------------
    def _view(self, offset, shape, estrides):
        return DeviceArray(self.buf, offset, shape, estrides, self.dtype)

    def reshape(self, *shape, order="C"):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        shape = [int(d) for d in shape]
        if -1 in shape:
            known = _prod(d for d in shape if d != -1)
            shape[shape.index(-1)] = self.size // known if known else 0
        shape = tuple(shape)
        if _prod(shape) != self.size:
            raise ValueError(f"cannot reshape array of size {self.size} into shape {shape}")
        src = self if self.is_c_contiguous() else self.copy()
        return src._view(src.offset, shape, _c_strides(shape))

    def ravel(self):
        return self.reshape(-1)

    def transpose(self, *axes):
        if not axes or axes == (None,):
            axes = tuple(range(self.ndim - 1, -1, -1))
        elif len(axes) == 1 and isinstance(axes[0], (tuple, list)):
            axes = tuple(axes[0])
        axes = tuple(int(a) % max(self.ndim, 1) for a in axes)
        return self._view(self.offset, tuple(self.shape[a] for a in axes), tuple(self.estrides[a] for a in axes))

    @property
    def T(self):
        return self.transpose()

    def swapaxes(self, a, b):
        axes = list(range(self.ndim))
        axes[a], axes[b] = axes[b], axes[a]
        return self.transpose(axes)

    def broadcast_to(self, shape):
        shape = tuple(int(d) for d in shape)
        lead = len(shape) - self.ndim
        if lead < 0:
            raise ValueError("input operand has more dimensions than allowed by the axis remapping")
        st = [0] * lead
        for k, (d, s) in enumerate(zip(self.shape, self.estrides)):
            if d == shape[lead + k]:
                st.append(s)
            elif d == 1:
                st.append(0)
            else:
                raise ValueError(f"operands could not be broadcast together with remapped shapes "
                                 f"[original->remapped]: {self.shape} and requested shape {shape}")
        return self._view(self.offset, shape, tuple(st))

    def __getitem__(self, key):
        view = _basic_index(self, key)
        if view is None:
            return _unsupported_index(self, key)
        return view

    def __setitem__(self, key, value):
        view = _basic_index(self, key)
        if view is None:
            fn = FUNCTIONS.get("setitem_advanced")
            if fn is None:
                return _unsupported("advanced index assignment")
            return fn(self, key, value)
        assign(view, value)

    # -- copies ---------------------------------------------------------------------------------
    def copy(self, order="C"):
        out = DeviceArray.empty(self.shape, self.dtype)
        KERNELS["copy"](self, out)
        return out

    def astype(self, dtype, copy=True, **_):
        dtype = np.dtype(dtype)
        if dtype == self.dtype and not copy:
            return self
        out = DeviceArray.empty(self.shape, dtype)
        KERNELS["copy"](self, out)
        return out

    def fill(self, value):
        KERNELS["fill"](self, value)

    # -- arithmetic: the operators are numpy's ufuncs -------------------------------------------
    def __add__(self, o):
        return np.add(self, o)

    def __radd__(self, o):
        return np.add(o, self)

    def __sub__(self, o):
        return np.subtract(self, o)

    def __rsub__(self, o):
        return np.subtract(o, self)

    def __mul__(self, o):
        return np.multiply(self, o)

    def __rmul__(self, o):
        return np.multiply(o, self)

    def __truediv__(self, o):
        return np.true_divide(self, o)

    def __rtruediv__(self, o):
        return np.true_divide(o, self)

    def __neg__(self):
        return np.negative(self)

    def __pow__(self, o):
        return np.power(self, o)

    def __matmul__(self, o):
        return np.matmul(self, o)

    def __lt__(self, o):
        return np.less(self, o)

    def __le__(self, o):
        return np.less_equal(self, o)

    def __gt__(self, o):
        return np.greater(self, o)

    def __ge__(self, o):
        return np.greater_equal(self, o)

    def __eq__(self, o):
        return np.equal(self, o)

    def __ne__(self, o):
        return np.not_equal(self, o)

    def __and__(self, o):
        return np.bitwise_and(self, o)

    def __or__(self, o):
        return np.bitwise_or(self, o)

    def __invert__(self):
        return np.invert(self)

    __hash__ = None

    # -- reductions as methods: the same as the numpy functions -----------------------------------
    def sum(self, axis=None, dtype=None, keepdims=False, **kw):
        return np.sum(self, axis=axis, dtype=dtype, keepdims=keepdims, **kw)

    def mean(self, axis=None, dtype=None, keepdims=False):
        return np.mean(self, axis=axis, dtype=dtype, keepdims=keepdims)

    def max(self, axis=None, keepdims=False):
        return np.max(self, axis=axis, keepdims=keepdims)

    def min(self, axis=None, keepdims=False):
        return np.min(self, axis=axis, keepdims=keepdims)

    def all(self, axis=None, keepdims=False):
        return np.all(self, axis=axis, keepdims=keepdims)

    def any(self, axis=None, keepdims=False):
        return np.any(self, axis=axis, keepdims=keepdims)


def assign(view, value):
    """view[...] = value: a DeviceArray (broadcast to view's shape, cast) or a number."""
    if isinstance(value, DeviceArray):
        KERNELS["copy"](value.broadcast_to(view.shape) if value.shape != view.shape else value, view)
    elif isinstance(value, (int, float, bool, np.generic)) or (isinstance(value, np.ndarray) and value.ndim == 0):
        KERNELS["fill"](view, value.item() if hasattr(value, "item") else value)
    else:
        raise TypeError("cannot assign host data to a CUDA array in place: move it to the device first "
                        "(" + TO_NUMPY.split(".")[0] + ")")


def _basic_index(a, key):
    """The view that basic indexing (ints, slices, None, Ellipsis) selects, or None when
    the key needs a gather (arrays, lists, booleans)."""
    if not isinstance(key, tuple):
        key = (key,)
    if any(isinstance(k, (DeviceArray, np.ndarray, list, bool, np.bool_)) for k in key):
        return None
    n_real = sum(1 for k in key if k is not None and k is not Ellipsis)
    if n_real > a.ndim:
        raise IndexError(f"too many indices for array: array is {a.ndim}-dimensional, but {n_real} were indexed")
    if any(k is Ellipsis for k in key):
        i = next(j for j, k in enumerate(key) if k is Ellipsis)
        key = key[:i] + (slice(None),) * (a.ndim - n_real) + key[i + 1:]
    off, shape, st, d = a.offset, [], [], 0
    for k in key:
        if k is None:
            shape.append(1)
            st.append(0)
            continue
        if isinstance(k, slice):
            start, stop, step = k.indices(a.shape[d])
            n = max(0, (stop - start + (step - (1 if step > 0 else -1))) // step)
            off += start * a.estrides[d]
            shape.append(n)
            st.append(a.estrides[d] * step)
        else:
            i = int(k)
            if not -a.shape[d] <= i < a.shape[d]:
                raise IndexError(f"index {i} is out of bounds for axis {d} with size {a.shape[d]}")
            off += (i % a.shape[d]) * a.estrides[d]
        d += 1
    shape.extend(a.shape[d:])
    st.extend(a.estrides[d:])
    return a._view(off, tuple(shape), tuple(st))


def _unsupported_index(a, key):
    fn = FUNCTIONS.get("getitem_advanced")
    if fn is None:
        return _unsupported("advanced indexing")
    return fn(a, key)


def _unsupported(what):
    raise TypeError(f"{what} is not supported on cuda tensors by jitgrad yet")
