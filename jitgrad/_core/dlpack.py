"""DLPack capsules, through ctypes: DLPack 1.x's DLManagedTensorVersioned ("dltensor_versioned"
capsules, for consumers that ask with max_version >= (1, 0): numpy keeps the arrays it makes
from them writable) and the older DLManagedTensor ("dltensor", for everyone else).

`export` wraps a strided block of memory in a new capsule whose manager holds the
producer's object until the consumer calls the deleter (or, never consumed, the capsule
is collected). `consume` reads a capsule of either kind, marks it used (a capsule is
consumed once, as the protocol says) and returns its description with a `Release`
object: when the last array over the memory lets go of it, the producer's deleter runs.
"""
import ctypes

import numpy as np

CPU, CUDA = 1, 2   # DLDeviceType: kDLCPU, kDLCUDA
LEGACY, VERSIONED = b"dltensor", b"dltensor_versioned"
_USED = {LEGACY: b"used_dltensor", VERSIONED: b"used_dltensor_versioned"}
_INT, _UINT, _FLOAT, _BOOL = 0, 1, 2, 6   # DLDataTypeCode
READ_ONLY = 1   # DLPACK_FLAG_BITMASK_READ_ONLY
VERSION = (1, 0)


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int), ("dtype", DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    pass


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    pass


DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                            ("deleter", ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor)))]
DLManagedTensorVersioned._fields_ = [("version", DLPackVersion), ("manager_ctx", ctypes.c_void_p),
                                     ("deleter", ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensorVersioned))),
                                     ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]
_STRUCT = {LEGACY: DLManagedTensor, VERSIONED: DLManagedTensorVersioned}

# the C API, with private prototypes (setting argtypes on ctypes.pythonapi's would change them for everyone)
_api = ctypes.pythonapi
_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)(("PyCapsule_New", _api))
_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(("PyCapsule_IsValid", _api))
_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(("PyCapsule_GetPointer", _api))
_rename = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(("PyCapsule_SetName", _api))
# the capsule's destructor gets the capsule half-destroyed: raw pointers only
_valid_raw = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_IsValid", _api))
_pointer_raw = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_GetPointer", _api))

_live = {}  # address of a managed tensor made here -> (it, its shape and strides arrays, the producer's object)


def _forget(managed):
    _live.pop(ctypes.cast(managed, ctypes.c_void_p).value, None)


_DELETER = {name: struct._fields_[2][1](_forget) for name, struct in _STRUCT.items()}


@ctypes.CFUNCTYPE(None, ctypes.c_void_p)
def _capsule_destructor(capsule):
    # a consumer renames the capsule and calls the deleter itself: only an unused one still owns the tensor
    for name, struct in _STRUCT.items():
        if _valid_raw(capsule, name):
            managed = ctypes.cast(_pointer_raw(capsule, name), ctypes.POINTER(struct))
            managed.contents.deleter(managed)


_DESTRUCTOR = ctypes.cast(_capsule_destructor, ctypes.c_void_p)


def _dl_dtype(dtype):
    dtype = np.dtype(dtype)
    code = {"i": _INT, "u": _UINT, "f": _FLOAT, "b": _BOOL}.get(dtype.kind)
    if code is None:
        raise BufferError(f"DLPack has no type for dtype {dtype}")
    return DLDataType(code, dtype.itemsize * 8, 1)


def _np_dtype(t):
    if t.lanes != 1:
        raise BufferError(f"DLPack tensors with {t.lanes} lanes are not supported")
    kind = {_INT: "i", _UINT: "u", _FLOAT: "f", _BOOL: "b"}.get(t.code)
    if kind is None or t.bits % 8:
        raise BufferError(f"DLPack data type code {t.code} with {t.bits} bits is not supported")
    return np.dtype(np.bool_) if kind == "b" else np.dtype(f"{kind}{t.bits // 8}")


def export(ptr, shape, estrides, dtype, device_type, owner, versioned=False):
    """A new capsule (versioned: DLPack 1.0's) for the memory at ptr (strides in elements) on
    device_type, holding owner until the consumer's deleter call."""
    name = VERSIONED if versioned else LEGACY
    managed = _STRUCT[name]()
    if versioned:
        managed.version = DLPackVersion(*VERSION)
        managed.flags = 0
    ndim = len(shape)
    shape_arr = (ctypes.c_int64 * ndim)(*shape)
    strides_arr = (ctypes.c_int64 * ndim)(*estrides)
    t = managed.dl_tensor
    t.data = ptr or None
    t.device = DLDevice(device_type, 0)
    t.ndim = ndim
    t.dtype = _dl_dtype(dtype)
    t.shape = shape_arr
    t.strides = strides_arr
    t.byte_offset = 0
    managed.deleter = _DELETER[name]
    addr = ctypes.addressof(managed)
    _live[addr] = (managed, shape_arr, strides_arr, owner)
    return _new(addr, name, _DESTRUCTOR)


class Release:
    """Calls a consumed managed tensor's deleter when collected: arrays over its memory hold it."""

    def __init__(self, managed):
        self.managed = managed

    def __del__(self):
        deleter = self.managed.contents.deleter
        if deleter:
            deleter(self.managed)


def _managed(capsule):
    """(capsule name, pointer to its managed tensor) of an unused capsule."""
    if type(capsule).__name__ != "PyCapsule":
        raise TypeError(f"from_dlpack() expects an object with __dlpack__ or a DLPack capsule, not "
                        f"{type(capsule).__name__}")
    for name, struct in _STRUCT.items():
        if _valid(capsule, name):
            return name, ctypes.cast(_pointer(capsule, name), ctypes.POINTER(struct))
    raise RuntimeError("from_dlpack received an invalid capsule. Note that DLTensor capsules can be consumed "
                       "only once, so you might have already constructed a tensor from it once.")


def consume(capsule):
    """(data address, device_type, shape, strides in elements or None for C order, dtype,
    read-only, Release) of the capsule, which is marked used."""
    name, managed = _managed(capsule)
    m = managed.contents
    if name == VERSIONED and m.version.major > VERSION[0]:
        raise BufferError(f"DLPack version {m.version.major}.{m.version.minor} is not supported (jitgrad reads "
                          f"{VERSION[0]}.x)")
    read_only = name == VERSIONED and bool(m.flags & READ_ONLY)
    t = m.dl_tensor
    dtype = _np_dtype(t.dtype)
    ndim = t.ndim
    shape = tuple(t.shape[i] for i in range(ndim))
    strides = tuple(t.strides[i] for i in range(ndim)) if t.strides else None
    ptr = (t.data or 0) + t.byte_offset
    _rename(capsule, _USED[name])
    return ptr, t.device.device_type, shape, strides, dtype, read_only, Release(managed)


def c_strides(shape):
    """C-order strides, in elements."""
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return tuple(reversed(out))


def host_array(ptr, shape, estrides, dtype, owner, writeable=True):
    """An ndarray over host memory at ptr (strides in elements, None: C order), holding owner."""
    dtype = np.dtype(dtype)
    if estrides is None:
        estrides = c_strides(shape)
    if not ptr or any(d == 0 for d in shape):
        return np.zeros(shape, dtype)  # no memory to share
    lo = sum(s * (d - 1) for d, s in zip(shape, estrides) if s < 0)
    hi = sum(s * (d - 1) for d, s in zip(shape, estrides) if s > 0)
    cells = (ctypes.c_char * ((hi - lo + 1) * dtype.itemsize)).from_address(ptr + lo * dtype.itemsize)
    cells.owner = owner  # the array's base: the producer's memory stays while any view of it lives
    flat = np.frombuffer(cells, dtype)
    return np.lib.stride_tricks.as_strided(flat[-lo:], shape, tuple(s * dtype.itemsize for s in estrides),
                                           writeable=writeable)
