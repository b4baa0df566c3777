"""DataLoader: batches of a dataset's samples, in a sampler's order, through a collate_fn.

Loading runs in the main process. num_workers > 0 is accepted for map-style datasets and
loads there too: torch's workers (in order, the default) hand back the same batches in
the same order, so only the speed differs. What depends on real worker processes is
refused rather than emulated: a worker_init_fn (it would run in, and change, the main
process), and an IterableDataset with workers (torch gives every worker a copy of the
stream).
"""
import math
import warnings

from jitgrad import cuda as _cuda
from jitgrad.graph.random import Generator
from jitgrad.graph.tensor import _rng
from jitgrad.utils.data.collate import default_collate, default_convert
from jitgrad.utils.data.dataset import IterableDataset
from jitgrad.utils.data.sampler import BatchSampler, RandomSampler, SequentialSampler

_FIXED_AFTER_INIT = ("batch_size", "batch_sampler", "sampler", "drop_last", "dataset", "persistent_workers")


def get_worker_info():
    """None: there are no worker processes (see the module doc)."""
    return None


class _InfiniteConstantSampler:
    """An IterableDataset's sampler: no index, forever (the dataset's own iterator decides)."""

    def __iter__(self):
        while True:
            yield None


class DataLoader:
    def __init__(self, dataset, batch_size=1, shuffle=None, sampler=None, batch_sampler=None, num_workers=0,
                 collate_fn=None, pin_memory=False, drop_last=False, timeout=0, worker_init_fn=None,
                 multiprocessing_context=None, generator=None, *, prefetch_factor=None, persistent_workers=False,
                 pin_memory_device="", in_order=True):
        if num_workers < 0:
            raise ValueError("num_workers option should be non-negative; use num_workers=0 to disable "
                             "multiprocessing.")
        if timeout < 0:
            raise ValueError("timeout option should be non-negative")
        if num_workers == 0 and prefetch_factor is not None:
            raise ValueError("prefetch_factor option could only be specified in multiprocessing.let num_workers > 0 "
                             "to enable multiprocessing, otherwise set prefetch_factor to None.")
        if persistent_workers and num_workers == 0:
            raise ValueError("persistent_workers option needs num_workers > 0")
        iterable = isinstance(dataset, IterableDataset)
        if num_workers > 0 and worker_init_fn is not None:
            raise NotImplementedError("jitgrad's DataLoader loads in the main process: worker_init_fn is not "
                                      "supported (use num_workers=0)")
        if num_workers > 0 and iterable:
            raise NotImplementedError("jitgrad's DataLoader loads in the main process: an IterableDataset with "
                                      "num_workers > 0 is not supported (use num_workers=0)")
        if iterable:
            if shuffle not in (False, None):
                raise ValueError(f"DataLoader with IterableDataset: expected unspecified shuffle option, but got "
                                 f"shuffle={shuffle}")
            if sampler is not None:
                raise ValueError(f"DataLoader with IterableDataset: expected unspecified sampler option, but got "
                                 f"sampler={sampler}")
            if batch_sampler is not None:
                raise ValueError(f"DataLoader with IterableDataset: expected unspecified batch_sampler option, but "
                                 f"got batch_sampler={batch_sampler}")
        shuffle = bool(shuffle)
        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError("batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, "
                                 "and drop_last")
            batch_size, drop_last = None, False
        elif batch_size is None and drop_last:
            raise ValueError("batch_size=None option disables auto-batching and is mutually exclusive with drop_last")
        if sampler is None:
            if iterable:
                sampler = _InfiniteConstantSampler()
            elif shuffle:
                sampler = RandomSampler(dataset, generator=generator)
            else:
                sampler = SequentialSampler(dataset)
        if batch_size is not None and batch_sampler is None:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)
        if pin_memory and not _cuda.is_available():
            warnings.warn("'pin_memory' argument is set as true but no accelerator is found, then device pinned "
                          "memory won't be used.", stacklevel=2)

        self.dataset = dataset
        self.num_workers = num_workers
        self.prefetch_factor = 2 if num_workers > 0 and prefetch_factor is None else prefetch_factor
        self.pin_memory = pin_memory
        self.pin_memory_device = pin_memory_device
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = multiprocessing_context
        self.in_order = in_order
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self.generator = generator
        self.collate_fn = collate_fn if collate_fn is not None else (
            default_collate if batch_sampler is not None else default_convert)
        self.persistent_workers = persistent_workers
        self._iterable = iterable
        self._len_reported = None  # len(self) of an IterableDataset, to warn when it yields more
        self._iterator = None      # the one iterator of persistent workers
        self._initialized = True

    def __setattr__(self, name, value):
        if getattr(self, "_initialized", False) and name in _FIXED_AFTER_INIT:
            raise ValueError(f"{name} attribute should not be set after {type(self).__name__} is initialized")
        super().__setattr__(name, value)

    @property
    def _auto_collation(self):
        return self.batch_sampler is not None

    @property
    def _index_sampler(self):
        return self.batch_sampler if self._auto_collation else self.sampler

    def __iter__(self):
        # torch keeps persistent workers' iterator across epochs and draws its base seed once:
        # later epochs' shuffles come from the generator without that draw in between
        if self.persistent_workers and self.num_workers > 0:
            if self._iterator is None:
                self._iterator = _LoaderIter(self)
            else:
                self._iterator._reset()
            return self._iterator
        return _LoaderIter(self)

    def __len__(self):
        if self._iterable:
            length = self._len_reported = len(self.dataset)
            if self.batch_size is not None:
                length = length // self.batch_size if self.drop_last else math.ceil(length / self.batch_size)
            return length
        return len(self._index_sampler)


class _LoaderIter:
    """One pass over a DataLoader."""

    def __init__(self, loader):
        self._loader = loader
        self._dataset = loader.dataset
        self._collate_fn = loader.collate_fn
        self._auto_collation = loader._auto_collation
        self._drop_last = loader.drop_last
        self._index_sampler = loader._index_sampler
        self._sampler_iter = iter(self._index_sampler)
        # torch draws the workers' base seed here, before the sampler's first draw: a
        # shuffle with a seeded generator visits torch's order only if this draw is made too
        gen = loader.generator
        self._base_seed = int((gen if isinstance(gen, Generator) else _rng[0]).integers(1, 0, 1 << 63)[0])
        self._dataset_iter = iter(self._dataset) if loader._iterable else None
        self._ended = False
        self._num_yielded = 0

    def __iter__(self):
        return self

    def __len__(self):
        return len(self._index_sampler)

    def _reset(self):
        self._sampler_iter = iter(self._index_sampler)
        self._num_yielded = 0

    def __next__(self):
        index = next(self._sampler_iter)
        data = self._fetch_iterable() if self._dataset_iter is not None else self._fetch_map(index)
        self._num_yielded += 1
        reported = self._loader._len_reported
        if self._dataset_iter is not None and reported is not None and self._num_yielded > reported:
            warnings.warn(f"Length of IterableDataset {self._dataset} was reported to be {reported}(when accessing "
                          f"len(dataloader)), but {self._num_yielded} samples have been fetched. ", stacklevel=2)
        return data

    def _fetch_map(self, index):
        if not self._auto_collation:
            return self._collate_fn(self._dataset[index])
        many = getattr(self._dataset, "__getitems__", None)
        data = many(index) if many else [self._dataset[i] for i in index]
        return self._collate_fn(data)

    def _fetch_iterable(self):
        if self._ended:
            raise StopIteration
        if not self._auto_collation:
            return self._collate_fn(next(self._dataset_iter))
        data = []
        for _ in range(self._loader.batch_size):
            try:
                data.append(next(self._dataset_iter))
            except StopIteration:
                self._ended = True
                break
        if not data or (self._drop_last and len(data) < self._loader.batch_size):
            raise StopIteration
        return self._collate_fn(data)
