"""The transport: mpi4py, imported on first use (it is optional: `import jitgrad.distributed`
works without it), PyTorch's errors for distributed work, and the mapping from ReduceOp to
MPI's reduction operations."""
import enum

import numpy as np

from jitgrad._core.messages import scalar_name

MISSING = ('Distributed package doesn\'t have MPI built in: jitgrad.distributed runs over MPI through mpi4py. '
           'Install both with pip install "jitgrad[distributed]" (mpi4py and mpich), then launch with '
           '`mpiexec -n N python ...`.')


class DistError(RuntimeError):
    """torch.distributed.DistError: an error of the distributed package."""


class DistBackendError(DistError):
    """torch.distributed.DistBackendError: the transport failed (here: a collective timed out)."""


_MPI = []  # the module, once imported (a function-level import costs a microsecond per call)


def mpi():
    """mpi4py.MPI; importing it initializes MPI (with mpiexec's ranks, or a 1-rank singleton)."""
    if _MPI:
        return _MPI[0]
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise RuntimeError(MISSING) from e
    _MPI.append(MPI)
    return MPI


def is_mpi_available():
    """Whether mpi4py can be imported (without initializing MPI: only the package is loaded)."""
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return False
    return True


class RedOpType(enum.IntEnum):
    SUM = 0
    AVG = 1
    PRODUCT = 2
    MIN = 3
    MAX = 4
    BAND = 5
    BOR = 6
    BXOR = 7


class ReduceOp:
    """torch.distributed.ReduceOp: ReduceOp.SUM is a RedOpType, as in PyTorch."""
    RedOpType = RedOpType
    SUM = RedOpType.SUM
    AVG = RedOpType.AVG
    PRODUCT = RedOpType.PRODUCT
    MIN = RedOpType.MIN
    MAX = RedOpType.MAX
    BAND = RedOpType.BAND
    BOR = RedOpType.BOR
    BXOR = RedOpType.BXOR


# MPI defines SUM and PROD on integers and floats only; PyTorch reduces bool tensors as
# logical or (SUM, MAX) and logical and (PRODUCT, MIN), which MPI has for C's bool
_BOOL = {RedOpType.SUM: "LOR", RedOpType.MAX: "LOR", RedOpType.PRODUCT: "LAND", RedOpType.MIN: "LAND",
         RedOpType.BAND: "LAND", RedOpType.BOR: "LOR", RedOpType.BXOR: "LXOR"}
_NAMES = {RedOpType.SUM: "SUM", RedOpType.AVG: "SUM", RedOpType.PRODUCT: "PROD", RedOpType.MIN: "MIN",
          RedOpType.MAX: "MAX", RedOpType.BAND: "BAND", RedOpType.BOR: "BOR", RedOpType.BXOR: "BXOR"}


_REDUCTIONS = {}  # (op, dtype) -> reduction(op, dtype), for those allowed


def reduction(op, dtype):
    """(MPI op, divide by the world size after?) for reducing arrays of `dtype` with `op`;
    PyTorch's errors for the combinations it refuses. Checked before any rank sends, so
    every rank raises the same error instead of leaving the others waiting."""
    if not isinstance(op, RedOpType):
        raise TypeError(f"all_reduce: op must be a torch.distributed.ReduceOp, got {op!r}")
    found = _REDUCTIONS.get((op, dtype))
    if found is not None:
        return found
    dtype = np.dtype(dtype)
    if op == RedOpType.AVG and dtype.kind != "f":
        # PyTorch computes the mean in floating point and cannot write it back
        raise RuntimeError(f"result type Float can't be cast to the desired output type {scalar_name(dtype)}")
    if op in (RedOpType.BAND, RedOpType.BOR, RedOpType.BXOR) and dtype.kind == "f":
        raise RuntimeError(f"Cannot use ReduceOp.{op.name} with non-integral dtype")
    name = _BOOL[op] if dtype.kind == "b" else _NAMES[op]
    found = _REDUCTIONS[op, dtype] = (getattr(mpi(), name), op == RedOpType.AVG)
    return found
