"""Keeps a damaged or unwritable on-disk cache from making jitgrad unusable.

Two caches live on disk, and whatever reads them trusts them:
- the generated backward module (codegen.load) in codegen.cache_dir(). codegen checks
  its content against the source it generates and rewrites it (a truncated file would
  fail to import in every later process);
- Numba's cache=True files, an index (.nbi) and data files (.nbc) per function, in a
  __pycache__ next to the source, in Numba's user cache or in NUMBA_CACHE_DIR. Numba
  unpickles them unguarded, so one truncated file fails every later compile of its
  function; and where it finds no writable directory, @njit(cache=True) itself raises,
  at import.

install() runs once, from jitgrad/kernels/__init__.py, before any kernel module is
imported. For jitgrad's own functions only (other numba users in the process keep
numba's behaviour) it makes
- an unreadable cache entry a miss: the function compiles again and its index is
  rewritten, so the next process loads cleanly;
- a cache that cannot be written a no-op (the compiled code stays in memory);
- a temporary directory of this process the last place to cache in, after numba's own
  places; with no temporary directory either, the cache is in memory only.
The first of these that happens is reported by one warning per process (warn()).

Two more things change for jitgrad's functions:
- freshness. Numba keeps a cache entry while its own source file is unchanged, but a
  kernel's compiled code also holds the helpers it calls from other files (kernels/
  common.py...) and the layout constants, frozen in. So every jitgrad function's entry
  is also stamped with a digest of the jitgrad.kernels package and _core/layout.py
  (source_digest()): editing any of them makes every entry stale, and it recompiles;
- a cache miss says so (_core/verbosity.py): the one line a user sees before a compile.
"""
import atexit
import glob
import hashlib
import os
import re
import shutil
import tempfile
import threading
import warnings

from jitgrad._core import layout, verbosity


class CacheWarning(RuntimeWarning):
    """jitgrad's on-disk cache was damaged or unwritable; jitgrad worked around it."""


_lock = threading.Lock()
_warned = []
_tmp = []


def warn(msg):
    """Say `msg` once per process: the first cache problem is the one that explains the rest."""
    with _lock:
        if _warned:
            return
        _warned.append(msg)
    warnings.warn(f"jitgrad: {msg}", CacheWarning, stacklevel=3)


def temp_dir():
    """This process's fallback cache directory (removed at exit), or None if none can be made."""
    with _lock:
        if not _tmp:
            try:
                d = tempfile.mkdtemp(prefix="jitgrad-cache-")
                atexit.register(shutil.rmtree, d, True)
            except OSError:
                d = None
            _tmp.append(d)
        return _tmp[0]


def _ours(py_func):
    mod = getattr(py_func, "__module__", None) or ""
    return mod == "jitgrad" or mod.startswith(("jitgrad.", "jitgrad_backward_"))


_digest = []
_extra_keys = []


def source_digest():
    """A digest of what every jitgrad kernel's compiled code may hold: the source of the
    jitgrad.kernels package and _core/layout.py, and the keys added by add_key()."""
    with _lock:
        if not _digest:
            here = os.path.dirname(os.path.abspath(__file__))
            h = hashlib.sha256()
            for path in sorted(glob.glob(os.path.join(here, "*.py"))) + [os.path.abspath(layout.__file__)]:
                with open(path, "rb") as f:
                    h.update(f.read())
            for key in _extra_keys:
                h.update(key.encode())
            _digest.append(h.hexdigest()[:16])
        return _digest[0]


def add_key(key):
    """Mix `key` (a string naming something compiled code depends on but source does not
    show, e.g. which BLAS library it calls) into source_digest(). Call before any kernel
    is compiled or loaded."""
    with _lock:
        _extra_keys.append(key)
        _digest.clear()


def friendly_name(py_func):
    """What a compile of `py_func` is called on stderr: "kernels for <name>" (an
    elementwise backward kernel by its op), or "the backward engine" (the rest of the
    generated backward module)."""
    name = getattr(py_func, "__name__", "?")
    m = re.match(r"ew_\d+_(.*)$", name)
    if m:
        return f"kernels for {m.group(1)}"
    if (getattr(py_func, "__module__", None) or "").startswith("jitgrad_backward_"):
        return "the backward engine"
    return "kernels for " + re.sub(r"^(k_|_)+|_nb$", "", name)


def is_cached(dispatcher, sig):
    """Whether `dispatcher` has `sig` compiled already, or in its on-disk cache (so using
    it costs no compile)."""
    if tuple(sig) in dispatcher.overloads:
        return True
    cache = getattr(dispatcher, "_cache", None)
    try:
        return cache._index_key(tuple(sig), dispatcher.targetctx.codegen()) in cache.index()
    except Exception:  # noqa: BLE001  (no cache, or numba's internals moved: then it compiles)
        return False


def _guarded(base):
    """numba's FunctionCache, made to survive its own files for jitgrad's functions."""

    class GuardedFunctionCache(base):
        def __init__(self, py_func):
            super().__init__(py_func)
            if getattr(self._impl.locator, "in_memory", False):
                self.disable()  # no directory at all: numba compiles and keeps nothing
            self._numba_stamp = self._cache_file._source_stamp

        def _restamp(self):
            # at first use, not at decoration: add_key() may run after some kernels are defined
            self._cache_file._source_stamp = (self._numba_stamp, source_digest())

        def index(self):
            """The cache index of this function ({key: data file}), fresh entries only."""
            if _ours(self._py_func):
                self._restamp()
            return self._cache_file._load_index()

        def load_overload(self, sig, target_context):
            if not _ours(getattr(self, "_py_func", None)):
                return super().load_overload(sig, target_context)
            self._restamp()
            try:
                cres = super().load_overload(sig, target_context)
                if cres is None:  # a miss: numba compiles it now
                    verbosity.compiling([friendly_name(self._py_func)], "forward")
                return cres
            except Exception as e:  # noqa: BLE001  (a truncated or garbage .nbi/.nbc: unpickle fails in many ways)
                warn(f"the compiled-code cache of {self._name} in {self._cache_path} is damaged "
                     f"({type(e).__name__}: {e}); recompiling it and rewriting the cache")
                try:
                    self._cache_file.flush()  # an empty index, replaced atomically; the save refills it
                except Exception:  # noqa: BLE001
                    self.disable()
                return None  # a miss: numba compiles, then calls save_overload

        def save_overload(self, sig, data):
            if not _ours(getattr(self, "_py_func", None)):
                return super().save_overload(sig, data)
            self._restamp()
            try:
                super().save_overload(sig, data)
            except Exception as e:  # noqa: BLE001  (compiled already: any failure to store it is not fatal)
                warn(f"cannot write the compiled-code cache of {self._name} in {self._cache_path} "
                     f"({type(e).__name__}: {e}); it stays compiled in memory for this process only")
                self.disable()

    return GuardedFunctionCache


def _fallback_locator(caching):
    """A last-resort cache locator for jitgrad's functions: this process's temporary directory."""
    base = getattr(caching, "UserProvidedCacheLocator", None) or caching._UserProvidedCacheLocator

    class TempDirLocator(base):
        in_memory = False

        def __init__(self, py_func, py_file):
            self._py_file = py_file
            self._lineno = py_func.__code__.co_firstlineno
            d = temp_dir()
            # no directory, or a module run from its source string (codegen, when nothing is writable)
            self.in_memory = d is None or not os.path.exists(py_file)
            self._cache_path = os.path.join(d or "", self.get_suitable_cache_subpath(py_file))

        def get_cache_path(self):
            return self._cache_path

        def get_source_stamp(self):
            return None if self.in_memory else super().get_source_stamp()

        def ensure_cache_path(self):
            if not self.in_memory:
                super().ensure_cache_path()

        @classmethod
        def from_function(cls, py_func, py_file):
            if not _ours(py_func):
                return None
            self = cls(py_func, py_file)
            try:
                self.ensure_cache_path()
            except OSError:
                self.in_memory = True
            where = "memory" if self.in_memory else self._cache_path
            warn(f"no writable directory for the compiled-code cache of {py_file} (its __pycache__, "
                 f"numba's user cache, NUMBA_CACHE_DIR); caching in {where} for this process only. "
                 "Set NUMBA_CACHE_DIR to a writable directory to keep compiled code between runs")
            return self

    return TempDirLocator


_installed = []


def install():
    """Hook the two places above into numba, once (see the module docstring)."""
    if _installed:
        return
    _installed.append(True)
    from numba.core import caching, dispatcher

    impl = getattr(caching, "CacheImpl", None) or caching._CacheImpl
    impl._locator_classes = [*impl._locator_classes, _fallback_locator(caching)]
    dispatcher.FunctionCache = _guarded(dispatcher.FunctionCache)
