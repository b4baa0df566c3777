"""SciPy's cython_blas loaded without the scipy.linalg package: a sixth of a warm start.

Numba sets up its compiler the first time any compiled function runs, loaded from the
cache or not, and that imports numba.np.arraymath, which checks for a BLAS with
`import scipy.linalg.cython_blas` whenever SciPy is installed. The extension module itself
loads in milliseconds, but importing it first runs scipy.linalg's __init__, which pulls in
SciPy's array-API layer, and that touches numpy's lazy submodules (f2py, testing, ma):
about 0.14 s of a 0.5 s warm start on a 2-core machine, for nothing jitgrad uses.

preload() puts the extension module in sys.modules under its own name, so that those
imports find it there (an import of a dotted name already in sys.modules does not run
its parents' __init__). scipy.linalg itself still imports normally when someone uses it;
a one-shot finder then sets its `cython_blas` attribute, which the import system sets only
for a submodule it loads itself. Whatever does not look as expected (no SciPy, another
layout, scipy.linalg already imported, a failing load) leaves everything as it was.
"""
import importlib.machinery
import importlib.util
import os
import sys

NAME = "scipy.linalg.cython_blas"


def preload():
    """Load NAME alone, once; True if it is in sys.modules afterwards."""
    if NAME in sys.modules:
        return True
    if "scipy.linalg" in sys.modules:   # the package ran already: the next import is cheap anyway
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
    sys.meta_path.insert(0, _SetAttribute())
    return True


def _extension(locations):
    for base in locations:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = os.path.join(base, "linalg", "cython_blas" + suffix)
            if os.path.isfile(path):
                return path
    return None


class _SetAttribute:
    """A meta-path finder that finds nothing: when scipy.linalg is first imported it wraps
    the package's own loader so that, once the package has run, the package has the
    attribute a normal import of the extension would have given it; then it leaves."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "scipy.linalg" or self not in sys.meta_path:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            if NAME in sys.modules and not hasattr(module, "cython_blas"):
                module.cython_blas = sys.modules[NAME]
        spec.loader.exec_module = exec_module   # this package's loader object only
        return spec
