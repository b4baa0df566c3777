"""The gradient reducer of DistributedDataParallel: buckets of parameters, each averaged
over the ranks by non-blocking all-reduces that start as soon as the bucket's last
gradient is accumulated, while the backward goes on.

How a gradient gets here: each bucket is a LeafGroup (graph/hooks.py). The compiled sweep
counts a group's pending gradients as one and hands back to Python once per bucket, when
the last of them is accumulated (engine/compiled.py, _accumulate_ready); `ready` then
starts MPI's Iallreduce on the bucket: large gradients in place in their .grad, small
ones packed into one flat buffer (Bucket). No Python runs for a parameter that does not
end a bucket. The first bucket that becomes ready queues `finish` to run when the
backward call ends: it waits for the all-reduces in order and divides by the world size
into .grad.

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


# A gradient at least this large is all-reduced where it lies, in its own .grad: copying
# it into a bucket buffer and back costs two passes over it (on 2 ranks sharing 2 cores,
# about 0.55 ms of the MNIST MLP's 9 ms step). Smaller ones share one all-reduce, of
# their bucket's buffer, so a model of many small tensors does not pay an MPI call each.
DIRECT_BYTES = 64 * 1024


class Bucket:
    """Some parameters whose gradients are all-reduced together once the last of them is
    ready: the small ones packed in a flat buffer, the others each in its own .grad (with
    gradient_as_bucket_view, all of them in the buffer, and .grad a view of it)."""

    def __init__(self, index, params, ids, as_view):
        self.index = index
        self.params = params
        self.ids = ids  # each parameter's index in the module's parameter list
        self.slot = {id(p): k for k, p in enumerate(params)}
        self.dtype = params[0]._data.dtype
        self.direct = [k for k, p in enumerate(params)
                       if not as_view and p.numel() * self.dtype.itemsize >= DIRECT_BYTES]
        self.packed = [k for k in range(len(params)) if k not in self.direct]
        self.offsets = {}
        at = 0
        for k in self.packed:
            self.offsets[k] = (at, at + params[k].numel())
            at += params[k].numel()
        self.buffer = np.zeros(at, self.dtype)
        self.nbytes = sum(p.numel() for p in params) * self.dtype.itemsize
        self.group = None
        self.reset()

    def reset(self):
        self.seen = np.zeros(len(self.params), bool)
        self.pending = len(self.params)
        self.work = None
        self.arrays = None  # per direct parameter, the array its all-reduce runs in

    def view(self, k):
        """Packed parameter k's part of the buffer, at its shape."""
        lo, hi = self.offsets[k]
        return self.buffer[lo:hi].reshape(self.params[k]._data.shape)

    def start(self, comm, MPI):
        """Start the all-reduces (the buffer's, then one per direct parameter): the same
        calls in the same order on every rank, wherever each rank's gradient lies."""
        requests = []
        if self.packed:
            self._pack()
            requests.append(comm.Iallreduce(MPI.IN_PLACE, self.buffer, op=MPI.SUM))
        self.arrays = []
        for k in self.direct:
            g = self.params[k]._grad
            if g is None:  # a parameter this rank did not use (find_unused_parameters)
                a = np.zeros(self.params[k]._data.shape, self.dtype)
            elif g._data.dtype == self.dtype and g._data.flags.c_contiguous:
                a = g._data
            else:
                a = np.ascontiguousarray(g._data, self.dtype)
            self.arrays.append(a)
            requests.append(comm.Iallreduce(MPI.IN_PLACE, a, op=MPI.SUM))
        return requests

    def _pack(self):
        """Copy the packed parameters' .grads into the buffer: zeros for one without; nothing
        for one whose .grad already is its part of the buffer (gradient_as_bucket_view)."""
        for k in self.packed:
            g = self.params[k]._grad
            part = self.view(k)
            if g is None:
                part[...] = 0
            elif not np.may_share_memory(g._data, part):
                np.copyto(part, g._data)

    def unpack(self, world, as_view, skip=()):
        """The sums are in: average into the .grads (one pass over each), or, as_view,
        make them views of the averaged buffer. Parameters in `skip` (no rank used them)
        keep their .grad."""
        if as_view:
            self.buffer /= world
        for k in self.packed:
            if self.ids[k] in skip:
                continue
            view = self.view(k)
            p = self.params[k]
            g = p._grad
            if as_view:
                if g is None or not np.may_share_memory(g._data, view):
                    p._grad = F._wrap(view)
            elif g is None:
                p._grad = F._wrap(view / world)
            else:
                np.divide(view, world, out=g._data)
        for k, a in zip(self.direct, self.arrays):
            if self.ids[k] in skip:
                continue
            p = self.params[k]
            g = p._grad
            if g is None:
                p._grad = F._wrap(np.divide(a, world, out=a))
            else:
                np.divide(a, world, out=g._data)


class Reducer:
    """Buckets, and what one backward has done with them (see the module doc)."""

    def __init__(self, params, cap_bytes, first_cap_bytes, comm, world, as_view, find_unused):
        self.params = params
        self.comm, self.world, self.as_view = comm, world, as_view
        self.find_unused = find_unused
        self.buckets = []
        for ids in assign_buckets(params, cap_bytes, first_cap_bytes):
            b = Bucket(len(self.buckets), [params[i] for i in ids], ids, as_view)
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

        b.work = Work.from_requests(b.start(self.comm, MPI), name="DistributedDataParallel's gradient all_reduce")

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

