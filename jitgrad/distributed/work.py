"""Work: the handle of a pending operation (torch.distributed's Work), returned by the
collectives with async_op=True and by isend/irecv.

It wraps mpi4py Requests. wait() completes them, bounded by the process group's timeout
(or the one given), then runs the operation's finishing step once (AVG's division, the
copy back into a non-contiguous tensor, an all_gather's copy out). DistributedDataParallel
builds its own: Work.from_requests([comm.Iallreduce(MPI.IN_PLACE, bucket, op=MPI.SUM)],
on_done=...) on the communicator jitgrad.distributed._comm() gives.

MPI moves a nonblocking operation forward only inside MPI calls: between them, a started
all-reduce waits. is_completed() is such a call (one Testall, about a microsecond), so
calling it on pending Works now and then during other work overlaps the communication with
it. Measured on 2 ranks here: a 4 MB all-reduce started before 30 ms of matrix products
still had 0.8 ms (its whole time) to go at wait(); with is_completed() between the
products, none. (MPICH's progress thread, MPIR_CVAR_ASYNC_PROGRESS=1, overlaps without
the calls but takes a core: a lone all-reduce took 2 to 250 times longer, 64 KB 8 ms
instead of 0.03.)

A timeout raises DistBackendError and breaks the process group (see ProcessGroup): the
Work, with the buffers MPI may still write, is kept alive by the group from then on.
"""
from jitgrad.distributed._backend import DistBackendError, mpi
from jitgrad.distributed._wait import wait_all
from jitgrad.distributed.process_group import default_group, seconds


class Work:
    """requests: the mpi4py Requests to complete; on_done(): run once after they complete;
    timeout: a timedelta or seconds (None: the group's); name: the operation, for messages;
    keep: objects (buffers) that must live until the requests complete; statuses: fill an
    MPI.Status per request (a receive from any source reads its sender there)."""

    def __init__(self, requests, on_done=None, timeout=None, *, name="collective", group=None, keep=(),
                 statuses=False):
        self._group = default_group(group)
        self._group.check_usable()
        self._requests = list(requests)
        self._on_done = on_done
        self._timeout = self._group.timeout if timeout is None else seconds(timeout)
        self._name = name
        self._keep = keep
        MPI = mpi()
        self._statuses = [MPI.Status() for _ in self._requests] if statuses else None
        self._done = False

    @classmethod
    def from_requests(cls, requests, on_done=None, timeout=None, name="collective"):
        """A Work over requests started on jitgrad.distributed._comm()."""
        return cls(requests, on_done, timeout, name=name)

    def is_completed(self):
        """Whether the operation finished (its result is then in place); never blocks."""
        if not self._done and mpi().Request.Testall(self._requests, self._statuses):
            self._finish()
        return self._done

    def wait(self, timeout=None):
        """Block until the operation finished; True. timeout (a timedelta or seconds)
        replaces the group's for this wait."""
        if self._done:
            return True
        limit = self._timeout if timeout is None else seconds(timeout)
        if not wait_all(mpi(), self._requests, self._statuses, limit):
            pg = self._group
            pg.broken = (f"{self._name} timed out after {limit:g} s (some rank did not join it, or is stuck); "
                         "destroy the process group and end the job")
            pg.abandoned.append(self)
            raise DistBackendError(f"[Rank {pg.rank()}] {self._name} timed out after {limit:g} s waiting for the "
                                   f"other ranks (world size {pg.size()}): some rank did not join it, or is stuck; "
                                   "the process group can no longer be used")
        self._finish()
        return True

    def source_rank(self):
        """The sender of a receive (after waiting for it)."""
        if self._statuses is None:
            raise RuntimeError(f"source_rank() is the sender of a receive; this Work is a {self._name}")
        self.wait()
        return self._statuses[0].Get_source()

    def _finish(self):
        self._done = True
        self._keep = ()
        on_done, self._on_done = self._on_done, None
        if on_done is not None:
            on_done()

    def __repr__(self):
        return f"<jitgrad.distributed.Work {self._name} {'completed' if self._done else 'pending'}>"
