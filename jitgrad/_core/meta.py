"""The data of a tensor on the "meta" device: a shape and a dtype, no storage.

torch uses meta tensors to describe a model without holding its weights, e.g. the
"stateless" copy of a model that torch.func.functional_call runs with other tensors swapped
in (`copy.deepcopy(model).to("meta")`). jitgrad supports what that needs: making meta
tensors (`.to("meta")`, factories with device="meta", Module.to("meta")), their shape,
dtype, strides, device, repr, copying and moving them between modules. Computing with one
is not supported: torch runs its shape functions there, jitgrad has none, so any op that
reaches the data raises NotImplementedError (torch's type for an op without a Meta
kernel) instead of computing on an array that does not exist.
"""
import numpy as np

NO_DATA = "Cannot copy out of meta tensor; no data!"


def _unsupported(what):
    return NotImplementedError(
        f"Could not run '{what}' with arguments from the 'Meta' backend: jitgrad's meta tensors hold a shape and "
        "a dtype only and no op computes on them (swap real tensors in, e.g. with torch.func.functional_call)")


class MetaArray:
    """Shape, dtype and contiguous strides in the attributes numpy arrays have; reading
    the values in any way raises NotImplementedError."""
    __slots__ = ("shape", "dtype", "strides")

    def __init__(self, shape, dtype, strides=None):
        self.shape = tuple(int(n) for n in shape)
        self.dtype = np.dtype(dtype)
        if strides is None:  # contiguous
            strides, step = [], self.dtype.itemsize
            for n in reversed(self.shape):
                strides.append(step)
                step *= max(n, 1)
            strides = reversed(strides)
        self.strides = tuple(strides)

    @classmethod
    def like(cls, arr):
        """The meta copy of arr: torch's copy (preserve_format) keeps the strides of a dense
        layout (a transpose stays transposed) and makes anything else contiguous."""
        order = sorted(range(arr.ndim), key=lambda d: (arr.strides[d], arr.shape[d]))
        step = arr.dtype.itemsize
        for d in order:
            if arr.shape[d] != 1 and arr.strides[d] != step:
                return cls(arr.shape, arr.dtype)
            step *= max(arr.shape[d], 1)
        return cls(arr.shape, arr.dtype, arr.strides)

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size(self):
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def itemsize(self):
        return self.dtype.itemsize

    @property
    def nbytes(self):
        return self.size * self.dtype.itemsize

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of unsized object")
        return self.shape[0]

    def copy(self):
        return MetaArray(self.shape, self.dtype, self.strides)

    def __deepcopy__(self, memo):
        return self.copy()

    def __reduce__(self):
        return MetaArray, (self.shape, self.dtype, self.strides)

    def __repr__(self):
        return f"MetaArray(shape={self.shape}, dtype={self.dtype})"

    # every way numpy or numba would read the values ends here
    def __array__(self, dtype=None, copy=None):
        raise _unsupported("numpy conversion")

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        raise _unsupported(f"np.{ufunc.__name__}")

    def __array_function__(self, func, types, args, kwargs):
        raise _unsupported(f"np.{func.__name__}")

    def __getitem__(self, index):
        raise _unsupported("indexing")

    def __setitem__(self, index, value):
        raise _unsupported("index assignment")

    def item(self, *args):
        raise RuntimeError("Tensor.item() cannot be called on meta tensors")

    def tolist(self):
        raise NotImplementedError(NO_DATA)

    def __getattr__(self, name):
        # an ndarray method or attribute jitgrad's op code reaches for (reshape, astype,
        # ctypes, numba's typeof probes ...): the op has no meta form
        if name.startswith("__"):
            raise AttributeError(name)
        raise _unsupported(name)
