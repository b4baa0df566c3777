"""The one BLAS library jitgrad's matrix products run in, forward and backward.

numpy links a BLAS (its wheels bundle scipy-openblas, ILP64; distro and conda builds link
an LP64 OpenBLAS or MKL). The Numba kernels call that same library's cblas gemm
(kernels/blas.py), so that one thread pool serves both directions and set_num_threads has
one pool to set. Only ctypes here: finding the library costs no import time.

The library is found by probing the handle of numpy's extension module (dlsym on it
searches the libraries it links) for a short list of known symbol sets. JITGRAD_BLAS
chooses otherwise:
- "mkl": Intel's MKL from the `mkl` wheel (`pip install jitgrad[mkl]`), libmkl_rt; the
  forward products then go through the compiled gemm as well, since numpy still runs its
  own BLAS;
- "scipy": the BLAS wrapper Numba uses for np.dot (numba_xxgemm, SciPy's OpenBLAS), the
  fallback when numpy's library has none of the known symbols. Then two pools exist
  again, and set_num_threads sets both through threadpoolctl.
"""
import ctypes
import ctypes.util
import os
import sys
from typing import NamedTuple

import numpy as np


class Lib(NamedTuple):
    name: str            # the library, for BLAS_KEY and messages
    ilp64: bool          # 64-bit integer arguments
    dgemm: int           # cblas_dgemm's address (0: the scipy fallback)
    sgemm: int
    set_threads: object  # ctypes functions, or None where the library has no thread control
    get_threads: object
    numpy_own: bool      # the library numpy's own products run in

    @property
    def key(self):
        """What compiled code depends on: which library's symbols, and their integer width."""
        return f"{self.name}/{'ilp64' if self.ilp64 else 'lp64'}"


# name, ILP64, dgemm, sgemm, set threads, get threads; the first whose gemms all resolve wins
KNOWN = (
    ("scipy_openblas64", True, "scipy_cblas_dgemm64_", "scipy_cblas_sgemm64_",
     "scipy_openblas_set_num_threads64_", "scipy_openblas_get_num_threads64_"),
    ("scipy_openblas", False, "scipy_cblas_dgemm", "scipy_cblas_sgemm",
     "scipy_openblas_set_num_threads", "scipy_openblas_get_num_threads"),
    ("openblas64", True, "cblas_dgemm64_", "cblas_sgemm64_", "openblas_set_num_threads64_",
     "openblas_get_num_threads64_"),
    ("openblas", False, "cblas_dgemm", "cblas_sgemm", "openblas_set_num_threads", "openblas_get_num_threads"),
    ("mkl", False, "cblas_dgemm", "cblas_sgemm", "MKL_Set_Num_Threads", "MKL_Get_Max_Threads"),
    ("cblas", False, "cblas_dgemm", "cblas_sgemm", None, None),
)
# the mkl wheel's libmkl_rt (JITGRAD_BLAS=mkl): its explicit ILP64 entry points, which
# MKL_INTERFACE_LAYER does not redirect
MKL_RT = (("mkl_rt", True, "cblas_dgemm_64", "cblas_sgemm_64", "MKL_Set_Num_Threads", "MKL_Get_Max_Threads"),)
FALLBACK = Lib("scipy_numba_xxgemm", False, 0, 0, None, None, True)   # forward products stay numpy's


def _addr(handle, name):
    try:
        return ctypes.cast(getattr(handle, name), ctypes.c_void_p).value
    except AttributeError:
        return None


def probe(handle, known=KNOWN):
    """The first entry of `known` whose gemm and thread symbols `handle` exports, or None."""
    for name, ilp64, d, s, setn, getn in known:
        dg, sg = _addr(handle, d), _addr(handle, s)
        if not (dg and sg) or (setn and not (_addr(handle, setn) and _addr(handle, getn))):
            continue
        set_threads = get_threads = None
        if setn:
            set_threads = getattr(handle, setn)
            set_threads.argtypes, set_threads.restype = [ctypes.c_int], None
            get_threads = getattr(handle, getn)
            get_threads.argtypes, get_threads.restype = [], ctypes.c_int
        return Lib(name, ilp64, dg, sg, set_threads, get_threads, True)
    return None


def _mkl_handle():
    """libmkl_rt from the mkl wheel (in the environment's lib/), or wherever the loader finds it."""
    lib = os.path.join(sys.prefix, "lib")
    names = [os.path.join(lib, f"libmkl_rt.so.{v}") for v in (3, 2)] + ["libmkl_rt.so.3", "libmkl_rt.so.2",
                                                                         ctypes.util.find_library("mkl_rt")]
    for n in names:
        if n:
            try:
                return ctypes.CDLL(n)
            except OSError:
                pass
    return None


def select(choice=None):
    """The library for JITGRAD_BLAS's choice: numpy's (default), "mkl" or "scipy"."""
    choice = (os.environ.get("JITGRAD_BLAS", "") if choice is None else choice).strip().lower()
    if choice == "scipy":
        return FALLBACK
    if choice == "mkl":
        h = _mkl_handle()
        lib = h and probe(h, MKL_RT)
        if lib is None:
            raise ImportError("JITGRAD_BLAS=mkl, but libmkl_rt could not be loaded: pip install jitgrad[mkl]")
        return lib._replace(numpy_own=False)
    if choice not in ("", "numpy"):
        raise ImportError(f"JITGRAD_BLAS must be numpy, mkl or scipy, but got {choice!r}")
    return probe(ctypes.CDLL(np._core._multiarray_umath.__file__)) or FALLBACK


LIB = select()
BLAS_KEY = LIB.key
