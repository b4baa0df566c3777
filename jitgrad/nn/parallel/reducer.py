"""The gradient reducer of DistributedDataParallel: buckets of parameters, each averaged
over the ranks by one non-blocking all-reduce that starts as soon as the bucket's last
gradient is accumulated, while the backward goes on.

How a gradient gets here: each bucket is a LeafGroup (graph/hooks.py). The compiled sweep
counts a group's pending gradients as one and hands back to Python once per bucket, when
the last of them is accumulated (engine/compiled.py, _accumulate_ready); `ready` then
copies the bucket's .grads into its flat buffer and starts MPI's Iallreduce on it. No
Python runs for a parameter that does not end a bucket. The first bucket that becomes
ready queues `finish` to run when the backward call ends: it waits for the all-reduces in
order, divides by the world size and writes the averages back into .grad.

All ranks must start the same all-reduces in the same order (MPI matches collectives by
order), so bucket i starts only after bucket i - 1 has, as in PyTorch's reducer: a bucket
that becomes ready early waits for the ones before it.
"""
import numpy as np

from jitgrad.distributed import Work
from jitgrad.engine.run import queue_callback
from jitgrad.graph.hooks import LeafGroup
from jitgrad.ops import functional as F

# PyTorch's dist._DEFAULT_FIRST_BUCKET_BYTES: the first bucket (the last layers' gradients,
# ready first) is small so that communication starts early
FIRST_BUCKET_BYTES = 1024 * 1024


def assign_buckets(params, cap_bytes, first_cap_bytes):
    """Parameter indices per bucket: in reverse order of `params` (the order backward
    makes gradients ready in, roughly), one dtype per bucket, a bucket closed once it
    holds at least its cap (the first bucket's cap is first_cap_bytes)."""
    buckets, current, size, dtype = [], [], 0, None
    for i in reversed(range(len(params))):
        p = params[i]
        if current and p.dtype != dtype:
            buckets.append(current)
            current, size = [], 0
        current.append(i)
        dtype = p.dtype
        size += p.numel() * p.element_size()
        if size >= (first_cap_bytes if not buckets else cap_bytes):
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


class Bucket:
    """Some parameters' gradients in one flat buffer, and the state of this iteration's
    all-reduce of it."""

    def __init__(self, index, params, ids):
        self.index = index
        self.params = params
        self.ids = ids  # each parameter's index in the module's parameter list
        sizes = [p.numel() for p in params]
        self.offsets = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
        self.buffer = np.zeros(int(self.offsets[-1]), params[0]._data.dtype)
        self.slot = {id(p): k for k, p in enumerate(params)}
        self.group = None
        self.reset()

    def reset(self):
        self.seen = np.zeros(len(self.params), bool)
        self.pending = len(self.params)
        self.work = None

    def view(self, k):
        """Parameter k's part of the buffer, at its shape."""
        return self.buffer[self.offsets[k]:self.offsets[k + 1]].reshape(self.params[k]._data.shape)

    def pack(self):
        """Copy the .grads into the buffer: zeros for a parameter without one; nothing
        for one whose .grad already is its part of the buffer (gradient_as_bucket_view)."""
        for k, p in enumerate(self.params):
            g = p._grad
            part = self.buffer[self.offsets[k]:self.offsets[k + 1]]
            if g is None:
                part[...] = 0
            elif not np.may_share_memory(g._data, part):
                np.copyto(part, g._data.reshape(-1))

    def unpack(self, world, as_view, skip=()):
        """Average into the .grads (one pass over each: divide straight into .grad), or,
        as_view, make them views of the averaged buffer."""
        if as_view:
            self.buffer /= world
        for k, p in enumerate(self.params):
            if self.ids[k] in skip:
                continue
            view = self.view(k)
            g = p._grad
            if as_view:
                if g is None or not np.may_share_memory(g._data, view):
                    p._grad = F._wrap(view)
            elif g is None:
                p._grad = F._wrap(view / world)
            else:
                np.divide(view, world, out=g._data)


class Reducer:
    """Buckets, and what one backward has done with them (see the module doc)."""

    def __init__(self, params, cap_bytes, first_cap_bytes, comm, world, as_view, find_unused):
        self.params = params
        self.comm, self.world, self.as_view = comm, world, as_view
        self.find_unused = find_unused
        self.buckets = []
        for ids in assign_buckets(params, cap_bytes, first_cap_bytes):
            b = Bucket(len(self.buckets), [params[i] for i in ids], ids)
            b.group = LeafGroup(b.params, self._ready_fn(b))
            self.buckets.append(b)
        self.unfinished = None  # parameters without gradient when the last backward ended
        self.prepare(True)

    def _ready_fn(self, bucket):
        return lambda tensors: self.ready(bucket, tensors)

    def prepare(self, sync):
        """Before a forward: a new iteration; `sync` False (no_sync) turns reduction off."""
        for b in self.buckets:
            b.reset()
            b.group.active = sync
        self.next = 0
        self.queued = False

    def ready(self, bucket, tensors):
        """The engine accumulated these members of `bucket`."""
        if not self.queued:
            queue_callback(self.finish)
            self.queued = True
        for t in tensors:
            k = bucket.slot[id(t)]
            if bucket.seen[k]:
                raise RuntimeError(
                    "Expected to mark a variable ready only once. This error is caused by one of the following "
                    "reasons: 1) Use of a module parameter outside the `forward` function, or 2) reused parameters "
                    f"in multiple reentrant backward passes. Parameter index {bucket.ids[k]} was marked ready twice.")
            bucket.seen[k] = True
            bucket.pending -= 1
        self._start_in_order()

    def _start_in_order(self):
        # MPICH moves a non-blocking all-reduce on only inside MPI calls: test the ones
        # started before, so that they progress at every hand-back, not all at the end
        for b in self.buckets[:self.next]:
            b.work.is_completed()
        while self.next < len(self.buckets) and self.buckets[self.next].pending == 0:
            self._start(self.buckets[self.next])
            self.next += 1

    def _start(self, b):
        from mpi4py import MPI  # optional dependency: present once a process group exists

        b.pack()
        b.work = Work.from_requests([self.comm.Iallreduce(MPI.IN_PLACE, b.buffer, op=MPI.SUM)],
                                    name="DistributedDataParallel's gradient all_reduce")

    def finish(self):
        """The backward call has ended: finish the reduction (see the module doc)."""
        from mpi4py import MPI

        missing = [b.ids[k] for b in self.buckets for k in np.flatnonzero(~b.seen)]
        unused = ()
        if self.find_unused:
            # parameters this rank did not use: their bucket slots are zeros (or what
            # no_sync accumulated in .grad). Every rank takes this path, so the buckets
            # start in the same order everywhere; a parameter no rank used keeps its .grad
            for b in self.buckets:
                b.pending = 0
            self._start_in_order()
            used = np.array([p._grad is not None for p in self.params], np.int32)
            Work.from_requests([self.comm.Iallreduce(MPI.IN_PLACE, used, op=MPI.SUM)],
                               name="DistributedDataParallel's unused-parameter all_reduce").wait()
            unused = set(np.flatnonzero(used == 0).tolist())
        for b in self.buckets[:self.next]:
            b.work.wait()
            b.unpack(self.world, self.as_view, unused)
        if missing and not self.find_unused:
            self.unfinished = missing

    def check_finished(self, rank):
        """Before a forward: PyTorch's error when the last backward left parameters without
        gradient (so their buckets were never reduced)."""
        if self.unfinished is None:
            return
        missing, self.unfinished = self.unfinished, None
        raise RuntimeError(
            "Expected to have finished reduction in the prior iteration before starting a new one. This error "
            "indicates that your module has parameters that were not used in producing loss. You can enable unused "
            "parameter detection by passing the keyword argument `find_unused_parameters=True` to "
            "`torch.nn.parallel.DistributedDataParallel`, and by making sure all `forward` function outputs "
            "participate in calculating loss.\n"
            f"Parameter indices which did not receive grad for rank {rank}: {' '.join(map(str, sorted(missing)))}")

    def remove(self):
        for b in self.buckets:
            b.group.remove()

