"""The default process group: MPI's world, joined by init_process_group.

MPI assigns the ranks (mpiexec starts the processes and does the rendezvous), so, as with
PyTorch's mpi backend, init_method and store are not needed (nor MASTER_ADDR and
MASTER_PORT, where env:// finds its store: ignored). What a launcher put in the
environment (env://: RANK, WORLD_SIZE) and explicit rank/world_size arguments must agree
with MPI: a disagreement means the job was not launched the way the script assumes, and is
an error rather than a warning. The group communicates on a duplicate of MPI.COMM_WORLD, so
that the user's own mpi4py messages never match its collectives.

An unhandled exception aborts the whole MPI job (MPI.COMM_WORLD.Abort, as `python -m mpi4py`
does): without it, the other ranks would wait in their next collective for a rank that is
gone. The hook that does it is installed by init_process_group, and already when this
module is imported in a process that mpiexec started: a rank that fails before
init_process_group would otherwise leave the others in MPI's initialization, which no
timeout bounds. It stays installed for the life of the process.
"""
import datetime
import os
import sys
import time

from jitgrad.distributed._backend import DistBackendError, mpi
from jitgrad.distributed._wait import wait_all
from jitgrad.distributed.threads import share_cores

NOT_INITIALIZED = "Default process group has not been initialized, please make sure to call init_process_group."
DEFAULT_TIMEOUT = datetime.timedelta(minutes=30)  # PyTorch's default_pg_timeout
ABORT_FLUSH_S = 0.3


class ProcessGroup:
    """A communicator with its timeout (seconds). `broken` says why it must no longer be
    used, or is None: once a collective timed out, the ranks disagree on which collective
    comes next, and MPI may still write into that collective's buffers, so its Work is
    kept (in `abandoned`) for as long as the process lives."""

    def __init__(self, comm, timeout):
        self.comm = comm
        self.timeout = timeout.total_seconds()
        self._rank = comm.Get_rank()
        self._size = comm.Get_size()
        self.broken = None
        self.abandoned = []

    def rank(self):
        return self._rank

    def size(self):
        return self._size

    def name(self):
        return "mpi"

    def __repr__(self):
        return f"<jitgrad.distributed.ProcessGroup mpi rank={self._rank} size={self._size}>"

    def check_usable(self):
        if self.broken is not None:
            raise DistBackendError(f"[Rank {self._rank}] the process group can no longer be used: {self.broken}")


class group:
    """torch.distributed.group: group.WORLD is the default process group (None before
    init_process_group and after destroy_process_group)."""
    WORLD = None


GroupMember = group


def default_group(pg=None):
    """The process group a call names (None: the default one), which must be alive."""
    world = GroupMember.WORLD
    if world is None:
        raise ValueError(NOT_INITIALIZED)
    if pg is not None and pg is not world:
        raise ValueError("Invalid process group specified")
    return world


def seconds(timeout):
    """A timeout given as a timedelta (PyTorch's type) or a number of seconds, in seconds."""
    if isinstance(timeout, datetime.timedelta):
        return timeout.total_seconds()
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        return float(timeout)
    raise TypeError(f"Expected timeout argument to be of type datetime.timedelta, got {timeout}")


def is_initialized():
    return GroupMember.WORLD is not None


def init_process_group(backend=None, init_method=None, timeout=None, world_size=-1, rank=-1, store=None,
                       group_name="", pg_options=None, device_id=None):
    """Join the MPI job's processes into the default process group (a collective: every
    rank calls it). backend: "mpi", the one there is (None picks it)."""
    if GroupMember.WORLD is not None:
        raise ValueError("trying to initialize the default process group twice!")
    if backend is not None and str(backend).lower() != "mpi":
        raise ValueError(f"Invalid backend: '{backend}': jitgrad.distributed has the 'mpi' backend only "
                         "(launch with `mpiexec -n N python ...`)")
    if timeout is None:
        timeout = DEFAULT_TIMEOUT
    if not isinstance(timeout, datetime.timedelta):
        raise TypeError(f"Expected timeout argument to be of type datetime.timedelta, got {timeout}")
    if _init_timed_out:
        raise DistBackendError("init_process_group timed out before: the ranks' calls to it no longer pair up "
                               "(one of them may still complete a pending one); end the job")
    MPI = mpi()
    _install_abort_hook()
    world = MPI.COMM_WORLD
    _check_agrees("rank", rank, "RANK", world.Get_rank())
    _check_agrees("world_size", world_size, "WORLD_SIZE", world.Get_size())
    comm, request = world.Idup()
    if not wait_all(MPI, [request], None, timeout.total_seconds()):
        _init_timed_out.append((comm, request))
        raise DistBackendError(f"[Rank {world.Get_rank()}] init_process_group timed out after "
                               f"{timeout.total_seconds():g} s: not all {world.Get_size()} ranks called it")
    GroupMember.WORLD = ProcessGroup(comm, timeout)
    share_cores(MPI, comm)


_init_timed_out = []  # the communicator and request of an init_process_group that timed out


def _check_agrees(arg, given, env, actual):
    if given is not None and given != -1 and int(given) != actual:
        raise ValueError(f"init_process_group({arg}={given}) disagrees with MPI, which gives this process "
                         f"{arg} {actual}: with the mpi backend MPI assigns ranks (launch with `mpiexec -n N`)")
    value = os.environ.get(env)
    if value is not None and value.strip() != str(actual):
        raise ValueError(f"environment variable {env}={value} disagrees with MPI, which gives this process "
                         f"{arg} {actual}: launch with `mpiexec -n N` without {env} set, or set it to MPI's value")


def destroy_process_group(group=None):
    """Leave the default process group; init_process_group may be called again (MPI itself
    stays initialized: it can be initialized only once per process)."""
    pg = GroupMember.WORLD if group is None else group
    if pg is None:
        raise AssertionError("Process group cannot be None")
    if pg is not GroupMember.WORLD:
        raise ValueError("Invalid process group specified")
    if pg.broken is None:  # a broken group's communicator may still have pending operations
        pg.comm.Free()
    GroupMember.WORLD = None


def get_rank(group=None):
    return default_group(group).rank()


def get_world_size(group=None):
    return default_group(group).size()


def get_backend(group=None):
    default_group(group)
    return "mpi"


def _comm(group=None):
    """The mpi4py communicator of a process group (for DistributedDataParallel, which
    all-reduces its gradient buckets on it directly and wraps the requests in a Work)."""
    pg = default_group(group)
    pg.check_usable()
    return pg.comm


_previous_hook = [sys.excepthook]


def _install_abort_hook():
    # not at an interactive prompt, where every mistake would end the session
    if sys.excepthook is _abort_on_unhandled or hasattr(sys, "ps1") or sys.flags.interactive:
        return
    _previous_hook[0] = sys.excepthook
    sys.excepthook = _abort_on_unhandled


def _abort_on_unhandled(exc_type, exc, tb):
    _previous_hook[0](exc_type, exc, tb)  # the traceback, as usual
    try:
        MPI = mpi()  # initializes MPI if this rank failed before init_process_group
    except RuntimeError:
        return  # no mpi4py: nothing to abort
    print(f"jitgrad.distributed: rank {MPI.COMM_WORLD.Get_rank()} ended with an unhandled {exc_type.__name__}; "
          "aborting the MPI job (MPI.COMM_WORLD.Abort) so that the other ranks stop waiting for it",
          file=sys.stderr, flush=True)
    sys.stdout.flush()
    # the launcher forwards a rank's output through a pipe it reads now and then, and the
    # abort tears it down: what it has not read yet, the traceback included, would be lost
    # (with MPICH: lost in 2 of 8 test runs without this pause, in none of 90 aborted jobs with it)
    time.sleep(ABORT_FLUSH_S)
    MPI.COMM_WORLD.Abort(1)


# environment variables that MPI launchers set in each process they start (MPICH's Hydra,
# Open MPI, PMIx-based ones such as Slurm's srun --mpi=pmix)
_LAUNCHED_BY = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK")
if any(v in os.environ for v in _LAUNCHED_BY):
    _install_abort_hook()
