"""Data parallelism: DistributedDataParallel across processes (over jitgrad.distributed), and
DataParallel in one process."""
from jitgrad.nn.parallel.data_parallel import DataParallel
from jitgrad.nn.parallel.distributed import DistributedDataParallel

__all__ = ["DataParallel", "DistributedDataParallel"]
