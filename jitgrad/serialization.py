"""jitgrad.save / jitgrad.load: checkpoints as numpy .npz files, never pickle.

torch.save pickles, so loading an untrusted file can run code. Here the file is a plain .npz:
every tensor / ndarray is one array member ("a0", "a1", ...) and the object structure is a JSON
string in the member "__jitgrad__", with arrays referenced by index. Loading uses
np.load(allow_pickle=False), so it only ever builds data, and any numpy can read the arrays.

JSON cannot tell a tuple from a list, an OrderedDict from a dict, or an int key from a str key,
and state dicts rely on all three, so every container is written as a tagged JSON object:
  {"list": [...]}, {"tuple": [...]}, {"dict": [[key, value], ...], "ordered": bool},
  {"tensor": i, "ref": n, "requires_grad": bool, "parameter": bool[, "device": "cuda:0"]}, {"ndarray": i},
  {"npscalar": i}.
("ref" numbers tensor objects: one saved twice loads as one object, as pickle's memo gives torch. A CUDA
tensor's data is stored as its host copy, and "device" says where to restore it, as torch's location tag.)
Scalars (None, bool, int, float incl. inf/nan, str) are plain JSON values.

load() treats the file as untrusted and reads the zip itself rather than through np.load: members
must be stored uncompressed (as save writes them), uniquely named, within the file; each .npy
header must account for exactly its member's bytes before anything is allocated, and the
structure record is capped, so memory stays bounded by the file's size. Arrays come back
native-endian, C-contiguous and owned; tensors only in the dtypes jitgrad supports (the compiled
engine reads them by address). Every refusal is RuntimeError("Invalid jitgrad file ...").
"""
import io
import json
import math
import os
import struct
import sys
import zipfile
import zlib
from collections import OrderedDict

import numpy as np

from jitgrad._core import device as _device
from jitgrad._core import dtype as _dtype
from jitgrad.gpu import driver as _gpu
from jitgrad.gpu.array import DeviceArray
from jitgrad.graph.tensor import Tensor, place
from jitgrad.nn.parameter import Parameter

_META = "__jitgrad__"
_FORMAT = 1  # bumped if the layout changes, so old readers refuse new files clearly


def _open_for_writing(path):
    """open(path, "wb") with torch.save's RuntimeErrors for a path it cannot write."""
    parent = os.path.dirname(os.fspath(path))
    if parent and not os.path.isdir(parent):
        raise RuntimeError(f"Parent directory {parent} does not exist.")
    try:
        return open(path, "wb")
    except OSError as e:  # a directory, no permission: torch's file writer reports its strerror
        raise RuntimeError(f"open file failed with strerror: {e.strerror}") from e


def save(obj, f):
    """Write obj (a Tensor, ndarray, scalar, or dicts/lists/tuples of them) to a path or binary file."""
    arrays = {}
    meta = json.dumps({"format": _FORMAT, "obj": _Encoder(arrays).encode(obj)})
    members = {f"a{i}": a for i, a in enumerate(arrays.values())}
    members[_META] = np.array(meta)  # a 0-d unicode array: readable with allow_pickle=False
    if isinstance(f, (str, os.PathLike)):
        # opened here: given a path, np.savez would append ".npz" to names that lack it
        with _open_for_writing(f) as fh:
            np.savez(fh, **members)
    else:
        np.savez(f, **members)


def load(f, weights_only=True, map_location=None):
    """Read what save() wrote. weights_only is accepted for torch compatibility; the format holds
    only data, so loading is always safe. Tensors come back on the device they were saved from,
    or where map_location puts them, as torch.load: a device (or its name) for all of them, a
    dict from saved location ("cuda:0", "cpu") to another, or fn(tensor, location) returning the
    tensor to use (None: where it was saved)."""
    name = os.fspath(f) if isinstance(f, (str, os.PathLike)) else getattr(f, "name", repr(f))
    if isinstance(f, (str, os.PathLike)):
        with open(f, "rb") as fh:  # outside the try: a missing file is FileNotFoundError, as in torch
            return _read(fh, name, map_location)
    return _read(f, name, map_location)


def _read(fh, name, map_location):
    # every way a damaged file can fail inside zipfile/numpy/json becomes one clear RuntimeError
    try:
        with _Archive(fh) as archive:
            meta = _structure_record(archive)
            if not isinstance(meta, dict) or meta.get("format") != _FORMAT:
                raise _Corrupt(f"unsupported format {meta.get('format') if isinstance(meta, dict) else meta!r}")
            return _Decoder(archive, map_location).decode(meta["obj"])
    except _Corrupt as e:
        raise RuntimeError(f"Invalid jitgrad file {name!r}: {e}") from None
    except _MapLocationError as e:  # map_location's own error, not the file's
        raise e.args[0] from None
    except (zipfile.BadZipFile, zlib.error, ValueError, KeyError, IndexError, TypeError, EOFError, OSError,
            RecursionError, OverflowError, struct.error) as e:
        raise RuntimeError(f"Invalid jitgrad file {name!r}: failed reading archive: {type(e).__name__}: {e}") from e


class _Corrupt(Exception):
    pass


class _MapLocationError(Exception):
    """Carries an error of map_location (or raised by it) past _read's handling of damaged files."""


# -- reading members -------------------------------------------------------------------------
# The file is untrusted, so nothing is allocated from a size the file merely declares: every
# member must be stored uncompressed (as save() writes it), so its declared size is bytes the
# file really holds, and the .npy header inside it must account for exactly those bytes. Memory
# used by load() is then bounded by the file's size, as safetensors bounds it.

_NPY_MAGIC = b"\x93NUMPY"
_MAX_HEADER = 10000          # numpy's own limit on a .npy header (np.load's max_header_size)
_MAX_DIMS = 64               # numpy's limit on ndim
_MAX_META_CHARS = 1 << 24    # the JSON structure record: ~100 chars per tensor, so 150k tensors
# array members may hold any plain numpy data (save() accepts any ndarray that needs no pickle);
# tensors are narrowed further to the dtypes jitgrad tensors support, in _Decoder._tensor
_DATA_KINDS = "biufcUSmM"


class _Archive:
    """The .npz's members by key ("a0", "__jitgrad__"), checked as a whole when opened."""

    def __init__(self, fh):
        start = fh.tell()
        if fh.read(len(_NPY_MAGIC)) == _NPY_MAGIC:  # what np.save writes: one bare array
            raise _Corrupt("not an .npz archive")
        end = fh.seek(0, os.SEEK_END)
        fh.seek(start)
        self.zip = zipfile.ZipFile(fh)
        try:
            self.members = _index_members(self.zip.infolist(), end, end - start)
        except BaseException:
            self.zip.close()
            raise

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.zip.close()

    def __contains__(self, key):
        return key in self.members

    def read(self, key, max_bytes=None):
        """The member as a new, writable, C-contiguous native-endian array."""
        info = self.members[key]
        if max_bytes is not None and info.file_size > max_bytes:
            raise _Corrupt(f"member {info.filename!r} is {info.file_size} bytes, more than the {max_bytes} "
                           "allowed for it")
        with self.zip.open(info) as member:
            return _read_npy(member, info)


def _index_members(infos, end, archive_size):
    # end: where the file ends (zipfile's offsets are positions in fh); archive_size: the archive's bytes
    members = {}
    total = 0
    for info in infos:
        name = info.filename
        if not name.endswith(".npy"):
            raise _Corrupt(f"unexpected member {name!r} (every member of a jitgrad file is an .npy array)")
        if name[:-4] in members:
            raise _Corrupt(f"duplicate member {name!r}")
        if info.flag_bits & 0x1:
            raise _Corrupt(f"member {name!r} is encrypted")
        if info.compress_type != zipfile.ZIP_STORED or info.compress_size != info.file_size:
            # a compressed member's declared size says nothing about the bytes the file holds
            # (2 MB of deflate inflates to 2 GiB); save() never compresses
            raise _Corrupt(f"member {name!r} is compressed (jitgrad.save writes members uncompressed)")
        total += info.file_size
        if info.header_offset + info.file_size > end or total > archive_size:
            # members that overlap or run past the end would let a small file declare a lot of data
            raise _Corrupt(f"member {name!r} declares {info.file_size} bytes, more than the file holds")
        members[name[:-4]] = info
    return members


def _read_npy(member, info):
    shape, fortran_order, dtype, header_size = _read_npy_header(member, info.filename)
    count = _check_shape(shape, dtype, info.filename)
    if header_size + count * dtype.itemsize != info.file_size:
        raise _Corrupt(f"member {info.filename!r} declares shape {shape} of {dtype} ({count * dtype.itemsize} bytes)"
                       f" but holds {info.file_size - header_size} bytes")
    arr = np.empty(count, dtype)
    _read_into(member, arr.view(np.uint8), info.filename)
    if not dtype.isnative:
        # compiled code reads native values by address: big-endian data is swapped here, once
        arr = arr.byteswap(inplace=True).view(dtype.newbyteorder("="))
    if dtype == np.bool_:
        # any byte but 0/1 is not a bool numpy or compiled code can rely on; nonzero is True, as astype gives
        np.minimum(arr.view(np.uint8), 1, out=arr.view(np.uint8))
    if fortran_order:
        return np.ascontiguousarray(arr.reshape(shape[::-1]).T)
    return arr.reshape(shape)


def _read_npy_header(member, name):
    """(shape, fortran_order, dtype, header bytes), reading no more than a bounded header."""
    magic = _read_exact(member, len(_NPY_MAGIC) + 2, name)
    if magic[:len(_NPY_MAGIC)] != _NPY_MAGIC:
        raise _Corrupt(f"member {name!r} is not an .npy array")
    version = (magic[-2], magic[-1])
    if version not in ((1, 0), (2, 0)):  # 3.0 only exists for structured dtypes, which are refused anyway
        raise _Corrupt(f"member {name!r} has unsupported .npy version {version}")
    length_format = "<H" if version == (1, 0) else "<I"
    length_bytes = _read_exact(member, struct.calcsize(length_format), name)
    (length,) = struct.unpack(length_format, length_bytes)
    if length > _MAX_HEADER:
        raise _Corrupt(f"member {name!r} has a {length}-byte header")
    header = _read_exact(member, length, name)
    parse = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    try:
        shape, fortran_order, dtype = parse(io.BytesIO(length_bytes + header), max_header_size=_MAX_HEADER)
    except (SyntaxError, MemoryError, RecursionError) as e:  # from literal_eval on a hostile header
        raise _Corrupt(f"member {name!r} has an unreadable header ({type(e).__name__})") from None
    if dtype.kind not in _DATA_KINDS or dtype.fields is not None or dtype.subdtype is not None or not dtype.itemsize:
        raise _Corrupt(f"member {name!r} has unsupported dtype {dtype}")
    return shape, fortran_order, dtype, len(magic) + len(length_bytes) + length


def _check_shape(shape, dtype, name):
    """The element count, once the shape is known to be one numpy can allocate."""
    if len(shape) > _MAX_DIMS or any(type(d) is not int or d < 0 for d in shape):
        raise _Corrupt(f"member {name!r} has invalid shape {shape}")
    # numpy also refuses shapes whose nonzero dims overflow, even when another dim is 0
    if math.prod(d for d in shape if d) * dtype.itemsize > sys.maxsize:
        raise _Corrupt(f"member {name!r} has invalid shape {shape} (too large)")
    return math.prod(shape)


def _read_exact(member, n, name):
    data = member.read(n)
    if len(data) != n:
        raise _Corrupt(f"member {name!r} is truncated")
    return data


def _read_into(member, out, name, chunk=1 << 24):
    # in chunks straight into the array: never a second whole-member copy
    view = memoryview(out)
    pos = 0
    while pos < len(view):
        n = member.readinto(view[pos:pos + chunk])
        if not n:
            raise _Corrupt(f"member {name!r} is truncated")
        pos += n


def _structure_record(archive):
    if _META not in archive:
        raise _Corrupt("not a jitgrad checkpoint (no structure record)")
    rec = archive.read(_META, max_bytes=_MAX_HEADER + 4 * _MAX_META_CHARS)
    if rec.dtype.kind != "U" or rec.ndim != 0:
        raise _Corrupt(f"structure record has dtype {rec.dtype} and shape {rec.shape}, not a string")
    try:
        # not str(rec[()]): numpy hands code points beyond U+10FFFF to CPython unchecked (SystemError)
        text = rec.tobytes().decode("utf-32-le" if sys.byteorder == "little" else "utf-32-be")
    except UnicodeDecodeError:
        raise _Corrupt("structure record is not valid text") from None
    return json.loads(text.rstrip("\0"))


class _Encoder:
    def __init__(self, arrays):
        self.arrays = arrays  # id(array) -> ndarray to write; order = member index
        self.held = []        # the arrays keyed, held so that ids stay unique
        self.index = {}       # id(ndarray) -> member index
        self.tensors = {}     # id(Tensor) -> encoded form, so a tensor saved twice loads as one object
        self.active = set()   # containers being encoded, to reject cycles instead of recursing forever

    def _array_index(self, arr):
        """arr: an ndarray, or a CUDA tensor's DeviceArray (its host copy is what is written)."""
        if arr.dtype.hasobject:
            raise TypeError("jitgrad.save cannot store arrays of dtype object (that would need pickle)")
        # keyed by the array object: tensors sharing one storage (t and t.detach()) keep sharing it
        if id(arr) not in self.index:
            self.index[id(arr)] = len(self.arrays)
            self.held.append(arr)
            self.arrays[id(arr)] = arr.get() if type(arr) is DeviceArray else arr
        return self.index[id(arr)]

    def encode(self, obj):
        if isinstance(obj, np.generic):  # before the scalars: np.float64 is a float subclass
            return {"npscalar": self._array_index(np.asarray(obj))}
        if obj is None or isinstance(obj, (bool, int, float, str)):
            return obj if type(obj) in (bool, int, float, str, type(None)) else _plain(obj)
        if isinstance(obj, Tensor):
            if id(obj) not in self.tensors:
                on_cuda = type(obj._data) is DeviceArray
                rec = {"tensor": self._array_index(obj._data if on_cuda else obj._array()), "ref": len(self.tensors),
                       "requires_grad": bool(obj.requires_grad), "parameter": isinstance(obj, Parameter)}
                if on_cuda:
                    rec["device"] = str(obj.device)  # the data is stored as a host copy
                self.tensors[id(obj)] = rec
            return self.tensors[id(obj)]
        if isinstance(obj, np.ndarray):
            return {"ndarray": self._array_index(obj)}
        if isinstance(obj, (list, tuple, dict)):
            if id(obj) in self.active:
                raise ValueError("jitgrad.save cannot store a self-referencing (circular) structure")
            self.active.add(id(obj))
            try:
                if isinstance(obj, dict):
                    return {"dict": [[self._key(k), self.encode(v)] for k, v in obj.items()],
                            "ordered": isinstance(obj, OrderedDict)}
                return {"tuple" if isinstance(obj, tuple) else "list": [self.encode(v) for v in obj]}
            finally:
                self.active.discard(id(obj))
        raise TypeError(f"jitgrad.save cannot store an object of type {type(obj).__module__}.{type(obj).__qualname__}"
                        "; supported: Tensor, numpy arrays, None/bool/int/float/str, and dicts, lists, tuples "
                        "of these")

    def _key(self, k):
        if k is None or isinstance(k, (bool, int, float, str, tuple)):
            return self.encode(k)
        raise TypeError(f"jitgrad.save cannot store a dict key of type {type(k).__name__}")


def _plain(x):
    # subclasses of builtins (IntEnum, str subclasses...) are stored as their base value
    for t in (bool, int, float, str):
        if isinstance(x, t):
            return t(x)


class _Decoder:
    def __init__(self, archive, map_location=None):
        self.archive = archive
        self.map_location = map_location
        self.arrays = {}   # member index -> ndarray, so shared storage stays shared
        self.placed = {}   # (member index, device) -> its array there: shared storage stays shared on a GPU too
        self.tensors = {}  # "ref" -> (member index, Tensor), so a tensor saved twice loads as one object

    def _array(self, i):
        if not isinstance(i, int) or isinstance(i, bool) or f"a{i}" not in self.archive:
            raise _Corrupt(f"reference to missing array {i!r}")
        if i not in self.arrays:
            self.arrays[i] = self.archive.read(f"a{i}")
        return self.arrays[i]

    def decode(self, x):
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        if isinstance(x, dict):
            if "list" in x:
                return [self.decode(v) for v in x["list"]]
            if "tuple" in x:
                return tuple(self.decode(v) for v in x["tuple"])
            if "dict" in x:
                d = OrderedDict() if x.get("ordered") else {}
                for k, v in x["dict"]:
                    d[self.decode(k)] = self.decode(v)
                return d
            if "tensor" in x:
                return self._tensor(x)
            if "ndarray" in x:
                return self._array(x["ndarray"])
            if "npscalar" in x:
                arr = self._array(x["npscalar"])
                if arr.ndim:
                    raise _Corrupt(f"numpy scalar record refers to an array of shape {arr.shape}")
                return arr[()]
        raise _Corrupt(f"unrecognised record {str(x)[:80]}")

    def _tensor(self, x):
        key, i = x.get("ref"), x["tensor"]
        if not isinstance(key, int) or isinstance(key, bool):
            raise _Corrupt(f"tensor record with invalid ref {key!r}")
        if key in self.tensors:
            if self.tensors[key][0] != i:
                raise _Corrupt(f"tensor ref {key} names two different arrays")
            return self.tensors[key][1]
        arr = self._array(i)
        # the compiled engine reads a tensor's array by address at the tensor's dtype: only the
        # dtypes a tensor can have get in (the array is already native, C-contiguous and its own)
        if arr.dtype not in _dtype._FROM_NP:
            raise _Corrupt(f"tensor record refers to an array of dtype {arr.dtype}, which jitgrad tensors do not "
                           "support (float32, float64, int64, int32, bool)")
        requires_grad = x.get("requires_grad")
        if requires_grad and arr.dtype.kind != "f":
            raise _Corrupt(f"tensor of dtype {arr.dtype} marked requires_grad")
        location = x.get("device", "cpu")
        if location not in _LOCATIONS:
            raise _Corrupt(f"tensor record with invalid device {location!r}")
        arr = self._placed(i, arr, location)
        if x.get("parameter"):
            t = Parameter(Tensor._make(arr), requires_grad=bool(requires_grad))
        else:
            # a leaf, like torch.load's result; requires_grad is restored as torch restores it
            t = Tensor._make(arr)
            if requires_grad:
                t.requires_grad_(True)
        self.tensors[key] = (i, t)
        return t

    def _placed(self, i, arr, location):
        """The array of member i where map_location puts a tensor saved on `location`."""
        try:
            return self._place(i, arr, location)
        except Exception as e:  # noqa: BLE001  (the user's map_location raised, or named no device)
            raise _MapLocationError(e) from None

    def _place(self, i, arr, location):
        ml = self.map_location
        if callable(ml) and not isinstance(ml, (str, _device.device, dict)):
            moved = ml(Tensor._make(arr), location)
            if moved is not None:
                if not isinstance(moved, Tensor):
                    raise TypeError(f"map_location should return a Tensor or None, not {type(moved).__name__}")
                return moved._data
            ml = None
        if isinstance(ml, dict):
            target = ml.get(location, location)
        else:
            target = location if ml is None else ml
        dev = _restore_device(target)
        key = (i, str(dev))
        if key not in self.placed:
            self.placed[key] = place(arr, dev)
        return self.placed[key]


_LOCATIONS = ("cpu", "cuda:0")  # where a saved tensor can have been: jitgrad uses one GPU
NO_CUDA = ("Attempting to deserialize object on a CUDA device but torch.cuda.is_available() is False. If you are "
           "running on a CPU-only machine, please use torch.load with map_location=torch.device('cpu') to map your "
           "storages to the CPU. (jitgrad: no CUDA device; it needs an NVIDIA GPU and numba-cuda)")


def _restore_device(target):
    """The device a map_location target names, with torch.load's errors."""
    if not isinstance(target, str) and not isinstance(getattr(target, "type", None), str):  # a torch.device too
        raise TypeError(f"'{type(target).__name__}' object is not callable")  # torch calls what is not a location
    try:
        dev = _device.check(target, "load")
    except (RuntimeError, NotImplementedError, AssertionError):
        raise RuntimeError(f"don't know how to restore data location of torch.storage.UntypedStorage (tagged with "
                           f"{target})") from None
    if dev.type == "cuda" and not _gpu.available():
        raise RuntimeError(NO_CUDA)
    return dev
