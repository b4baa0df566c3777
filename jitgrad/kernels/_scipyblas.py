"""SciPy's cython_blas loaded without the scipy.linalg package: a sixth of a warm start.

Numba sets up its compiler the first time any compiled function runs, loaded from the
cache or not, and that imports numba.np.arraymath, which checks for a BLAS
(numba.np.linalg.ensure_blas: `import scipy.linalg.cython_blas`) whenever SciPy is
installed. The extension module itself loads in milliseconds, but importing it first runs
scipy.linalg's __init__, which pulls in SciPy's array-API layer, and that touches numpy's
lazy submodules (f2py, testing, ma): about 0.14 s of a 0.5 s warm start on a 2-core
machine, for nothing jitgrad uses.

install() makes numba's check call preload() first, which puts the extension module in
sys.modules under its own name, so that the import finds it there (an import of a dotted
name already in sys.modules does not run its parents' __init__). So `import jitgrad` itself
loads no SciPy BLAS; numba's first compile loads that one library, as it always did, and no
more. scipy.linalg still imports normally when someone uses it, and then gets the
`cython_blas` attribute the import system sets only for a submodule it loads itself.
Whatever does not look as expected (no SciPy, another layout, scipy.linalg already
imported, a failing load) leaves numba's and SciPy's behaviour as it was.
"""
import importlib.machinery
import importlib.util
import os
import sys
import threading

NAME = "scipy.linalg.cython_blas"
NUMBA_LINALG = "numba.np.linalg"


def install():
    """From now on numba's BLAS check (and whatever else calls ensure_blas) preloads first."""
    mod = sys.modules.get(NUMBA_LINALG)
    if mod is not None:
        _wrap_ensure_blas(mod)
    else:
        _AfterImport.add(NUMBA_LINALG, _wrap_ensure_blas)


def _wrap_ensure_blas(mod):
    original = getattr(mod, "ensure_blas", None)
    if original is None or getattr(original, "preloads", False):
        return

    def ensure_blas():
        preload()
        return original()
    ensure_blas.preloads = True
    ensure_blas.__doc__ = original.__doc__
    mod.ensure_blas = ensure_blas


_lock = threading.RLock()


def preload():
    """Load NAME alone, once; True if it is in sys.modules afterwards. Under a lock: the
    module is in sys.modules while it executes, and a second thread must not take it then
    (numba's compiles are serialised already; whatever else calls ensure_blas may not be)."""
    if NAME in sys.modules:
        with _lock:  # (it may still be executing in another thread: wait for that)
            return NAME in sys.modules
    with _lock:
        return NAME in sys.modules or _preload()


def _preload():
    if "scipy.linalg" in sys.modules:   # the package ran already: the ordinary import is cheap now
        return False
    try:
        scipy = importlib.util.find_spec("scipy")
    except (ImportError, ValueError):
        return False
    if scipy is None or not scipy.submodule_search_locations:
        return False
    path = _extension(scipy.submodule_search_locations)
    if path is None:
        return False
    spec = importlib.util.spec_from_file_location(NAME, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[NAME] = module
    try:
        spec.loader.exec_module(module)
    except Exception:
        del sys.modules[NAME]           # the ordinary import will say what is wrong, if anyone needs it
        return False
    _AfterImport.add("scipy.linalg", _set_attribute)
    return True


def _extension(locations):
    for base in locations:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = os.path.join(base, "linalg", "cython_blas" + suffix)
            if os.path.isfile(path):
                return path
    return None


def _set_attribute(package):
    if NAME in sys.modules and not hasattr(package, "cython_blas"):
        package.cython_blas = sys.modules[NAME]


class _AfterImport:
    """A meta-path finder that finds nothing itself: the first import of `name` runs with
    the module's own spec, whose loader then calls `then(module)` once the module has run;
    then the finder leaves sys.meta_path."""

    @classmethod
    def add(cls, name, then):
        sys.meta_path.insert(0, cls(name, then))

    def __init__(self, name, then):
        self.name, self.then = name, then

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name or self not in sys.meta_path:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run, then = spec.loader.exec_module, self.then

        def exec_module(module):
            run(module)
            then(module)
        spec.loader.exec_module = exec_module   # this module's loader object only
        return spec
