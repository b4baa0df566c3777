"""jitgrad.save / jitgrad.load: checkpoints as numpy .npz files, never pickle.

torch.save pickles, so loading an untrusted file can run code. Here the file is a plain .npz:
every tensor / ndarray is one array member ("a0", "a1", ...) and the object structure is a JSON
string in the member "__jitgrad__", with arrays referenced by index. Loading uses
np.load(allow_pickle=False), so it only ever builds data, and any numpy can read the arrays.

JSON cannot tell a tuple from a list, an OrderedDict from a dict, or an int key from a str key,
and state dicts rely on all three, so every container is written as a tagged JSON object:
  {"list": [...]}, {"tuple": [...]}, {"dict": [[key, value], ...], "ordered": bool},
  {"tensor": i, "ref": n, "requires_grad": bool, "parameter": bool}, {"ndarray": i}, {"npscalar": i}.
("ref" numbers tensor objects: one saved twice loads as one object, as pickle's memo gives torch.)
Scalars (None, bool, int, float incl. inf/nan, str) are plain JSON values.
"""
import json
import os
import zipfile
import zlib
from collections import OrderedDict

import numpy as np

from ._tensor import Tensor

_META = "__jitgrad__"
_FORMAT = 1  # bumped if the layout changes, so old readers refuse new files clearly


def save(obj, f):
    """Write obj (a Tensor, ndarray, scalar, or dicts/lists/tuples of them) to a path or binary file."""
    arrays = {}
    meta = json.dumps({"format": _FORMAT, "obj": _Encoder(arrays).encode(obj)})
    members = {f"a{i}": a for i, a in enumerate(arrays.values())}
    members[_META] = np.array(meta)  # a 0-d unicode array: readable with allow_pickle=False
    if isinstance(f, (str, os.PathLike)):
        # opened here: given a path, np.savez would append ".npz" to names that lack it
        with open(f, "wb") as fh:
            np.savez(fh, **members)
    else:
        np.savez(f, **members)


def load(f, weights_only=True, map_location=None):
    """Read what save() wrote. weights_only is accepted for torch compatibility; the format holds
    only data, so loading is always safe. Everything lives on the CPU, so map_location may only
    name the CPU (or be a dict/callable, which has nothing to remap)."""
    if (map_location is not None and not callable(map_location) and not isinstance(map_location, dict)
            and not str(map_location).startswith("cpu")):
        raise RuntimeError(f"Attempting to deserialize object on device {map_location!r}, but jitgrad only "
                           "supports the CPU.")
    name = os.fspath(f) if isinstance(f, (str, os.PathLike)) else getattr(f, "name", repr(f))
    if isinstance(f, (str, os.PathLike)):
        with open(f, "rb") as fh:  # outside the try: a missing file is FileNotFoundError, as in torch
            return _read(fh, name)
    return _read(f, name)


def _read(fh, name):
    # every way a damaged file can fail inside numpy/zipfile/json becomes one clear RuntimeError
    try:
        npz = np.load(fh, allow_pickle=False)
        if not isinstance(npz, np.lib.npyio.NpzFile):  # .npy content loads as a bare ndarray
            raise _Corrupt("not an .npz archive")
        with npz:
            if _META not in npz.files:
                raise _Corrupt("not a jitgrad checkpoint (no structure record)")
            meta = json.loads(str(npz[_META][()]))
            if not isinstance(meta, dict) or meta.get("format") != _FORMAT:
                raise _Corrupt(f"unsupported format {meta.get('format') if isinstance(meta, dict) else meta!r}")
            return _Decoder(npz).decode(meta["obj"])
    except _Corrupt as e:
        raise RuntimeError(f"Invalid jitgrad file {name!r}: {e}") from None
    except (zipfile.BadZipFile, zlib.error, ValueError, KeyError, IndexError, TypeError, EOFError, OSError,
            RecursionError) as e:
        raise RuntimeError(f"Invalid jitgrad file {name!r}: failed reading archive: {type(e).__name__}: {e}") from e


class _Corrupt(Exception):
    pass


class _Encoder:
    def __init__(self, arrays):
        self.arrays = arrays  # id(ndarray) -> ndarray (held, so ids stay unique); order = member index
        self.index = {}       # id(ndarray) -> member index
        self.tensors = {}     # id(Tensor) -> encoded form, so a tensor saved twice loads as one object
        self.active = set()   # containers being encoded, to reject cycles instead of recursing forever

    def _array_index(self, arr):
        if arr.dtype.hasobject:
            raise TypeError("jitgrad.save cannot store arrays of dtype object (that would need pickle)")
        # keyed by the array object: tensors sharing one storage (t and t.detach()) keep sharing it
        if id(arr) not in self.index:
            self.index[id(arr)] = len(self.arrays)
            self.arrays[id(arr)] = arr
        return self.index[id(arr)]

    def encode(self, obj):
        if isinstance(obj, np.generic):  # before the scalars: np.float64 is a float subclass
            return {"npscalar": self._array_index(np.asarray(obj))}
        if obj is None or isinstance(obj, (bool, int, float, str)):
            return obj if type(obj) in (bool, int, float, str, type(None)) else _plain(obj)
        if isinstance(obj, Tensor):
            if id(obj) not in self.tensors:
                from .nn.parameter import Parameter  # here: nn imports this package's modules
                self.tensors[id(obj)] = {"tensor": self._array_index(obj._array()), "ref": len(self.tensors),
                                         "requires_grad": bool(obj.requires_grad),
                                         "parameter": isinstance(obj, Parameter)}
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
    def __init__(self, npz):
        self.npz = npz
        self.arrays = {}   # member index -> ndarray, so shared storage stays shared
        self.tensors = {}  # "ref" -> Tensor, so a tensor saved twice loads as one object

    def _array(self, i):
        if not isinstance(i, int) or isinstance(i, bool) or f"a{i}" not in self.npz.files:
            raise _Corrupt(f"reference to missing array {i!r}")
        if i not in self.arrays:
            self.arrays[i] = self.npz[f"a{i}"]
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
                return self._array(x["npscalar"])[()]
        raise _Corrupt(f"unrecognised record {str(x)[:80]}")

    def _tensor(self, x):
        key = x.get("ref")
        if key not in self.tensors:
            arr = self._array(x["tensor"])
            if x.get("parameter"):
                from .nn.parameter import Parameter
                t = Parameter(arr, requires_grad=bool(x.get("requires_grad")))
            else:
                # a leaf, like torch.load's result; requires_grad is restored as torch restores it
                t = Tensor._make(arr)
                if x.get("requires_grad"):
                    t.requires_grad_(True)
            self.tensors[key] = t
        return self.tensors[key]
