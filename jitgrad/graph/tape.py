"""Recording: every differentiable op appends its node's row here while the forward runs.

This is the "lower as you go" half of the engine (DESIGN.md point 1). When backward is
called, the scheduler already has everything in flat columns; no Python object is walked.

A tape is a set of append-only `array.array` columns (amortised O(1) appends, and
`np.frombuffer` views them at backward time without a copy):

  hdr    HW ints per row: op, dtype code, n inputs, edge start, out numel, out shape
         pointer, float-param pointer, first saved slot, int-param pointer
  edges  3 ints per input: target row (-1: no gradient), target output nr, shape pointer
  xs     shapes and int params, each stored as (count, v0, v1, ...)
  fp     float64 params (clamp bounds, exponents, scalar operands)
  slots  3 ints per saved value: address of its data, or -(index+1) into v64/v32 for an
         inline copy of a one-element value; its numel; and where Python finds it again:
         its index in `keep`, or for inline values 0 (v64) / 1 (v32)
  v64/v32 inline copies of one-element saved values, per dtype. A one-element
         elementwise row skips `slots`: its first-saved pointer indexes v directly.
         CUDA rows (their own dtype codes, _core/layout.py) copy nothing inline: a saved
         device array is kept by its device address whatever its size (_save_device),
         and v holds only their Python-number operands.
  freed  per row, set once its saved values are released (grown at backward time)

A tape holds the rows of one device (`cuda`, on_device): an op on the other device starts
a new tape, so the CPU sweep and the device sweep (engine/device.py) each take whole
tapes, and a graph that crosses devices is linked through EXT rows.

Arrays the kernels read by address are held in `keep` until the graph is freed. Nothing
else is kept per node: the Python engine rebuilds what it needs from these columns.
Rows are numbered in creation order, so descending row order is a topological order.

Lifetime: tensors and nodes hold their tape; the thread holds its current tape only
weakly, so a graph is freed by reference counting as soon as nothing refers to it. A
tape is closed (the next op starts a new one) after a backward that frees the graph, past
a size cap, or when a new graph starts on a tape already holding saved arrays
(SPLIT_BYTES). Edges into an older tape go through an EXT row; the engine hands those
gradients on.

Threads: only the thread that made a tape (its `owner`) ever appends to it, because each
thread records onto its own current tape. So recording takes no lock. Backward calls
take the tape's `lock` (one at a time per tape: they grow and mark `freed`, release
`keep`), and a backward in a thread other than the owner reads copies of the columns,
never views: the owner may be appending at that moment, and an array.array cannot grow
while a buffer view of it exists (BufferError), nor be read after it moved.
"""
import _thread
import array
import ctypes
import itertools
import struct
import threading
import weakref

import numpy as np

from jitgrad._core import versions
from jitgrad._core.capture import state as _cap
from jitgrad._core.layout import (  # noqa: F401
    DT_CUDA_F32,
    DT_F32,
    DT_F64,
    DT_MASK,
    DT_OTHER,
    DT_PY,
    E_NR,
    E_SHP,
    E_TGT,
    EW,
    H_DT,
    H_E0,
    H_FP,
    H_IP,
    H_KP,
    H_NIN,
    H_NUMEL,
    H_OP,
    H_SHP,
    HW,
    S_KEEP,
    S_REF,
    SW,
)
from jitgrad.gpu.array import DeviceArray
from jitgrad.graph import saved as _saved
from jitgrad.graph.spec import SPECS as _SPECS

MAX_ROWS = 1 << 20          # close a tape past this many rows...
MAX_KEEP_BYTES = 256 << 20  # ...or past this many bytes of saved arrays
# An op none of whose inputs come from the current tape starts a new graph. If the tape
# already holds this many bytes of saved arrays, the op starts a new tape instead, so that
# consecutive forwards (an evaluation loop without no_grad) do not pin each other's arrays.
SPLIT_BYTES = 1 << 20

_tape_ids = itertools.count()
# array.frombytes(struct.pack(...)) appends several ints ~3x faster than array.extend(tuple)
pack_row = struct.Struct(f"{HW}q").pack
pack_edge = struct.Struct(f"{EW}q").pack
pack_edge2 = struct.Struct(f"{2 * EW}q").pack
pack_slot = struct.Struct(f"{SW}q").pack
_PACKERS = {}


def pack_ints(n):
    """struct's pack of n int64s, made once per n (the same append trick for xs and edges)."""
    pack = _PACKERS.get(n)
    if pack is None:
        pack = _PACKERS[n] = struct.Struct(f"{n}q").pack
    return pack


_F64 = np.dtype(np.float64)
_F32 = np.dtype(np.float32)
_EMPTY_Q, _EMPTY_D, _EMPTY_F, _EMPTY_B = (array.array(c) for c in "qdfb")
_XS0 = array.array("q", (0,))
_RLock = _thread.RLock  # threading.RLock is a Python wrapper around it


# The shapes earlier tapes interned, as the (xs, shape_ptr) pair a new tape starts from: the
# next graph of a training loop finds its shapes there (each is ~1 us to intern). The pair is
# replaced whole, never appended to, so a tape copies a matching pair whichever thread seeds.
_SEED = [(_XS0, {(): 0})]
_SEED_MAX = 64  # shapes; a tape's xs starts with them all


def _seed(shape, packed):
    xs, ptr = _SEED[0]
    if len(ptr) < _SEED_MAX and shape not in ptr:
        xs, ptr = xs.__copy__(), dict(ptr)
        ptr[shape] = len(xs)
        xs.frombytes(packed)
        _SEED[0] = (xs, ptr)


_addressof = ctypes.addressof
_from_buffer = ctypes.c_char.from_buffer


def _address(arr):
    """Address of a contiguous array's data: 3x cheaper than arr.ctypes.data, which builds
    a helper object per call; read-only arrays need that slower path."""
    try:
        return _addressof(_from_buffer(arr))
    except (TypeError, ValueError):
        return arr.ctypes.data


class Tape:
    # The fields, by what reads them. Only the columns cross into compiled code; the rest is
    # Python-side state keyed by row, kept flat because recording reads some of it per op.
    __slots__ = (
        "id", "nrows", "closed", "owner", "lock", "cuda", "__weakref__",
        # the columns (the layout is _core/layout.py) and their interning of shapes
        "hdr", "edges", "xs", "fp", "slots", "v64", "v32", "freed", "shape_ptr",
        # saved storage: arrays read by address, their version stamps, rows found stale
        "keep", "keep_bytes", "kept", "stale", "packed", "leaf_values", "inline_consts",
        # the graph's boundaries: leaf sinks, edges into older tapes, retained non-leaves
        "leaves", "ext", "ext_rows", "retained",
        # Python objects per row: node views, node metadata, custom Function nodes
        "nodes", "metadata", "py_nodes",
        # hooks, by row (graph/hooks.py registers them, engine/hooks.py runs them)
        "tensor_hooks", "node_prehooks", "node_hooks",
        # what backward has learnt about the rows (engine/compiled.py)
        "dt_count", "dt_scanned", "reshaped", "gen0",
    )

    def __init__(self):
        # a graph starts a tape: the columns are copies of empty templates (half the cost of
        # array.array(typecode)), the lock made by _thread directly
        self.id = next(_tape_ids)
        self.hdr = _EMPTY_Q.__copy__()
        self.edges = _EMPTY_Q.__copy__()
        xs, shape_ptr = _SEED[0]
        self.xs = xs.__copy__()  # xs[0] is the shape () every 0-d value points at; then the seeded shapes
        self.fp = _EMPTY_D.__copy__()
        self.slots = _EMPTY_Q.__copy__()
        self.v64 = _EMPTY_D.__copy__()
        self.v32 = _EMPTY_F.__copy__()
        self.keep = []                          # Python objects kept alive for the kernels / rules
        self.keep_bytes = 0
        self.nrows = 0
        self.shape_ptr = shape_ptr.copy()
        self.leaves = {}      # AccumulateGrad row -> AccumulateGrad node
        self.ext = {}         # EXT row -> (foreign tape, foreign row)
        self.retained = {}    # row -> weakref of a non-leaf tensor that retains grad
        self.freed = _EMPTY_B.__copy__()  # per row: saved values released (grown at backward)
        self.closed = False
        self.cuda = False     # its rows are CUDA rows (on_device)
        self.nodes = {}       # row -> weakref of its materialised Node (graph/node.py)
        self.ext_rows = {}    # (foreign tape id, row) -> EXT row here
        self.metadata = {}    # row -> its node's `metadata` dict
        self.py_nodes = {}    # row -> node run in Python (custom Function), see autograd/function.py
        self.packed = {}      # row -> its SavedTensors (graph/saved.py): hooks, _raw_saved_*
        self.leaf_values = {}  # id -> array: values unpack hooks gave for a leaf (rowinfo.input)
        self.inline_consts = {}  # id -> (array, rows): one-element constants saved by copy (note_inline_const)
        self.kept = []        # (slot, row, version: a stamp, an int or None) per array in keep (see save)
        self.stale = {}       # row -> (data, version now, version saved): modified after it was saved,
        #                       or the error to raise (a saved input detach_()ed, note_detached)
        self.tensor_hooks = {}   # row -> {id: hook} of the tensor whose gradient is that row's (hooks.py)
        self.node_prehooks = {}  # node row -> {id: hook}
        self.node_hooks = {}     # node row -> {id: hook}: post-hooks; the node then runs in Python
        self.dt_count = {}       # dtype code -> how many node rows of the scanned ones have it (_compiled.dtype_counts)
        self.dt_scanned = 0      # rows scanned so far
        self.reshaped = False    # a recorded tensor's .data changed shape or dtype (_compiled.check_edge_shapes)
        self.gen0 = versions.generation[0]  # in-place writes before this tape began: none can touch its values
        self.owner = threading.get_ident()  # the one thread that appends rows (see module doc)
        self.lock = _RLock()                 # held by backward calls over this tape

    # -- recording helpers ---------------------------------------------------------
    def shape(self, shape):
        p = self.shape_ptr.get(shape)
        if p is None:
            p = len(self.xs)
            packed = pack_ints(len(shape) + 1)(len(shape), *shape)
            self.xs.frombytes(packed)
            self.shape_ptr[shape] = p
            _seed(shape, packed)
        return p

    def ints(self, values):
        p = len(self.xs)
        self.xs.frombytes(pack_ints(len(values) + 1)(len(values), *values))
        return p

    def save(self, arr, check=True, want=None, fresh=False):
        """Save an ndarray for the kernels; returns its slot. One-element values are copied
        inline (cheaper than holding them), larger ones are held and read by address.
        check=False: no gradient that will be computed reads it, so an in-place write to
        it later is no error (PyTorch would not have saved it).
        fresh: arr is an array the op just made, so at version 0 (no stamp needed).
        want: the dtype the kernel reads this value at (None: only the Python engine reads
        it). The compiled code reads by address, so a value of any other dtype or layout is
        converted here; the copy is version-stamped by the storage it came from."""
        k = len(self.slots) // SW
        src = arr
        if want is not None:
            dt = arr.dtype
            if dt is not want and dt != want:
                arr = arr.astype(want)
        tp = type(arr)
        if tp is DeviceArray:
            return self._save_device(k, arr, src, check, fresh)
        n = arr.size
        if n == 1:
            if check and not fresh:  # copied: an in-place write to it must find this row (the next one)
                self.note_inline_const(src, self.nrows)
            dt = arr.dtype
            if dt == _F64:
                self.slots.frombytes(pack_slot(-len(self.v64) - 1, 1, 0))
                self.v64.append(arr.item())
                return k
            if dt == _F32:
                self.slots.frombytes(pack_slot(-len(self.v32) - 1, 1, 1))
                self.v32.append(arr.item())
                return k
        if tp is not np.ndarray and not isinstance(arr, np.ndarray):
            arr = np.asarray(arr)
        try:  # _address(arr), inlined: numpy exports the buffer of a C-contiguous writable array only
            addr = _addressof(_from_buffer(arr))
        except (TypeError, ValueError):
            if not arr.flags.c_contiguous:
                arr = np.ascontiguousarray(arr)
            addr = arr.ctypes.data
        keep = self.keep
        self.slots.frombytes(pack_slot(addr, n, len(keep)))
        # the row these saves belong to is the next one. What it checks (check_versions):
        # the version of the storage saved, as a stamp of the source's for a copy (whose own
        # storage no in-place write will ever reach), else as a plain int (keep holds the
        # array, hence its storage), or None for version 0 (a new array; every array until
        # some in-place write has happened in this process)
        if check:
            if arr is not src:
                stamp = versions.stamp(src)
            elif fresh or not versions.generation[0]:
                stamp = None
            else:
                stamp = versions.version(arr)
            self.kept.append((k, self.nrows, stamp))
        keep.append(arr)
        kb = self.keep_bytes = self.keep_bytes + arr.nbytes
        if kb >= MAX_KEEP_BYTES:
            self.closed = True  # takes effect for the next op; this row still lands here
        return k

    def _save_device(self, k, arr, src, check, fresh):
        """save() of a CUDA array: kept by reference, its device address in S_REF, even
        at one element. An inline copy into v would cost a device-to-host copy (a
        synchronisation) per saved value at record time; the device sweep reads the
        value where it is (gpu/sweep.py), as PyTorch keeps the saved tensor itself."""
        if not arr.is_c_contiguous():
            arr = arr.copy()
        keep = self.keep
        self.slots.frombytes(pack_slot(arr.ptr, arr.size, len(keep)))
        if check:  # as in save: a copy is stamped with its source's storage
            if arr is not src:
                stamp = versions.stamp(src)
            elif fresh or not versions.generation[0]:
                stamp = None
            else:
                stamp = versions.version(arr)
            self.kept.append((k, self.nrows, stamp))
        keep.append(arr)
        self.keep_bytes += arr.nbytes
        if self.keep_bytes >= MAX_KEEP_BYTES:
            self.closed = True
        return k

    def save_scalar(self, value, dtcode):
        """A Python number used as an operand, saved inline in the graph's dtype."""
        k = len(self.slots) // SW
        if dtcode == DT_F32 or dtcode == DT_CUDA_F32:
            self.slots.frombytes(pack_slot(-len(self.v32) - 1, 1, 1))
            self.v32.append(value)
        else:
            self.slots.frombytes(pack_slot(-len(self.v64) - 1, 1, 0))
            self.v64.append(value)
        return k

    def saved_value_of_row(self, row, k, shape):
        """Saved value k of `row` as numpy data, for the Python engine."""
        st = self.hooked(row, k)
        if st is not None:  # packed by hooks (graph/saved.py), or not saved at all
            return None if st._none else st.unpack_tensor()._data
        b = row * HW
        kp = self.hdr[b + H_KP]
        dt = self.hdr[b + H_DT]
        if self.hdr[b + H_NUMEL] == 1 and dt < DT_OTHER and _SPECS[self.hdr[b + H_OP]].kind == "ew":
            # a one-element elementwise CPU row keeps its values directly in v64/v32 (record_ew)
            typ, col = (np.float64, self.v64) if dt == DT_F64 else (np.float32, self.v32)
            return typ(col[kp + k]).reshape(shape) if shape else typ(col[kp + k])
        return self.saved_value(kp + k, shape)

    def saved_value(self, k, shape):
        """Saved value in slot k as numpy data, for the Python engine."""
        ref, where = self.slots[SW * k + S_REF], self.slots[SW * k + S_KEEP]
        if ref < 0:
            v = self.v64[-ref - 1] if where == 0 else self.v32[-ref - 1]
            return (np.float64 if where == 0 else np.float32)(v).reshape(shape) if shape else \
                (np.float64 if where == 0 else np.float32)(v)
        return self.keep[where]

    def hooked(self, row, k):
        """Saved value k of `row` as a SavedTensor (graph/saved.py) when hooks packed it or
        the op saved nothing there (x * y saves no y when y's gradient is not needed); else
        None: the value is in the columns."""
        entries = self.packed.get(row)
        st = None if entries is None else entries[k]
        return st if st is not None and (st._none or st.is_packed()) else None

    def note_inline_const(self, arr, row):
        """`row` saved a copy of one-element `arr`, the data of a tensor outside the graph
        (no edge leads back to it): kept so that an in-place write to arr finds the row
        (rows_saving_const), as the version check does for values saved by reference."""
        entry = self.inline_consts.get(id(arr))
        if entry is None or entry[0] is not arr:
            entry = self.inline_consts[id(arr)] = (arr, [])
            _CONST_TAPES.add(self)
        entry[1].append(row)

    def run_in_python(self, row):
        """Hand `row` to Python (which unpacks hooked values) in every backward from now on."""
        old = self.hdr[row * HW + H_DT]
        if old & DT_PY:
            return
        self.set_dtcode(row, old | DT_PY)
        if row < self.dt_scanned:  # counted already (compiled.dtype_counts), and rescanned by no one
            self.dt_count[old] -= 1
            self.dt_count[old | DT_PY] = self.dt_count.get(old | DT_PY, 0) + 1

    def note_detached(self, row):
        """The output of `row` was detach_()ed: a node that saved it as an input (PyTorch's
        saved original) can no longer reach its grad_fn, and raises when it runs."""
        for r, j in self.readers_of(row):
            spec = _SPECS[self.op(r)]
            if spec.kind == "sink" or j >= len(spec.args) or spec.args[j] not in spec.saves or r in self.stale:
                continue
            if not _saved.needed_in_row(self, r)[spec.saves.index(spec.args[j])]:
                continue  # not saved (graph/saved.py)
            self.stale[r] = RuntimeError(
                "Trying to use a saved tensor that has been detached in-place, i.e. with .detach_().This is not "
                "supported, please use out-of-place `.detach()` instead")
            self.grow_freed()
            self.freed[r] = 1

    def check_versions(self):
        """Mark rows whose saved arrays were modified in place after being saved: backward
        raises PyTorch's error when it reaches them (they read as freed)."""
        if not self.keep:
            return
        if versions.generation[0] == self.gen0:  # no in-place write since this tape began
            return
        # the version of each saved value's storage, read inline: one dict lookup per value
        # (_modified, which builds the error's details, runs only for a changed one)
        keep, slots, of_base = self.keep, self.slots, versions.of_base
        for k, row, stamp in self.kept:
            if row in self.stale:
                continue
            if type(stamp) is tuple:
                if stamp[0] is None:
                    continue
                base = stamp[0]()
                if base is None or of_base(base) == stamp[1]:
                    continue
            else:
                where = slots[SW * k + S_KEEP]
                if where >= len(keep):
                    continue
                arr = keep[where]
                # (most saved arrays are not views: their own storage)
                base = arr if type(arr) is np.ndarray and arr.base is None else versions.base_of(arr)
                if of_base(base) == (stamp or 0):
                    continue
            found = self._modified(k, row, stamp)
            if found is not None:
                self.stale[row] = found
                self.grow_freed()
                self.freed[row] = 1

    def _modified(self, k, row, stamp):
        """(array, version now, version saved) if the value saved in slot k for `row` was
        written in place since, else None."""
        where = self.slots[SW * k + S_KEEP]
        if row >= self.nrows or where >= len(self.keep):
            return None  # a save whose op never got its row (interrupted), or one already released
        arr = self.keep[where]
        if type(stamp) is not tuple:  # None or an int (see save)
            now, saved = versions.version(arr), stamp or 0
        else:
            now, saved = versions.changed(stamp), stamp[1]
            if now is None:
                return None
        if now == saved:
            return None
        src = stamp[0]() if type(stamp) is tuple and stamp[0] is not None else None
        if src is not None and src.dtype != arr.dtype:  # a cast copy: name the tensor that was saved
            arr = np.broadcast_to(np.zeros((), src.dtype), arr.shape)
        return arr, now, saved

    def value_modified(self, row, k):
        """For grad_fn._saved_<name>: (array, version now, version saved) when saved value k
        of `row` was written in place since it was saved, else None. A one-element
        elementwise row's values are copies, checked when written (ops/inplace.py)."""
        stale = self.stale.get(row)
        if type(stale) is tuple and self.hdr[row * HW + H_NUMEL] == 1:
            return stale
        slot = self.hdr[row * HW + H_KP] + k
        for s, r, stamp in self.kept:
            if r == row and s == slot:
                return self._modified(s, r, stamp)
        return None

    def release_saved(self):
        """Drop every saved array (all rows ran and were freed). The tape is closed with
        them: `kept` indexes into `keep`, so no row may be saved onto it afterwards."""
        self.closed = True
        self.keep = []
        self.keep_bytes = 0
        self.kept = []

    def mark_freed(self, mask):
        """freed[row] = 1 where mask (bools over the first rows). A new column replaces the
        old one rather than a view writing into it: see the module doc on views."""
        self.grow_freed()
        f = np.frombuffer(bytearray(self.freed), np.int8)
        f[:mask.size] |= mask
        self.freed = array.array("b", f.tobytes())

    def needs_python(self):
        """Whether some row must be handed back to Python during the sweep."""
        return bool(self.py_nodes or self.tensor_hooks or self.node_prehooks or self.node_hooks)

    def grow_freed(self):
        if len(self.freed) < self.nrows:
            self.freed.frombytes(bytes(self.nrows - len(self.freed)))

    def is_freed(self, row):
        return row < len(self.freed) and self.freed[row]

    def shape_at(self, p):
        return tuple(self.xs[p + 1:p + 1 + self.xs[p]])

    # -- reading a row: Python's view of the columns (the kernels and the scheduler index
    # them directly, through the same layout constants) ---------------------------------
    def op(self, row):
        return self.hdr[row * HW + H_OP]

    def dtcode(self, row):
        return self.hdr[row * HW + H_DT]

    def n_inputs(self, row):
        return self.hdr[row * HW + H_NIN]

    def numel(self, row):
        return self.hdr[row * HW + H_NUMEL]

    def out_shape(self, row):
        return self.shape_at(self.hdr[row * HW + H_SHP])

    def fparams(self, row, n):
        p = self.hdr[row * HW + H_FP]
        return tuple(self.fp[p:p + n])

    def iparams(self, row):
        p = self.hdr[row * HW + H_IP]
        return tuple(self.xs[p + 1:p + 1 + self.xs[p]])

    def output_nr(self, row):
        """For an OP_OUT row (output k > 0 of a multi-output node): k, so the node's row is row - k."""
        return self.hdr[row * HW + H_IP]

    def edge(self, row, j):
        """Input j of `row`: (target row or -1, the target's output number, shape pointer)."""
        e = EW * (self.hdr[row * HW + H_E0] + j)
        return self.edges[e + E_TGT], self.edges[e + E_NR], self.edges[e + E_SHP]

    def edge_target(self, row, j):
        return self.edges[EW * (self.hdr[row * HW + H_E0] + j) + E_TGT]

    def in_shape(self, row, j):
        return self.shape_at(self.edges[EW * (self.hdr[row * HW + H_E0] + j) + E_SHP])

    def readers_of(self, row):
        """The rows that take `row`'s output as an input: (reader row, input index) pairs."""
        hdr = np.frombuffer(self.hdr, np.int64).reshape(-1, HW)
        edges = np.frombuffer(self.edges, np.int64).reshape(-1, EW)
        found = np.flatnonzero(edges[:, E_TGT] == row)
        rows = np.searchsorted(hdr[:, H_E0], found, side="right") - 1
        out = [(int(r), int(e - hdr[r, H_E0])) for r, e in zip(rows, found)]
        del hdr, edges  # no view of the columns may outlive this call (see the module doc)
        return out

    def set_dtcode(self, row, code):
        self.hdr[row * HW + H_DT] = code

    # -- appending ------------------------------------------------------------------------
    def add_edges(self, flat):
        """Append edges given flat, EW ints each, for the row just added."""
        self.edges.extend(flat)

    def add_row(self, op, dtcode, nin, numel, shp, fp, kp, ip):
        row = self.nrows
        self.hdr.frombytes(pack_row(op, dtcode, nin, len(self.edges) // EW, numel, shp, fp, kp, ip))
        self.nrows = row + 1
        if row + 1 >= MAX_ROWS:
            self.closed = True
        return row


_CONST_TAPES = weakref.WeakSet()  # the live tapes with inline_consts


def rows_saving_const(arr):
    """(tape, row) for each row that saved a copy of one-element constant `arr`."""
    for tape in list(_CONST_TAPES):
        entry = tape.inline_consts.get(id(arr))
        if entry is not None and entry[0] is arr:
            for row in entry[1]:
                yield tape, row


class _Local(threading.local):
    # Each thread records onto its own tape, held weakly: a tape lives exactly as long as
    # a tensor or node of its graph does, so a forward pass nobody backpropagates through
    # (evaluation without no_grad) is freed as soon as its outputs are dropped.
    ref = None


_local = _Local()


def live_tape():
    """The thread's current tape, or None."""
    ref = _local.ref
    return None if ref is None else ref()


def current_tape():
    ref = _local.ref
    t = None if ref is None else ref()
    if t is None or t.closed:
        t = Tape()
        _local.ref = weakref.ref(t)
    return t


def tape_for(a, b=None):
    """The tape an op on inputs a (and b, a tensor or not) records onto (see SPLIT_BYTES)."""
    t = current_tape()
    # (not while jitgrad.compile records: its plan replays one step's graph, on one tape)
    if t.keep_bytes > SPLIT_BYTES and a._tape is not t and getattr(b, "_tape", None) is not t and _cap.rec is None:
        t.closed = True
        t = current_tape()
    return t


def on_device(t, cuda):
    """t, or a new current tape if t holds rows of the other device (cuda: True for CUDA
    data). A tape holds one device's rows, so each engine takes whole tapes: the CPU sweep
    never meets a CUDA row, the device sweep no host row; a graph crossing devices links
    its tapes through EXT rows."""
    if t.nrows:
        t.closed = True
        t = current_tape()
    t.cuda = cuda
    return t


def close_current_tape():
    t = live_tape()
    if t is not None:
        t.closed = True
