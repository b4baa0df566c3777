"""The backward scheduler: the resumable sweep over a tape, written once as plain Python.

A tape's rows are in creation order, so sweeping them from the newest down is a
topological order: when the sweep reaches a row, every row that feeds gradient into it
has run, and its gradient is complete. The sweep runs each row that got gradient (HAS,
or FED for a multi-output node) and may run (EXEC), adding its contributions into its
inputs' rows, and marks it DONE.

Gradients live in two places: `g1`, one number per row, for rows of one element (a
scalar graph never allocates an array), and one flat buffer per larger row, held by
address: `gaddr[row]` is its data (0 until something contributes) and `gown[row]` the
reference that keeps it alive (kernels/pointers.py's own; 0 for a buffer the backward
does not own; gown's extra last element counts them). A buffer is freed as soon as its row has run, and whatever is left by
release(). Sinks (leaves, edges into older tapes, retained and requested tensors) get
their buffers as slices of one output array, so a whole backward hands Python two
arrays.

The sweep is *resumable*: all its state is in its arguments, so when it meets a row it
cannot run by itself it returns (status, row) and the Python driver (engine/compiled.py)
does that part, then calls sweep again from where it stopped. The statuses (defined in
_core/layout.py): SWEPT, done; FREED, a row whose saved values are gone (a second
backward through a freed graph); PYNODE, a node that runs in Python (a custom Function,
one with post-hooks, a row of another dtype than the sweep's or one mixing dtypes, an op
without a kernel): resume below it; PREHOOKS, hooks to run before the row: resume at it once
PRE is cleared; LEAF_READY, the row made a leaf with hooks (or a LeafGroup) ready (see count_pending):
resume below it; NEED_KERNEL, the row's kernel is not compiled yet: the driver compiles
it and resumes at the row. A tape with nothing for Python runs in one call, `backward`
(after NEED_KERNEL the driver runs it again from the start: nothing it did is kept).

Every row but a one-element elementwise one runs a kernel through the kernel table `kt`
(kernels/table.py, filled by engine/kernel_table.py as graphs use opcodes), so the sweep
compiles without any kernel and never recompiles when one is added.

What depends on the op table is generated (engine/codegen.py): the per-opcode tables and
`scalar_grads` (the formulas of a one-element elementwise row; compiled, its body
replaces the sweep's call to it, see codegen.bind_scheduler). The generated
module binds the functions listed in SCHEDULER to those names: it compiles them (@njit)
with its own namespace as their globals. The definitions of those names below are
placeholders that document them; calling the functions of this module directly reaches
them. Under NUMBA_DISABLE_JIT=1 the code objects run are this file's own.
"""
import numpy as np

from jitgrad._core.layout import (
    DONE,
    E_TGT,
    EW,
    EXEC,
    FED,
    FREED,
    H_DT,
    H_E0,
    H_FP,
    H_IP,
    H_KP,
    H_NIN,
    H_NUMEL,
    H_OP,
    HAS,
    HW,
    LEAF_READY,
    NEED_KERNEL,
    PRE,
    PREHOOKS,
    PYNODE,
    PYRUN,
    RECV,
    SWEPT,
)
from jitgrad.kernels.common import free_buffer, gradient, target_buffer
from jitgrad.kernels.table import call_kernel

# the functions the generated module compiles, bound to its names (engine/codegen.py)
SCHEDULER = ("mark_need", "count_pending", "contribute", "set_grad", "release", "grad_of", "start_into", "start",
             "finish", "sweep", "undo", "backward_into", "backward")

# --- supplied by the generated module ---------------------------------------------------------
OP_ACC = OP_EXT = OP_PYFN = OP_OUT = -1  # the sink opcodes: leaf, edge to an older tape, Python node, output k
OP_NSAVED = np.zeros(0, np.int64)        # per opcode: how many saved values it has
OP_IS_EW = np.zeros(0, np.int8)          # per opcode: elementwise (scalar_grads for one element) or not


def scalar_grads(op, grad, v, kp, fp, fpp):
    """(c0, c1): what a one-element elementwise row of opcode `op` contributes to its
    inputs, from its gradient, its saved values at v[kp], v[kp + 1], ... and its float
    params at fp[fpp], ..."""
    raise NotImplementedError("bound by the generated backward module (engine/codegen.py)")


# --- before the sweep ---------------------------------------------------------------------------
def mark_need(hdr, edges, n, st):
    """Selective execution for grad(): rows on a path to a requested input. Rows whose
    RECV bit is preset are the inputs; rows are visited in ascending order, so every
    edge target is final before the rows that feed from it are decided."""
    for row in range(n):
        b = row * HW
        e = hdr[b + H_E0] * EW
        for j in range(hdr[b + H_NIN]):
            t = edges[e + j * EW + E_TGT]
            if t >= 0 and (st[t] & RECV):
                st[row] |= RECV | EXEC
                break


def count_pending(hdr, edges, st, hi, group):
    """For leaf rows with hooks: how many edges into them come from rows this backward
    will run; the sweep then reports when each becomes ready, so its hooks run when
    PyTorch's would. Rows are reached as the sweep reaches them: from the seeded rows down,
    through edges into rows that take gradient.
    group[row] is -1 for a row without hooks, the row itself for a leaf reported on its
    own, and for the members of a LeafGroup (graph/hooks.py) the same member row, where
    the whole group's count is kept: there pend[member] = -(that row + 1), so the sweep
    reports the group once, when its last member is ready."""
    n = st.size
    reach = np.zeros(n, np.uint8)
    pend = np.zeros(n, np.int64)
    for row in range(hi, -1, -1):
        if st[row] & HAS:
            reach[row] = 1
        if not reach[row] or not (st[row] & EXEC):
            continue
        b = row * HW
        e = hdr[b + H_E0] * EW
        for j in range(hdr[b + H_NIN]):
            t = edges[e + j * EW + E_TGT]
            if t >= 0 and (st[t] & RECV):
                reach[t] = 1
                if group[t] >= 0:
                    pend[group[t]] += 1
    for t in range(n):
        if group[t] >= 0 and group[t] != t:
            pend[t] = -group[t] - 1
    return pend


def start(hdr, st, seed_rows, seed_offs, seed_vals, sinks, v):
    """Set up a backward call: the buffers, the sinks' output array, the seeded roots.

    Sinks are the rows whose gradient Python reads afterwards (leaves, edges into older
    tapes, retained and requested tensors): their buffers are slices of one output array,
    returned with each sink's offset, so nothing but two arrays crosses back to Python.
    Returns (g1, gaddr, gown, out, offsets)."""
    total = 0
    for i in range(sinks.size):
        total += hdr[sinks[i] * HW + H_NUMEL]
    return start_into(hdr, st, seed_rows, seed_offs, seed_vals, sinks, v, np.empty(total, v.dtype))


def start_into(hdr, st, seed_rows, seed_offs, seed_vals, sinks, v, out):
    """start, with the sinks' output array given (zeroed here): jitgrad.compile's replay
    keeps one per plan, so the gradients land at the same addresses every call."""
    n = st.size
    g1 = np.zeros(n, v.dtype)          # gradient of every one-element row
    gaddr = np.zeros(n, np.int64)      # larger rows: the address of the row's buffer
    gown = np.zeros(n + 1, np.int64)   # and the reference that keeps it alive (then a count)
    ns = sinks.size
    offs = np.empty(ns + 1, np.int64)
    total = 0
    for i in range(ns):
        offs[i] = total
        total += hdr[sinks[i] * HW + H_NUMEL]
    offs[ns] = total
    out[:] = 0
    for i in range(ns):
        r = sinks[i]
        if hdr[r * HW + H_NUMEL] > 1 and gaddr[r] == 0:
            gaddr[r] = out[offs[i]:offs[i + 1]].ctypes.data
    for i in range(seed_rows.size):
        contribute(seed_rows[i], seed_vals[seed_offs[i]:seed_offs[i + 1]], hdr, g1, gaddr, gown, st)
    return g1, gaddr, gown, out, offs


# --- what Python hands in and reads between sweeps ----------------------------------------------
def contribute(row, arr, hdr, g1, gaddr, gown, st):
    """Add a gradient for `row`'s output (flat) that Python computed: a root's seed, or
    what a node run in Python (a custom Function) passes to its inputs."""
    st[row] |= HAS
    n = hdr[row * HW + H_NUMEL]
    if n == 1:
        g1[row] += arr[0]
    elif n > 1:
        buf = target_buffer(row, n, g1, gaddr, gown)
        for j in range(n):
            buf[j] += arr[j]


def set_grad(row, arr, hdr, g1, gaddr, gown, st):
    """Replace `row`'s gradient (a hook returned a new one)."""
    st[row] |= HAS
    n = hdr[row * HW + H_NUMEL]
    if n == 1:
        g1[row] = arr[0]
    elif n > 1:
        buf = target_buffer(row, n, g1, gaddr, gown)
        for j in range(n):
            buf[j] = arr[j]


def release(gaddr, gown):
    """Free every gradient buffer the backward still owns (at its end, or when Python
    abandons it midway)."""
    row = 0
    while gown[-1] > 0 and row < gaddr.size:
        if gown[row] != 0:
            free_buffer(row, gaddr, gown)
        row += 1


def grad_of(row, hdr, g1, gaddr, gown):
    """A copy of `row`'s complete gradient, for a node run in Python."""
    return gradient(row, hdr, g1, gaddr, gown).copy()


def finish(hdr, g1, gaddr, gown, sinks, offs, out):
    """Copy the one-element sinks' gradients from g1 into the output array (the larger
    ones were accumulated there in place), and free what is left of the buffers (rows
    that got gradient but did not run: a grad() that stopped early, a FREED status)."""
    for i in range(sinks.size):
        r = sinks[i]
        if hdr[r * HW + H_NUMEL] == 1:
            out[offs[i]] = g1[r]
    release(gaddr, gown)


def backward(hdr, edges, xs, fp, slots, v, st, freed, seed_rows, seed_offs, seed_vals, sinks, hi, retain, dt, kt):
    """The whole backward of a tape in one call, for tapes with no node that needs
    Python. Returns (status, row, out, offsets); after NEED_KERNEL or PYNODE (a row found
    to need Python after all: an op without a kernel) nothing it did is kept."""
    g1, gaddr, gown, out, offs = start(hdr, st, seed_rows, seed_offs, seed_vals, sinks, v)
    status, row = sweep(hdr, edges, xs, fp, slots, v, g1, st, gaddr, gown, freed, hi, retain, dt, xs[0:0], kt)
    if status == NEED_KERNEL or status == PYNODE:  # the caller runs it again, or resumably
        undo(st)
    finish(hdr, g1, gaddr, gown, sinks, offs, out)
    return status, row, out, offs


def backward_into(hdr, edges, xs, fp, slots, v, st, freed, seed_rows, seed_offs, seed_vals, sinks, hi, retain, dt,
                  kt, out):
    """backward, with the sinks' gradients written into `out` (jitgrad.compile's replay).
    Returns (status, row)."""
    g1, gaddr, gown, out, offs = start_into(hdr, st, seed_rows, seed_offs, seed_vals, sinks, v, out)
    status, row = sweep(hdr, edges, xs, fp, slots, v, g1, st, gaddr, gown, freed, hi, retain, dt, xs[0:0], kt)
    if status == NEED_KERNEL:
        undo(st)
    finish(hdr, g1, gaddr, gown, sinks, offs, out)
    return status, row


def undo(st):
    """Forget what a one-call backward did, so that it can be called again from the start
    once its missing kernel is compiled: the gradients were its own, only the row states
    are the caller's (they held RECV and EXEC bits before the call)."""
    for i in range(st.size):
        st[i] &= RECV | EXEC


# --- the sweep ------------------------------------------------------------------------------------
def sweep(hdr, edges, xs, fp, slots, v, g1, st, gaddr, gown, freed, hi, retain, dt, pend, kt):
    """Sweep rows from `hi` down, running each row that received gradient and may run.
    All state is in the arguments, so a sweep stopped at a row resumes with hi = that
    row - 1 (or hi = row after PREHOOKS). Returns (status, row): see the module doc.
    `pend` (count_pending) is empty unless leaves with hooks must be reported as they
    become ready; `retain` False marks the rows that ran as freed at the end."""
    for row in range(hi, -1, -1):
        s = st[row]
        if not (s & EXEC) or not (s & (HAS | FED)):
            continue
        if s & PRE:
            return PREHOOKS, row
        b = row * HW
        op = hdr[b + H_OP]
        if op == OP_OUT:
            if s & HAS:  # output k of a multi-output node, k rows below: the node must run
                st[row - hdr[b + H_IP]] |= FED
            continue
        if op == OP_ACC or op == OP_EXT:
            continue
        if freed[row] and OP_NSAVED[op]:
            return FREED, row
        if op == OP_PYFN or s & PYRUN or hdr[b + H_DT] != dt:
            return PYNODE, row  # (a row of another dtype has its gradient in Python, at its dtype)
        if OP_IS_EW[op] and hdr[b + H_NUMEL] == 1:
            # One-element rows (scalar graphs) run inline: plain loads and stores on the
            # flat arena g1, no array views, no calls. Their saved values sit in v at v[kp],
            # v[kp + 1], ... (graph/record.py, record_ew).
            e = hdr[b + H_E0] * EW
            t0 = edges[e + E_TGT]
            if t0 >= 0 and not (st[t0] & RECV):
                t0 = -1
            t1 = -1
            if hdr[b + H_NIN] > 1:
                t1 = edges[e + EW + E_TGT]
                if t1 >= 0 and not (st[t1] & RECV):
                    t1 = -1
            grad = g1[row]
            kp = hdr[b + H_KP]
            fpp = hdr[b + H_FP]
            # compiled, this line is replaced by scalar_grads' body (engine/codegen.py)
            c0, c1 = scalar_grads(op, grad, v, kp, fp, fpp)
            if t0 >= 0:
                g1[t0] += c0
                st[t0] |= HAS
            if t1 >= 0:
                g1[t1] += c1
                st[t1] |= HAS
        else:
            # any other row runs its op's kernel from the table (elementwise loops and
            # structural kernels alike): 0, not compiled yet; -1, none (Python runs it)
            k = kt[op]
            if k <= 0:
                return (NEED_KERNEL if k == 0 else PYNODE), row
            call_kernel(k, row, hdr, edges, xs, fp, slots, v, g1, gaddr, gown, st)
        st[row] = s | DONE
        if gown[row] != 0:  # consumed: free it now (a sink's data stays in `out`)
            free_buffer(row, gaddr, gown)
        if pend.size:
            ready = False
            e = hdr[b + H_E0] * EW
            for j in range(hdr[b + H_NIN]):
                t = edges[e + j * EW + E_TGT]
                if t < 0:
                    continue
                if pend[t] < 0:  # a LeafGroup member: the count is its group's (count_pending)
                    t = -pend[t] - 1
                if pend[t] > 0:
                    pend[t] -= 1
                    ready = ready or pend[t] == 0
            if ready:
                return LEAF_READY, row
    if not retain:
        for row in range(hi, -1, -1):
            if st[row] & DONE:
                freed[row] = 1
    return SWEPT, -1
