"""DistributedDataParallel: one replica of a module per rank, each on its own part of the
batch; backward averages the gradients over the ranks (nn/parallel/reducer.py), so every
replica takes the same optimizer step and the replicas stay equal."""
import contextlib

import numpy as np

from jitgrad import distributed as dist
from jitgrad._core.modes import is_grad_enabled, no_grad
from jitgrad.nn.module import Module
from jitgrad.nn.parallel.reducer import FIRST_BUCKET_BYTES, Reducer
from jitgrad.ops import functional as F

_MB = 1024 * 1024


class DistributedDataParallel(Module):
    """PyTorch's DistributedDataParallel over jitgrad.distributed (MPI).

    At construction, checks that every rank has the same parameters (count and shapes),
    and copies rank 0's parameters and buffers to the others. Each forward (outside
    no_sync) first copies rank 0's buffers to the others (broadcast_buffers). During
    backward, gradients are averaged bucket by bucket (bucket_cap_mb each, in reverse
    parameter order), each all-reduce overlapping the rest of the backward; by the time
    backward() returns, every rank's .grad holds the average."""

    def __init__(self, module, device_ids=None, output_device=None, dim=0, broadcast_buffers=True,
                 process_group=None, bucket_cap_mb=None, find_unused_parameters=False, check_reduction=False,
                 gradient_as_bucket_view=False, static_graph=False):
        super().__init__()
        if device_ids is not None and len(device_ids) > 1:
            raise ValueError("device_ids can only be None or contain a single element.")
        params = [p for p in module.parameters() if p.requires_grad]
        if not params:
            raise RuntimeError("DistributedDataParallel is not needed when a module doesn't have any parameter "
                               "that requires a gradient.")
        self.module = module
        self.process_group = process_group
        self.broadcast_buffers = broadcast_buffers
        self.find_unused_parameters = find_unused_parameters
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.static_graph = static_graph
        self.require_backward_grad_sync = True
        self.rank = dist.get_rank(process_group)
        self.world_size = dist.get_world_size(process_group)
        _verify_same_parameters(process_group, self.rank, self.world_size, list(module.parameters()))
        self._sync_module_states()
        cap = 25 * _MB if bucket_cap_mb is None else int(bucket_cap_mb * _MB)
        # PyTorch keeps the first bucket small only when the cap is its default
        first = min(FIRST_BUCKET_BYTES, cap) if bucket_cap_mb is None else cap
        self.bucket_bytes_cap = cap
        object.__setattr__(self, "reducer", Reducer(params, cap, first, dist._comm(process_group), self.world_size,
                                                    gradient_as_bucket_view, find_unused_parameters))

    @property
    def bucket_cap_mb(self):
        return self.bucket_bytes_cap / _MB

    def _sync_module_states(self):
        """Rank 0's parameters and buffers, on every rank."""
        with no_grad():
            for t in (*self.module.parameters(), *self.module.buffers()):
                dist.broadcast(t, 0, group=self.process_group)

    def _sync_buffers(self):
        with no_grad():
            for b in self.module.buffers():
                dist.broadcast(b, 0, group=self.process_group)

    def forward(self, *inputs, **kwargs):
        self.reducer.check_finished(self.rank)
        sync = is_grad_enabled() and self.require_backward_grad_sync
        self.reducer.prepare(sync)
        if sync and self.broadcast_buffers:
            self._sync_buffers()
        return self.module(*inputs, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """Backward calls whose forward ran in this context accumulate gradients locally,
        without communication; the first backward after it averages the sum."""
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old

    def __del__(self):
        reducer = self.__dict__.get("reducer")
        if reducer is not None:
            reducer.remove()


def _verify_same_parameters(group, rank, world, params):
    """PyTorch's checks that every rank has the same model: the same number of parameters,
    each of the same shape. Every rank gathers every rank's shapes (bounded collectives,
    so a rank that never gets here is a timeout, not a hang), so all of them raise."""
    def gather(values):
        mine = F._wrap(np.asarray(values, np.int64))
        out = [F._wrap(np.zeros_like(mine._data)) for _ in range(world)]
        dist.all_gather(out, mine, group=group)
        return [o._data for o in out]

    counts = gather([len(params)])
    for other, (n,) in enumerate(counts):
        if n != len(params):
            raise RuntimeError(f"DDP expects same model across all ranks, but Rank {rank} has {len(params)} params, "
                               f"while rank {other} has inconsistent {n} params.")
    ndim = max((p.dim() for p in params), default=0)
    ndim = int(np.max(gather([ndim])))
    # each parameter as its rank count, then its sizes, padded to the largest rank count
    table = [[p.dim(), *p.shape, *[0] * (ndim - p.dim())] for p in params]
    for other, theirs in enumerate(gather(np.array(table, np.int64).reshape(-1))):
        theirs = theirs.reshape(len(params), ndim + 1)
        for i, p in enumerate(params):
            if not np.array_equal(theirs[i], table[i]):
                raise RuntimeError(f"[{rank}]: params[{i}] in this process with sizes {list(p.shape)} appears not to "
                                   f"match sizes of the same param in process {other}.")
