"""Tensor: a numpy array plus the autograd fields PyTorch exposes."""
import copy
import threading
import warnings
import weakref

import numpy as np

import jitgrad._core.modes as _modes
from jitgrad._core import device as _device
from jitgrad._core import dtype as _dtype
from jitgrad._core import versions
from jitgrad._core.capture import state as _cap
from jitgrad._core.capture import stop as _stop
from jitgrad._core.dtype import from_numpy_dtype
from jitgrad._core.format import tensor_repr
from jitgrad._core.forward import state as _forward
from jitgrad._core.messages import NONLEAF_GRAD_WARNING, c_name, scalar_name, size_str
from jitgrad._core.meta import MetaArray
from jitgrad._core.modes import _state
from jitgrad.gpu import driver as _gpu
from jitgrad.gpu import foreign as _foreign
from jitgrad.gpu.array import TO_NUMPY, DeviceArray
from jitgrad.graph import node as _node  # the Tensor <-> Node pair: grad_fn is a view of the row
from jitgrad.graph import views as _views
from jitgrad.graph.hooks import RemovableHandle, add_hook
from jitgrad.graph.node import lazy_dict


class _Rare:
    """Per-tensor state most tensors never use; allocated on first write so that creating
    the output of an op (the forward hot path) sets only four fields."""
    __slots__ = ("grad", "acc", "retain", "vc", "node", "hooks", "post_hooks", "view_of", "fw", "inference",
                 "views", "origin", "group")

    def __init__(self):
        self.grad = None
        self.acc = None
        self.retain = False
        self.vc = None    # a version counter of its own: [version, writes reach the storage's counter too]
        self.node = None  # grad_fn, once made
        self.hooks = None       # a leaf's tensor hooks ({0: {id: fn}}, see autograd/hooks.py)
        self.post_hooks = None
        self.view_of = None     # graph/views.View: this tensor is a view of another's storage
        self.fw = None          # forward AD: the tangent at the open dual level (_core/forward.py)
        self.inference = False  # made in inference mode (an inference tensor)
        self.views = None       # weakrefs to this root's views that take part in autograd (graph/views.py)
        self.origin = None      # a one-element detach(): weakref to the tensor it was detached from
        self.group = None       # a leaf's graph/hooks.LeafGroup (a DDP bucket's), if any


_rare_lock = threading.Lock()


def rare(t):
    """t's _Rare, made on first use. A leaf is shared between threads (each records with it,
    accumulates into its .grad): two making one each would lose what was written to the
    first (its .grad, its AccumulateGrad), so it is made once, under a lock."""
    x = t._x
    if x is None:
        with _rare_lock:
            x = t._x
            if x is None:
                x = t._x = _Rare()
    return x


def _rare_property(name):
    def get(self):
        x = self._x
        return None if x is None else getattr(x, name)

    def set_(self, value):
        x = self._x
        if x is None:
            x = rare(self)
        setattr(x, name, value)
    return property(get, set_)


class Tensor:
    # _tape/_row: the row of the tape that produced this tensor (None for leaves); grad_fn is
    # made from it on demand. _row and _output_nr are only meaningful when _tape is set.
    # __dict__: user code sets its own attributes on tensors (t.name = ...), as on torch's;
    # the dict is only allocated by the first such write
    __slots__ = ("_data", "_requires_grad", "_tape", "_row", "_output_nr", "_x", "__weakref__", "__dict__")
    _grad = _rare_property("grad")
    _acc = _rare_property("acc")
    _retain = _rare_property("retain")
    _vc = _rare_property("vc")
    _fw = _rare_property("fw")
    _origin = _rare_property("origin")
    _leaf_group = _rare_property("group")
    __array_priority__ = 1000  # so `ndarray op Tensor` defers to Tensor's reflected operator

    def __init__(self, data=None, *, dtype=None, requires_grad=False):
        t = tensor(data if data is not None else [], dtype=dtype, requires_grad=requires_grad)
        _init_from(self, t._data)
        self._requires_grad = t._requires_grad
        if _cap.on and _cap.mine():
            _cap.rec.alias(self, t)

    @staticmethod
    def _make(arr):
        t = _new(Tensor)
        t._data = arr
        t._requires_grad = False
        t._tape = None
        t._x = None
        return t

    # -- metadata ---------------------------------------------------------------
    @property
    def shape(self):
        return Size(self._data.shape)

    def size(self, dim=None):
        if dim is None:
            return Size(self._data.shape)
        return self._data.shape[_wrap_dim(dim, self._data.ndim)]

    @property
    def dtype(self):
        return from_numpy_dtype(self._data.dtype)

    @property
    def ndim(self):
        return self._data.ndim

    def dim(self):
        return self._data.ndim

    def numel(self):
        return self._data.size

    nelement = numel

    def __len__(self):
        if self._data.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self._data.shape[0]

    @property
    def device(self):
        t = type(self._data)
        return _device.CUDA if t is DeviceArray else _device.META if t is MetaArray else _device.CPU

    @property
    def is_cuda(self):
        return type(self._data) is DeviceArray

    @property
    def is_cpu(self):
        return type(self._data) not in (DeviceArray, MetaArray)

    @property
    def is_meta(self):
        return type(self._data) is MetaArray

    def get_device(self):
        return 0 if type(self._data) is DeviceArray else -1

    def is_floating_point(self):
        return self._data.dtype.kind == "f"

    # -- autograd fields -------------------------------------------------------
    @property
    def requires_grad(self):
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, value):
        if value and self._data.dtype.kind != "f":
            raise RuntimeError("only Tensors of floating point and complex dtype can require gradients")
        if not value and self._tape is not None:
            raise RuntimeError("you can only change requires_grad flags of leaf variables. If you want to use a "
                               "computed variable in a subgraph that doesn't require differentiation use "
                               "var_no_grad = var.detach().")
        self._requires_grad = bool(value)

    @requires_grad.deleter
    def requires_grad(self):
        raise RuntimeError("requires_grad must be a bool")  # torch's words for a deletion too

    @property
    def grad_fn(self):
        x = self._x
        if x is not None and x.view_of is not None and x.view_of.invalid:
            raise _views.inplace_error(x.view_of, indirect=True)
        if self._tape is None:
            return None
        if x is None:
            x = self._x = _Rare()
        node = x.node
        if node is None or node._tape is not self._tape or node._row != self._row:
            node = x.node = _node.node_for(self._tape, self._row)
        return node

    def _no_grad_fn_delete(self):
        raise RuntimeError("Deletion of _grad_fn not allowed. Detach tensor instead!")

    _grad_fn = property(grad_fn.fget, None, _no_grad_fn_delete)

    @property
    def _backward_hooks(self):
        """The tensor hooks ({id: fn}) registered on this tensor, or None, as torch's."""
        if self._tape is None:
            x = self._x
            return None if x is None or not x.hooks else x.hooks.get(0)
        d = getattr(self, "__dict__", None)
        if d and "_shown_backward_hooks" in d:
            return d["_shown_backward_hooks"]
        return self._tape.tensor_hooks.get(self._row)

    @_backward_hooks.setter
    def _backward_hooks(self, value):
        """torch lets code assign the dict (nn.Module's hooks, old code). On a leaf an empty
        dict or None removes every hook and a dict {id: fn} makes those its hooks. A
        non-leaf's hooks were handed to its grad_fn when registered, so in torch they keep
        running whatever is assigned: only what reads give changes."""
        if value is not None and not isinstance(value, dict):
            raise TypeError(f"_backward_hooks must be a dict or None, not {type(value).__name__}")
        if self._tape is not None:
            self.__dict__["_shown_backward_hooks"] = value
            return
        x = self._x
        if x is not None and x.hooks:
            registry = x.hooks
            for hid in list(registry.get(0, ())):
                RemovableHandle(registry, (0, hid), on_leaf=True).remove()  # keeps the count backward reads
        for fn in (value or {}).values():
            self.register_hook(fn)

    @_backward_hooks.deleter
    def _backward_hooks(self):
        raise RuntimeError("Deletion of _backwards_hooks not allowed!")  # sic: torch's words

    def __deepcopy__(self, memo):
        """torch's Tensor.__deepcopy__: leaves only; the copy has the data, requires_grad, a
        deep copy of .grad and of the attributes set on the tensor, and none of its hooks,
        graph or version count."""
        if self._tape is not None:
            raise RuntimeError("Only Tensors created explicitly by the user (graph leaves) support the deepcopy "
                               "protocol at the moment.  If you were attempting to deepcopy a module, this may be "
                               "because of a torch.nn.utils.weight_norm usage, see "
                               "https://github.com/pytorch/pytorch/pull/103001")
        if id(self) in memo:
            return memo[id(self)]
        new = _new(type(self))
        _init_from(new, copy.deepcopy(self._data, memo))
        memo[id(self)] = new
        new._requires_grad = self._requires_grad
        if self._grad is not None:
            new.grad = copy.deepcopy(self._grad, memo)
        d = getattr(self, "__dict__", None)
        if d:
            new.__dict__.update(copy.deepcopy(d, memo))
        return new

    @property
    def is_leaf(self):
        x = self._x
        if x is not None and x.view_of is not None and x.view_of.invalid:
            raise _views.inplace_error(x.view_of, indirect=True)
        return self._tape is None

    def is_inference(self):
        return _views.is_inference(self)

    def _is_view(self):
        return _views.info(self) is not None

    @property
    def _base(self):
        v = _views.info(self)
        return None if v is None else v.base

    @property
    def output_nr(self):
        return 0 if self._tape is None else self._output_nr

    @property
    def grad(self):
        g = self._grad
        if g is None:
            if self._tape is not None and not self._retain:
                warnings.warn(NONLEAF_GRAD_WARNING, UserWarning, stacklevel=2)
        elif _cap.on and _cap.mine():
            _cap.rec.read_grad(g)  # a .grad from before the step is not a value of the plan
        return g

    @grad.setter
    def grad(self, value):
        if value is not None:
            if not isinstance(value, Tensor):
                raise TypeError(f"assigned grad expected to be a Tensor or None but got grad of type {type(value).__name__}")
            if value is self:
                raise RuntimeError("can't assign Variable as its own grad")
            if value._data.dtype != self._data.dtype:
                raise RuntimeError(f"attempting to assign a gradient with dtype '{c_name(value._data.dtype)}' "
                                   f"to a tensor with grad_dtype '{c_name(self._data.dtype).capitalize()}'. "
                                   "The gradient must match the tensor's grad_dtype (defaults to the tensor's dtype).")
            if value._data.shape != self._data.shape:
                raise RuntimeError(f"attempting to assign a gradient of size '{size_str(value._data.shape)}' to a "
                                   f"tensor of size '{size_str(self._data.shape)}'. Please ensure that the "
                                   "gradient and the tensor are the same size")
        if _cap.on and _cap.mine():
            _cap.rec.set_grad(self, value)
        self._grad = value

    @grad.deleter
    def grad(self):
        if _cap.on and _cap.mine():
            _cap.rec.set_grad(self, None)
        self._grad = None

    @property
    def _version(self):
        x = self._x
        if x is not None:
            if x.inference:
                raise RuntimeError("Inference tensors do not track version counter.")
            vc = _counter(x)
            if vc is not None:
                return vc[0]
        return versions.version(self._data)

    def _bump(self):
        """An in-place write happened: count it on the storage (shared with views and
        detach()), which saved values check. A `.data` alias counts its writes on a counter
        of its own only (as do its views), so they go unseen, as in PyTorch; a tensor given
        new data by `x.data = y` keeps its count, shared with its views, and its writes are
        still checked."""
        x = self._x
        vc = None if x is None else _counter(x)
        if vc is not None:
            vc[0] += 1
            if not vc[1]:
                return
        d = self._data
        versions.bump(d.buf if type(d) is DeviceArray else self._array())  # a CUDA array's storage: its buffer

    @property
    def retains_grad(self):
        return bool(self._retain) and self._tape is not None

    def retain_grad(self):
        _stop("retain_grad() in a compiled step")
        if not self.requires_grad:
            raise RuntimeError("can't retain_grad on Tensor that has requires_grad=False")
        if self._tape is None or self._retain:
            return
        self._retain = True
        self._tape.retained[self._row] = weakref.ref(self)

    def register_hook(self, hook):
        """hook(grad) -> Tensor or None, called with this tensor's gradient when it is
        computed; a returned tensor replaces it. Returns a handle with .remove()."""
        _stop("a tensor hook registered in a compiled step")
        if not self.requires_grad:
            raise RuntimeError("cannot register a hook on a tensor that doesn't require gradient")
        if self._tape is None:
            return add_hook(lazy_dict(rare(self), "hooks"), 0, hook, on_leaf=True)
        return add_hook(self._tape.tensor_hooks, self._row, hook)

    def register_post_accumulate_grad_hook(self, hook):
        """hook(tensor), called after a leaf's .grad has been updated by backward."""
        if not self.requires_grad:
            raise RuntimeError("cannot register a hook on a tensor that doesn't require gradient")
        if self._tape is not None:
            raise RuntimeError("post accumulate grad hooks cannot be registered on non-leaf tensors")
        return add_hook(lazy_dict(rare(self), "post_hooks"), 0, hook, on_leaf=True)

    def requires_grad_(self, requires_grad=True):
        _stop("requires_grad_() in a compiled step")
        if not isinstance(requires_grad, (bool, np.bool_)):
            raise TypeError("requires_grad_(): argument 'requires_grad' (position 1) must be bool, not "
                            f"{type(requires_grad).__name__}")
        if not requires_grad and self._tape is not None:
            raise RuntimeError("you can only change requires_grad flags of leaf variables. If you want to use a "
                               "computed variable in a subgraph that doesn't require differentiation use "
                               "var_no_grad = var.detach().")
        if requires_grad and self._data.dtype.kind != "f":
            raise RuntimeError("only Tensors of floating point dtype can require gradients")  # sic: torch's words
        self.requires_grad = bool(requires_grad)
        return self

    @property
    def data(self):
        t = Tensor._make(self._data)
        t._vc = [0, False]  # writes through .data are not counted (PyTorch's .data semantics)
        if _views.is_inference(self):
            _views.mark_inference(t, _Rare)
        if _cap.on and _cap.mine():  # jitgrad.compile: the same value as this tensor's
            _cap.rec.alias(t, self)
        return t

    @data.setter
    def data(self, value):
        _stop("an assignment to .data in a compiled step")
        if not isinstance(value, Tensor):
            raise TypeError(f"Variable data has to be a tensor, but got {type(value).__name__}")
        if self._requires_grad and value._data.dtype.kind not in "fc":
            raise RuntimeError("data set to a tensor that requires gradients must be floating point or complex dtype")
        old = self._data
        if self._vc is None and not _views.is_inference(self):
            self._vc = [self._version, True]  # the tensor keeps its version counter, as in PyTorch
        self._data = value._data
        if old.shape != self._data.shape or old.dtype != self._data.dtype:
            # rows already recorded keep the old size: backward checks the tapes this
            # tensor's gradient flows through (engine/compiled.check_edge_shapes)
            acc = self._acc() if self._acc is not None else None
            for tape in (self._tape, acc._tape if acc is not None else None):
                if tape is not None:
                    tape.reshaped = True

    @data.deleter
    def data(self):
        raise RuntimeError("Deleting tensor data is not allowed. Delete tensor instead!")

    def detach(self):
        t = Tensor._make(self._data)  # shares the storage, hence its version counter
        x = self._x
        if x is not None:
            if x.inference:
                _views.mark_inference(t, _Rare)
            elif _counter(x) is not None:
                t._vc = _counter(x)  # or the counter of its own that it has (see _bump)
        if self._data.size == 1:  # its writes must find the saves of self copied into a tape (ops/inplace.py)
            t._origin = self._origin or weakref.ref(self)
        if _cap.on and _cap.mine():  # jitgrad.compile: the same value as this tensor's
            _cap.rec.alias(t, self)
        return t

    def detach_(self):
        v = _views.info(self)
        if v is not None:
            raise RuntimeError("Can't detach views in-place. Use detach() instead. If you are using DistributedDataParallel "
                               "(DDP) for training, and gradient_as_bucket_view is set as True, gradients are views of "
                               "DDP buckets, and hence detach_() cannot be called on these gradients. To fix this "
                               "error, please refer to the Optimizer.zero_grad() function in torch/optim/optimizer.py "
                               "as the solution.")
        _stop("detach_() in a compiled step")
        if self._tape is not None:
            self._tape.note_detached(self._row)  # nodes that saved it can no longer use it
        self._tape = None
        self._requires_grad = False
        return self

    # -- conversion ----------------------------------------------------------------
    def numpy(self, *, force=False):
        if _cap.on:
            _stop("Tensor.numpy() reads a value in the step")
        if self.requires_grad and _state.enabled and not force:  # torch allows it under no_grad
            raise RuntimeError("Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy() instead.")
        return self._array()

    def _array(self):
        """The data as an ndarray (0-d results are held as numpy scalars; see functional._ARRAYLIKE)."""
        d = self._data
        if type(d) is DeviceArray:
            raise TypeError(TO_NUMPY)
        if type(d) is MetaArray:
            raise TypeError(TO_NUMPY.replace("cuda:0", "meta"))
        if type(d) is not np.ndarray:
            d = self._data = np.array(d)
        return d

    def tolist(self):
        if _cap.on:
            _stop("Tensor.tolist() reads a value in the step")
        return self._data.tolist()

    def item(self):
        if _cap.on:
            _stop("Tensor.item() reads a value in the step")
        if self._data.size != 1:
            raise RuntimeError(f"a Tensor with {self._data.size} elements cannot be converted to Scalar")
        return self._data.item()

    def __float__(self):
        if self._data.size != 1:
            raise ValueError("only one element tensors can be converted to Python scalars")
        return float(self.item())

    def __int__(self):
        if self._data.size != 1:
            raise ValueError("only one element tensors can be converted to Python scalars")
        return int(self.item())

    def __bool__(self):
        if _cap.on:
            _stop("bool() of a tensor reads a value in the step")
        if self._data.size != 1:
            raise RuntimeError("Boolean value of Tensor with more than one value is ambiguous")
        return bool(self._data.item())

    def __index__(self):
        if _cap.on:
            _stop("a tensor used as an index reads a value in the step")
        if self._data.dtype.kind not in "iub" or self._data.size != 1:
            raise TypeError("only integer tensors of a single element can be converted to an index")
        return int(self._data.item())

    def __array__(self, dtype=None, copy=None):
        if _cap.on:
            _stop("a tensor converted to a numpy array reads a value in the step")
        d = self._array()
        return d if dtype is None else d.astype(dtype)

    def __repr__(self):
        return tensor_repr(self)

    __str__ = __repr__

    def __hash__(self):
        return id(self)

    def __iter__(self):
        if self._data.ndim == 0:
            raise TypeError("iteration over a 0-d tensor")
        return (self[i] for i in range(self._data.shape[0]))

    # to(), long(), clone() and the other methods that run ops are bound by ops/methods.py;
    # backward() by engine/run.py: the Tensor sits below both layers

    def float(self):
        return self.to(_dtype.float32)

    def double(self):
        return self.to(_dtype.float64)

    def type(self, dtype=None):
        return self.to(dtype)

    # cpu() and cuda() move data with a differentiable op: bound by ops/methods.py

    def contiguous(self):
        return self

    def is_contiguous(self):
        return True

    # in-place ops (add_, mul_, copy_, op=, item assignment...) are in ops/inplace.py


def _counter(x):
    """The version counter of a tensor of its own (its _Rare x), or of its view's root."""
    if x.vc is not None:
        return x.vc
    view = x.view_of
    if view is not None:
        rx = view.base._x
        return None if rx is None else rx.vc
    return None


def _init_from(t, arr):
    t._data = arr
    t._requires_grad = False
    t._tape = None
    t._x = None


_new = object.__new__
_ARRAYLIKE = (np.ndarray, np.generic, DeviceArray, MetaArray)


def place(arr, dev):
    """Host data `arr` on the device `dev` (a checked device): the array itself for the CPU,
    a device copy for CUDA (raising PyTorch's error when there is no GPU)."""
    if dev.type == "cpu":
        return arr
    if dev.type == "meta":
        return MetaArray.like(arr)
    _gpu.require()
    if dev.index is not None and dev.index >= _gpu.device_count():
        raise RuntimeError("CUDA error: invalid device ordinal")
    return DeviceArray.from_host(arr)


def filled(shape, npd, value, dev):
    """A new CUDA array of `shape` with every element `value` ("none": left as allocated)."""
    place(np.zeros(0, npd), dev)  # the device checks
    arr = DeviceArray.empty(shape, npd)
    if value != "none":
        arr.fill(value)
    return arr


def wrap(arr):
    """A Tensor over `arr` (numpy data; anything else is converted), without a graph."""
    if not isinstance(arr, _ARRAYLIKE):
        arr = np.asarray(arr)
    t = _new(Tensor)  # Tensor._make, inlined: every op's output is made here
    t._data = arr
    t._requires_grad = False
    t._tape = None
    t._x = None
    if _modes._inference_on[0]:
        in_inference_mode(t)
    return t


def in_inference_mode(t):
    """Every tensor made in inference mode is an inference tensor (t: one just made)."""
    if _state.inference:
        _views.mark_inference(t, _Rare)


def linked(data, tape, row, nr=0):
    """A tensor for `data` whose grad_fn is row `row` of `tape` when the backward is being
    recorded (create_graph), so that a rule using a saved value differentiates through it."""
    t = wrap(data)
    if tape is not None and _state.enabled:
        t._requires_grad = True
        t._tape = tape
        t._row = row
        t._output_nr = nr
    if _forward.live:  # forward-over-reverse: the saved value's tangent comes back with it
        rows = _forward.by_tape.get(tape) if tape is not None else None
        tangent = rows.get((row, nr)) if rows is not None else None
        if tangent is not None:
            t._fw = tangent
    return t


class Size(tuple):
    """torch.Size: a tuple of ints that stays a Size when sliced, added to or repeated, so
    messages built from it print torch.Size([...]) as PyTorch's do."""

    def __repr__(self):
        return f"torch.Size({list(self)})"

    def __getitem__(self, key):
        item = tuple.__getitem__(self, key)
        return Size(item) if isinstance(key, slice) else item

    def __add__(self, other):
        if not isinstance(other, tuple):
            return NotImplemented
        return Size(tuple.__add__(self, other))

    def __radd__(self, other):
        if not isinstance(other, tuple):
            return NotImplemented
        return Size(tuple.__add__(other, self))

    def __mul__(self, n):
        return Size(tuple.__mul__(self, n))

    __rmul__ = __mul__

    def numel(self):
        n = 1
        for d in self:
            n *= d
        return n


def _wrap_dim(dim, ndim):
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {dim})")
    return dim % n


# -- creation -----------------------------------------------------------------------
# Factories are where user values enter: sizes, dtypes, devices and data are checked here,
# with PyTorch's errors, so that nothing past them sees a negative size or a wrapped integer.
def _unwrap_nested(data):
    if isinstance(data, Tensor):
        _stop("tensor() of a tensor reads its value in the step")
        return data._data
    if isinstance(data, (list, tuple)):
        return [_unwrap_nested(x) for x in data]
    return data


def _check_requires_grad(arr, requires_grad):
    if requires_grad and arr.dtype.kind != "f":
        raise RuntimeError("Only Tensors of floating point and complex dtype can require gradients")


def _tname(x):
    return type(x).__name__


def _dtype_arg(dtype, fn):
    """numpy dtype for a dtype argument (None: None). numpy would read a string such as
    "float32" as a dtype; torch does not."""
    if dtype is None or isinstance(dtype, _dtype.dtype):
        return _dtype.to_numpy_dtype(dtype)
    if not isinstance(dtype, str):
        try:
            return from_numpy_dtype(np.dtype(dtype)).np  # a numpy dtype, or Python's float/int/bool
        except TypeError:
            pass
    raise TypeError(f"{fn}(): argument 'dtype' must be torch.dtype, not {_tname(dtype)}")


_INT64_MAX = np.iinfo(np.int64).max
_INT64_MIN = np.iinfo(np.int64).min


def _leaf_error(x):
    """torch's error for a scalar in tensor()'s data that has no dtype of ours, or None."""
    if x is None or isinstance(x, (dict, set)) or not isinstance(x, (int, float, bool, complex, np.generic, str, bytes)):
        return RuntimeError(f"Could not infer dtype of {_tname(x)}")
    if isinstance(x, (str, bytes)):
        return TypeError(f"new(): invalid data type '{_tname(x)}'")
    if isinstance(x, int) and not _INT64_MIN <= x <= _INT64_MAX:
        return ValueError("Overflow when unpacking long long")
    return None


def _data_error(data, dims=None, d=0):
    """Why numpy could not make a numeric array of `data`, as torch reports it: ragged
    nesting, None, strings, integers beyond int64. Runs only on the error path."""
    if dims is None:
        if isinstance(data, (str, bytes)):
            return TypeError(f"new(): invalid data type '{_tname(data)}'")
        dims, x = [], data
        while isinstance(x, (list, tuple)):
            dims.append(len(x))
            if not x:
                break
            x = x[0]
        if dims and isinstance(x, str):
            return ValueError("too many dimensions 'str'")
    if not isinstance(data, (list, tuple)):
        if d < len(dims):
            return TypeError("not a sequence")
        return _leaf_error(data)
    if d >= len(dims):
        return TypeError(f"'{_tname(data)}' object cannot be interpreted as an integer")
    if len(data) != dims[d]:
        return ValueError(f"expected sequence of length {dims[d]} at dim {d} (got {len(data)})")
    for x in data:
        e = _data_error(x, dims, d + 1)
        if e is not None:
            return e
    return None


def _array_from(data, npd):
    """np.array(data) with torch's errors for what numpy rejects or would silently misread."""
    data = _unwrap_nested(data)
    try:
        arr = np.array(data, dtype=npd)
    except (ValueError, TypeError, OverflowError) as e:
        raise (_data_error(data) or e) from None
    if arr.dtype.kind in "OUSV":
        raise _data_error(data) or RuntimeError(f"Could not infer dtype of {_tname(data)}")
    if arr.dtype.kind == "u" and arr.size and arr.max() > _INT64_MAX:
        raise ValueError("Overflow when unpacking long long")  # numpy chose uint64; int64 would wrap
    return arr


def _has_float64_scalar(data):
    """Whether a nested list holds an np.float64 scalar: torch infers those as float64 where
    a Python float takes the default dtype."""
    if isinstance(data, (list, tuple)):
        return any(_has_float64_scalar(x) for x in data)
    return isinstance(data, np.float64)


def tensor(data, dtype=None, device=None, requires_grad=False):
    npd = _dtype_arg(dtype, "tensor")
    dev = _device.check(device, "tensor")
    src = data._data if isinstance(data, Tensor) else data
    if _foreign.is_cuda_array(src):  # a CUDA tensor, cupy, torch CUDA...: copied on the device
        return _finish(_foreign.array_from(src, npd, dev if device is not None else None, True), requires_grad)
    if npd is None and isinstance(data, (np.ndarray, np.generic)):
        npd = from_numpy_dtype(data.dtype).np  # numpy data keeps its dtype, as in PyTorch
    if npd is None:
        arr = _array_from(data, None)
        if arr.dtype.kind == "f":
            arr = arr.astype(np.float64 if _has_float64_scalar(data) else _dtype.get_default_dtype().np, copy=False)
        elif arr.dtype.kind in "iu":
            arr = arr.astype(np.int64, copy=False)
        elif arr.dtype.kind != "b":
            raise TypeError(f"Could not infer dtype of {type(data).__name__}")
    else:
        arr = _array_from(data, npd)
    return _finish(place(arr, dev), requires_grad)


def as_tensor(data, dtype=None, device=None):
    dev = _device.check(device, "as_tensor") if device is not None else None
    if isinstance(data, Tensor) and (dtype is None or dtype.np == data._data.dtype) and (
            dev is None or dev == data.device):
        return data
    if isinstance(data, Tensor):
        return data.to(device=dev or data.device, dtype=dtype)
    if _foreign.is_cuda_array(data):  # another library's CUDA memory: shared, as torch shares it
        return _finish(_foreign.array_from(data, _dtype_arg(dtype, "as_tensor"), dev, False), False)
    return tensor(data, dtype=dtype, device=dev)


def from_numpy(arr):
    if not isinstance(arr, np.ndarray):
        raise TypeError(f"expected np.ndarray (got {_tname(arr)})")
    from_numpy_dtype(arr.dtype)  # raises for unsupported dtypes
    return _finish(arr, False)


def _is_int(x):
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _size_arg(size, fn):
    """The shape from a factory's *size: (2, 3), ((2, 3),) or ([2, 3],); torch's errors."""
    if len(size) == 1 and not _is_int(size[0]):
        if not isinstance(size[0], (tuple, list)):
            raise TypeError(f"{fn}(): argument 'size' (position 1) must be tuple of ints, not {_tname(size[0])}")
        size = tuple(size[0])
    for i, s in enumerate(size):
        if not _is_int(s):
            raise TypeError(f"{fn}(): argument 'size' failed to unpack the object at pos {i + 1} with error "
                            f"\"type must be tuple of ints,but got {_tname(s)}\"")
    size = tuple(int(s) for s in size)
    for s in size:
        if s < 0:
            if fn == "zeros":
                raise RuntimeError("zeros: Dimension size must be non-negative.")
            raise RuntimeError(f"Trying to create tensor with negative dimension {s}: {list(size)}")
    return size


def _finish(arr, requires_grad, draw=None, inputs=()):
    """The factories' tensor. In a jitgrad.compile recording it is a constant of the plan,
    or, when `draw` (input arrays -> (a new array,)) is given, a Python instruction that
    draws it afresh at every replay from the tensors `inputs`' values then."""
    _check_requires_grad(arr, requires_grad)
    t = Tensor._make(arr)
    t._requires_grad = bool(requires_grad)
    if _modes._inference_on[0]:
        in_inference_mode(t)
    if _cap.on and _cap.mine():
        if requires_grad:
            _stop("a tensor requiring grad created in the step (a new leaf at every call)")
        elif draw is not None:
            _cap.rec.python(draw, inputs, (t,), "a random draw")
        else:
            _cap.rec.constant_tensor(t)
    return t


def drawn(draw, inputs=(), requires_grad=False):
    """The tensor of a random op: draw(*the inputs' arrays) -> (its array,), drawing from
    the generator it names at the time it is called. Every random op of jitgrad makes its
    result here (dropout's mask through nn.functional._computed, the same mechanism; the
    in-place fills break the recording instead): a jitgrad.compile replay calls `draw` again
    at the same point of the step, on that call's input values, so it gets the numbers eager
    would get from the generator's state then and leaves the generator where eager would.
    A result made any other way would be a constant of the plan: the first call's draw,
    replayed forever (tests/compiler/test_random_replay.py runs every random op)."""
    (arr,) = draw(*(t._data for t in inputs))
    return _finish(arr, requires_grad, draw, inputs)


def factory_args(size, dtype, device, fn, float_only=None):
    """A factory's shape, numpy dtype and device, checked in torch's order; float_only:
    torch's kernel name when the factory makes floating dtypes only."""
    npd = _dtype_arg(dtype, fn) or _dtype.get_default_dtype().np
    shape = _size_arg(size, fn)
    dev = _device.check(device, fn)
    if float_only and npd.kind != "f":
        raise NotImplementedError(f"\"{float_only}\" not implemented for '{scalar_name(npd)}'")
    return shape, npd, dev


def _factory(fill, fn, float_only=None, random=False, const=None):
    """float_only: torch's kernel name when the fill exists only for floating dtypes.
    random: the fill draws from the generator (jitgrad.compile draws it again at replay).
    const: the value every element gets (zeros, ones; empty: "none"), so that a CUDA tensor
    is made on the device without a host copy."""
    def make(*size, dtype=None, requires_grad=False, device=None):
        shape, npd, dev = factory_args(size, dtype, device, fn, float_only)
        # CUDA tensors are filled on the host and copied over: the random ones draw from
        # the same generator as the CPU's, so a seed gives the same numbers on both
        if random:
            return drawn(lambda: (place(fill(shape, npd, dev), dev),), (), requires_grad)
        if const is not None and dev.type == "cuda":
            return _finish(filled(shape, npd, const, dev), requires_grad)
        return _finish(place(fill(shape, npd), dev), requires_grad)
    make.__name__ = fn
    return make


# torch.default_generator, then the CUDA tensors' default stream (graph/random.py puts them
# here): every draw made without a generator. CUDA tensors are drawn on the host, from a
# stream of their own, so that (as in torch) they never move the CPU one.
_rng = [None, None]


def stream(dev):
    """The default generator of a device's draws."""
    return _rng[1] if dev.type == "cuda" else _rng[0]


def replayed(change, name):
    """change() (a change of a generator's state, or a read of it, that draws nothing) made
    while jitgrad.compile records a step is made again at the same point of every replay, as
    the draws are (drawn): the draws after it then get the numbers eager's get."""
    if _cap.on and _cap.mine():
        _cap.rec.python(lambda: (change(), ())[1], (), (), name)


def manual_seed(seed):
    """Seeds torch.default_generator and the CUDA stream (and returns the first, as torch does)."""
    _rng[1].manual_seed(seed)
    return _rng[0].manual_seed(seed)


def rng_state():
    """The global generator's state, for a caller that draws the same numbers again later
    (set_rng_state): vmap(randomness="same") in chunks, checkpoint's rerun. A list holding
    it, whose content a compiled step's replay reads again from that call's generator."""
    box = [None]

    def read():
        box[0] = (_rng[0].snapshot(), _rng[1].snapshot())
    read()
    replayed(read, "the generator's state read")
    return box


def set_rng_state(box):
    def write():
        _rng[0].restore(box[0][0])
        _rng[1].restore(box[0][1])
    write()
    replayed(write, "the generator's state set")


zeros = _factory(lambda s, d: np.zeros(s, d), "zeros", const=0)
ones = _factory(lambda s, d: np.ones(s, d), "ones", const=1)
empty = _factory(lambda s, d: np.empty(s, d), "empty", const="none")
# (a fresh tensor is contiguous: torch's normal_fill for 16 elements or more)
randn = _factory(lambda s, d, dev: stream(dev).normal(_numel(s), d).reshape(s), "randn", "normal_kernel_cpu",
                 random=True)
rand = _factory(lambda s, d, dev: stream(dev).uniform(_numel(s), d).reshape(s), "rand", "check_uniform_bounds",
                random=True)


def _numel(shape):
    n = 1
    for k in shape:
        n *= k
    return n


def _number(x):
    return isinstance(x, (int, float, np.number, np.bool_)) or (isinstance(x, Tensor) and x._data.size == 1)


def full(size, fill_value, dtype=None, requires_grad=False, device=None):
    if not isinstance(size, (tuple, list)):
        raise TypeError(f"full(): argument 'size' (position 1) must be tuple of ints, not {_tname(size)}")
    shape = _size_arg((size,), "full")
    if not _number(fill_value):
        raise TypeError(f"full(): argument 'fill_value' (position 2) must be Number, not {_tname(fill_value)}")
    dev = _device.check(device, "full")
    if isinstance(fill_value, Tensor):
        fill_value = fill_value.item()
    npd = _dtype_arg(dtype, "full")
    if npd is None:
        npd = (np.dtype(np.bool_) if isinstance(fill_value, bool) else
               np.dtype(np.int64) if isinstance(fill_value, int) else _dtype.get_default_dtype().np)
    if dev.type == "cuda":
        return _finish(filled(shape, npd, fill_value, dev), requires_grad)
    return _finish(place(np.full(shape, fill_value, dtype=npd), dev), requires_grad)


def _arange_error(start, end, step):
    """torch's error for arange's arguments, or None: numpy would divide by a zero step, or
    give an empty or endless range where torch refuses."""
    names = (("start", start), ("end", end), ("step", step))
    for pos, (name, v) in enumerate(names, 1):
        if not _number(v) or isinstance(v, Tensor):
            return TypeError(f"arange(): argument '{name}' (position {pos}) must be Number, not {_tname(v)}")
    if not (np.isfinite(start) and np.isfinite(end)):
        return RuntimeError(f"unsupported range: {start} -> {end}")
    if step == 0:
        return RuntimeError("step must be nonzero")
    if (step > 0 and end < start) or (step < 0 and end > start):
        return RuntimeError("upper bound and lower bound inconsistent with step sign")
    return None


def _scalar_arg(v):
    """A 0-d tensor given for a number (torch takes it as its Scalar; the dtype follows its value)."""
    return v.item() if isinstance(v, Tensor) and v._data.ndim == 0 else v


def arange(start, end=None, step=1, dtype=None, requires_grad=False, device=None):
    start, end, step = _scalar_arg(start), _scalar_arg(end), _scalar_arg(step)
    if end is None:
        start, end = 0, start
        if not _number(end):  # torch.arange(x) names x 'end'
            raise TypeError(f"arange(): argument 'end' (position 1) must be Number, not {_tname(end)}")
    e = _arange_error(start, end, step)
    if e is not None:
        raise e
    dev = _device.check(device, "arange")
    npd = _dtype_arg(dtype, "arange")
    if npd is None:
        npd = np.int64 if all(isinstance(v, int) for v in (start, end, step)) else _dtype.get_default_dtype().np
    return _finish(place(np.arange(start, end, step, dtype=npd), dev), requires_grad)


def _spaced(fn, start, end, steps, npd, calc, fused):
    """start .. end in `steps` evenly spaced values, as torch's kernels make them: the ends
    cast to the result's dtype npd, the values computed in dtype calc, from start for the
    first half and from end for the second (both ends exact). fused: a + step * i rounded
    once, as linspace's compiled kernel does (a fused multiply-add), so it is computed in a
    wider float; else rounded twice (logspace's)."""
    if not (_number(start) and _number(end) and _is_int(steps)):
        raise TypeError(f"{fn}() received an invalid combination of arguments - got ({_tname(start)}, {_tname(end)}, "
                        f"{_tname(steps)}), but expected one of:\n * (Number start, Number end, int steps, *, "
                        "Tensor out = None, torch.dtype dtype = None, torch.device device = None, "
                        "bool requires_grad = False)")
    steps = int(steps)
    if steps < 0:
        raise RuntimeError("number of steps must be non-negative")
    start, end = (v.item() if isinstance(v, Tensor) else v for v in (start, end))
    lo, hi = calc.type(npd.type(start)), calc.type(npd.type(end))
    if steps <= 1:
        return np.full(steps, lo, dtype=calc)
    wide = (np.float64 if calc == np.float32 else np.longdouble) if fused else calc.type
    i = np.arange(steps, dtype=wide)
    with np.errstate(all="ignore"):
        step = wide((hi - lo) / calc.type(steps - 1))
        return np.where(i < steps // 2, wide(lo) + step * i, wide(hi) - step * (steps - 1 - i)).astype(calc)


def _space_ends(fn, start, end):
    if isinstance(start, Tensor) and start._data.ndim or isinstance(end, Tensor) and end._data.ndim:
        nd = [v._data.ndim if isinstance(v, Tensor) else 0 for v in (start, end)]
        raise RuntimeError(f"{fn} only supports 0-dimensional start and end tensors, but got start with {nd[0]} "
                           f"dimension(s) and end with {nd[1]} dimension(s).")
    return _scalar_arg(start), _scalar_arg(end)


def linspace(start, end, steps, dtype=None, requires_grad=False, device=None):
    start, end = _space_ends("linspace", start, end)
    npd = _dtype_arg(dtype, "linspace") or _dtype.get_default_dtype().np
    dev = _device.check(device, "linspace")
    calc = npd if npd.kind == "f" else np.dtype(np.float64)  # integer results: a float64 step, truncated
    return _finish(place(_spaced("linspace", start, end, steps, npd, calc, True).astype(npd), dev), requires_grad)


def logspace(start, end, steps, base=10.0, dtype=None, requires_grad=False, device=None):
    start, end = _space_ends("logspace", start, end)
    npd = _dtype_arg(dtype, "logspace") or _dtype.get_default_dtype().np
    dev = _device.check(device, "logspace")
    # torch computes the powers in double whatever the dtype, then casts
    exps = _spaced("logspace", start, end, steps, npd, np.dtype(np.float64), False)
    with np.errstate(all="ignore"):
        out = np.power(np.float64(base), exps)
    return _finish(place(out.astype(npd), dev), requires_grad)


def eye(n, m=None, dtype=None, requires_grad=False, device=None):
    for name, v in (("n", n), ("m", m)):
        if v is None and name == "m":
            continue
        if not _is_int(v):
            raise TypeError(f"eye(): argument '{name}' (position {1 if name == 'n' else 2}) must be int, "
                            f"not {_tname(v)}")
        if v < 0:
            raise RuntimeError(f"{name} must be greater or equal to 0, got {v}")
    npd = _dtype_arg(dtype, "eye") or _dtype.get_default_dtype().np
    dev = _device.check(device, "eye")
    return _finish(place(np.eye(n, m, dtype=npd), dev), requires_grad)


def _like_input(t, fn):
    if not isinstance(t, Tensor):
        raise TypeError(f"{fn}(): argument 'input' (position 1) must be Tensor, not {_tname(t)}")


def _like(make):
    fn = make.__name__ + "_like"

    def make_like(t, dtype=None, requires_grad=False, device=None):
        _like_input(t, fn)
        return make(*t._data.shape, dtype=dtype or t.dtype, requires_grad=requires_grad,
                    device=t.device if device is None else device)
    make_like.__name__ = fn
    return make_like


zeros_like = _like(zeros)
ones_like = _like(ones)
empty_like = _like(empty)
randn_like = _like(randn)
rand_like = _like(rand)


def full_like(t, fill_value, dtype=None, requires_grad=False, device=None):
    _like_input(t, "full_like")
    return full(t._data.shape, fill_value, dtype=dtype or t.dtype, requires_grad=requires_grad,
                device=t.device if device is None else device)


