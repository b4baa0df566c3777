"""DistributedSampler: each of num_replicas processes visits its own share of a map-style
dataset, as torch.utils.data.distributed.DistributedSampler does. The shuffle is randperm
with a Generator seeded seed + epoch (the same on every rank, so the shares are disjoint),
and a seeded jitgrad.Generator draws torch's permutation: the same seed gives each rank
the same indices as under PyTorch."""
import math

from jitgrad import distributed as dist
from jitgrad.graph.random import Generator, randperm
from jitgrad.utils.data.sampler import Sampler


class DistributedSampler(Sampler):
    """Rank `rank`'s indices: indices[rank:total_size:num_replicas] of the (shuffled) index
    list, padded by repeating its head to a multiple of num_replicas, or with the tail
    dropped when drop_last. num_replicas and rank default to the process group's."""

    def __init__(self, dataset, num_replicas=None, rank=None, shuffle=True, seed=0, drop_last=False):
        if num_replicas is None:
            if not dist.is_available():
                raise RuntimeError("Requires distributed package to be available")
            num_replicas = dist.get_world_size()
        if rank is None:
            if not dist.is_available():
                raise RuntimeError("Requires distributed package to be available")
            rank = dist.get_rank()
        if rank >= num_replicas or rank < 0:
            raise ValueError(f"Invalid rank {rank}, rank should be in the interval [0, {num_replicas - 1}]")
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = rank
        self.epoch = 0
        self.drop_last = drop_last
        if drop_last and len(dataset) % num_replicas != 0:
            # the largest length that splits evenly (torch's expression, kept for its rounding)
            self.num_samples = math.ceil((len(dataset) - num_replicas) / num_replicas)
        else:
            self.num_samples = math.ceil(len(dataset) / num_replicas)
        self.total_size = self.num_samples * num_replicas
        self.shuffle = shuffle
        self.seed = seed

    def __iter__(self):
        n = len(self.dataset)
        if self.shuffle:
            indices = randperm(n, generator=Generator().manual_seed(self.seed + self.epoch)).tolist()
        else:
            indices = list(range(n))
        if not self.drop_last:
            padding = self.total_size - len(indices)
            # repeat the whole list as often as needed (a dataset smaller than num_replicas)
            indices += (indices * math.ceil(padding / len(indices)))[:padding] if padding > 0 else []
        else:
            indices = indices[:self.total_size]
        return iter(indices[self.rank:self.total_size:self.num_replicas])

    def __len__(self):
        return self.num_samples

    def set_epoch(self, epoch):
        """The shuffle of the next pass: call it at each epoch's start, before iterating,
        with the same epoch on every rank, or every epoch repeats the same order."""
        self.epoch = epoch
