"""Data parallelism across processes: DistributedDataParallel (over jitgrad.distributed)."""
from jitgrad.nn.parallel.distributed import DistributedDataParallel

__all__ = ["DistributedDataParallel"]
