"""Version counters: how many in-place writes a tensor's storage has had.

PyTorch keeps the counter on the storage, shared by a tensor and its views. Here the
storage is the base numpy array, so the counter is kept per base array (views reach it
through .base). Saved values record the version they had; backward compares. A global
generation counts every in-place write, so a tape checks its saved values only when some
write happened after it started recording.
"""
import weakref

import numpy as np

_versions = {}       # id(base array) -> [weakref to it, version]
generation = [0]     # in-place writes so far, in any storage
_ndarray = np.ndarray


def base_of(arr):
    while isinstance(arr, np.ndarray) and isinstance(arr.base, np.ndarray):
        arr = arr.base
    return getattr(arr, "buf", arr)  # a CUDA array's storage is its device buffer (gpu/array.py)


def version(arr):
    # most arrays are not views; a device buffer (a CUDA array's base) has no .base of its own
    base = arr if getattr(arr, "base", None) is None else base_of(arr)
    e = _versions.get(id(base))
    return e[1] if e is not None and e[0]() is base else 0


def bump(arr):
    base = arr if type(arr) is _ndarray and arr.base is None else base_of(arr)  # most written arrays own their data
    key = id(base)
    e = _versions.get(key)
    if e is None or e[0]() is not base:
        e = _versions[key] = [weakref.ref(base, lambda _r, k=key: _versions.pop(k, None)), 0]
    e[1] += 1
    generation[0] += 1


def stamp(arr):
    """What a saved value remembers: its storage (weakly) and the version it had."""
    base = arr if arr.base is None else base_of(arr)  # most saved arrays are not views
    if not isinstance(base, np.ndarray) and base is arr:  # a numpy scalar (a CUDA array's base is its buffer)
        return None, version(base)
    e = _versions.get(id(base))  # version(base), without finding the base again (once per saved array)
    return weakref.ref(base), (e[1] if e is not None and e[0]() is base else 0)


def changed(stamp_):
    ref, ver = stamp_
    if ref is None:
        return None
    base = ref()
    if base is None:
        return None
    now = version(base)
    return now if now != ver else None


def of_base(base):
    """The version of storage `base` (base_of's result)."""
    e = _versions.get(id(base))
    return e[1] if e is not None and e[0]() is base else 0
