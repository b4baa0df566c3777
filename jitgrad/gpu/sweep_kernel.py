"""The device sweep's code, written once as plain Python; gpu/sweep_codegen.py binds it.

`sweep` is ONE persistent kernel launched with ONE block. It walks a tape's rows from
`hi` down (descending row order is a topological order: graph/tape.py), exactly as the
CPU scheduler (engine/scheduler.py) does, and for each row that got gradient the block's
threads split the row's elements; `cuda.syncthreads()` separates rows. Thread 0 alone
writes the row states (`st`), each write followed by a barrier, so every thread reads
the same state and takes the same branch (a kernel may not leave some threads at a
barrier).

Gradients live in device arenas: `gaddr[row]` is the device address of the row's
gradient buffer (its numel elements, zeroed before the launch), read through
gpu/pointers.view; saved values are read by the device addresses the tape recorded in
`slots` (S_REF >= 0), Python numbers used as operands from `v` (S_REF < 0).

Rows the kernel runs (OP_KIND, made from the op table by the engine): elementwise rows
(the op table's gradient formulas, compiled into `contrib` by sweep_codegen; a broadcast
input's gradient is reduced to its shape here, once, each thread owning the input
elements it sums into, so no two threads write one element), views (reshape / squeeze /
unsqueeze), expand (a reduction to the input's shape), permute / transpose, sum / mean.
Any other row stops the sweep with a status (as engine/scheduler.py's):
  PYNODE    the row runs in Python (a structural op with no device code here: matmul,
            conv, softmax...; a custom Function; a node with post-hooks; a row at
            another dtype): the driver runs its Tensor-level rule on the device, adds the
            results into the inputs' buffers and resumes below it;
  PREHOOKS  hooks to run first (the driver clears PRE and resumes at the row);
  FREED     a row whose saved values were freed or modified in place.
`status` gets (code, row); SWEPT when the sweep reached row 0.

The names defined below and bound by the generated module (OP_KIND, contrib, the
tables) are placeholders that document them.
"""
import numpy as np

from jitgrad._core.layout import (
    DONE,
    E_SHP,
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
    H_SHP,
    HAS,
    HW,
    PRE,
    PREHOOKS,
    PYNODE,
    PYRUN,
    RECV,
    S_NUMEL,
    S_REF,
    SW,
    SWEPT,
)
from jitgrad.gpu.pointers import view

# what the kernel does with a row, by opcode (OP_KIND)
K_PYTHON, K_SKIP, K_EW, K_VIEW, K_EXPAND, K_PERMUTE, K_SUM = range(7)

# the device functions and the kernel the generated module compiles, in this order
DEVICE = ("shape_numel", "in_index", "out_index", "saved_at", "contrib_at", "ew_row", "expand_row", "permute_row",
          "sum_row", "view_row")
KERNELS = ("sweep",)

# --- supplied by the generated module ---------------------------------------------------------
cuda = None                              # numba.cuda (the simulator's under NUMBA_ENABLE_CUDASIM)
OP_ACC = OP_EXT = OP_PYFN = OP_OUT = -1  # the sink opcodes
OP_KIND = np.zeros(0, np.int64)          # per opcode: K_*
OP_NSAVED = np.zeros(0, np.int64)        # per opcode: how many saved values it has
OP_NPARAMS = np.zeros(0, np.int64)       # per opcode: float params
OP_SRC = np.zeros((0, 3), np.int64)      # per opcode and saved value: input j (>= 0), result (-1), other (-2)
OP_GRADS = np.zeros((0, 2), np.int64)    # per opcode and input: 1 when the input has a gradient formula


def contrib(op, j, grad, x0, x1, x2, p0, p1):
    """What output element `grad` of elementwise op `op` contributes to input j, with the
    op's saved values x0, x1, x2 at that element and its float params."""
    raise NotImplementedError("bound by the generated device sweep module (gpu/sweep_codegen.py)")


# --- index maps ----------------------------------------------------------------------------------
def shape_numel(xs, p):
    n = 1
    for k in range(xs[p]):
        n *= xs[p + 1 + k]
    return n


def in_index(i, xs, pout, pin):
    """The flat index, in an input of shape xs[pin] broadcast to xs[pout], of output element i."""
    nout = xs[pout]
    lead = nout - xs[pin]
    r = i
    idx = 0
    mul = 1
    for k in range(nout - 1, -1, -1):
        od = xs[pout + 1 + k]
        c = r % od
        r //= od
        if k >= lead:
            idim = xs[pin + 1 + k - lead]
            if idim != 1:
                idx += c * mul
            mul *= idim
    return idx


def out_index(k, c, xs, pout, pin):
    """The c-th output element (of xs[pout]) that input element k (of xs[pin], broadcast)
    is read at: k gives the kept dims' coordinates, c the broadcast dims'."""
    nout = xs[pout]
    lead = nout - xs[pin]
    i = 0
    mul = 1
    r = k
    q = c
    for d in range(nout - 1, -1, -1):
        od = xs[pout + 1 + d]
        idim = 1
        if d >= lead:
            idim = xs[pin + 1 + d - lead]
        if idim == od:
            coord = r % od
            r //= od
        else:
            coord = q % od
            q //= od
        i += coord * mul
        mul *= od
    return i


def saved_at(slots, v, k, idx):
    """Element idx of saved value k: by its device address, or a Python number from v."""
    ref = slots[SW * k + S_REF]
    if ref < 0:
        return v[-ref - 1]
    a = view(ref, slots[SW * k + S_NUMEL], v)
    return a[idx]


def contrib_at(op, j, i, g, xs, pout, edges, e0, slots, v, kp, p0, p1):
    """contrib() for output element i, each saved value read at its own index (an input's
    through the broadcast map, others at i)."""
    grad = g[i]
    x0 = grad
    x1 = grad
    x2 = grad
    ns = OP_NSAVED[op]
    for k in range(ns):
        src = OP_SRC[op, k]
        idx = i
        if src >= 0:
            idx = in_index(i, xs, pout, edges[EW * (e0 + src) + E_SHP])
        x = saved_at(slots, v, kp + k, idx)
        if k == 0:
            x0 = x
        elif k == 1:
            x1 = x
        else:
            x2 = x
    return contrib(op, j, grad, x0, x1, x2, p0, p1)


# --- the rows ------------------------------------------------------------------------------------
def ew_row(op, row, hdr, edges, xs, fp, slots, v, gaddr, st, tid, nt):
    b = row * HW
    n = hdr[b + H_NUMEL]
    pout = hdr[b + H_SHP]
    e0 = hdr[b + H_E0]
    kp = hdr[b + H_KP]
    fpp = hdr[b + H_FP]
    p0 = 0.0
    p1 = 0.0
    if OP_NPARAMS[op] > 0:
        p0 = fp[fpp]
    if OP_NPARAMS[op] > 1:
        p1 = fp[fpp + 1]
    g = view(gaddr[row], n, v)
    for j in range(hdr[b + H_NIN]):
        t = edges[EW * (e0 + j) + E_TGT]
        if t >= 0 and (st[t] & RECV) != 0 and OP_GRADS[op, j] != 0:
            pin = edges[EW * (e0 + j) + E_SHP]
            m = shape_numel(xs, pin)
            d = view(gaddr[t], m, v)
            if m == n:
                i = tid
                while i < n:
                    d[i] += contrib_at(op, j, i, g, xs, pout, edges, e0, slots, v, kp, p0, p1)
                    i += nt
            elif m > 0:
                # broadcast: each thread sums the output elements of the input elements it owns
                reps = n // m
                k = tid
                while k < m:
                    acc = d[k] * 0.0
                    for c in range(reps):
                        acc += contrib_at(op, j, out_index(k, c, xs, pout, pin), g, xs, pout, edges, e0, slots, v,
                                          kp, p0, p1)
                    d[k] += acc
                    k += nt
        cuda.syncthreads()  # input 1 may be input 0's row (x * x)


def view_row(row, hdr, edges, v, gaddr, st, tid, nt):
    """reshape / squeeze / unsqueeze: the data's C order is unchanged."""
    b = row * HW
    t = edges[EW * hdr[b + H_E0] + E_TGT]
    if t < 0 or (st[t] & RECV) == 0:
        return
    n = hdr[b + H_NUMEL]
    g = view(gaddr[row], n, v)
    d = view(gaddr[t], n, v)
    i = tid
    while i < n:
        d[i] += g[i]
        i += nt


def expand_row(row, hdr, edges, xs, v, gaddr, st, tid, nt):
    """expand: the gradient summed back to the input's shape."""
    b = row * HW
    e0 = hdr[b + H_E0]
    t = edges[EW * e0 + E_TGT]
    if t < 0 or (st[t] & RECV) == 0:
        return
    n = hdr[b + H_NUMEL]
    pout = hdr[b + H_SHP]
    pin = edges[EW * e0 + E_SHP]
    m = shape_numel(xs, pin)
    g = view(gaddr[row], n, v)
    d = view(gaddr[t], m, v)
    if m == 0:
        return
    reps = n // m
    k = tid
    while k < m:
        acc = d[k] * 0.0
        for c in range(reps):
            acc += g[out_index(k, c, xs, pout, pin)]
        d[k] += acc
        k += nt


def permute_row(row, hdr, edges, xs, v, gaddr, st, tid, nt):
    """permute / transpose / t: output dim k is input dim perm[k] (xs[ip + 1 + k])."""
    b = row * HW
    e0 = hdr[b + H_E0]
    t = edges[EW * e0 + E_TGT]
    if t < 0 or (st[t] & RECV) == 0:
        return
    n = hdr[b + H_NUMEL]
    pout = hdr[b + H_SHP]
    pin = edges[EW * e0 + E_SHP]
    p = hdr[b + H_IP]
    nd = xs[pout]
    g = view(gaddr[row], n, v)
    d = view(gaddr[t], n, v)
    i = tid
    while i < n:
        r = i
        idx = 0
        for k in range(nd - 1, -1, -1):
            od = xs[pout + 1 + k]
            c = r % od
            r //= od
            stride = 1
            for u in range(xs[p + 1 + k] + 1, nd):
                stride *= xs[pin + 1 + u]
            idx += c * stride
        d[idx] += g[i]
        i += nt


def sum_row(row, hdr, edges, xs, fp, v, gaddr, st, tid, nt):
    """sum / mean: the gradient (at the keepdim shape, xs[H_IP]) broadcast back over the
    input, scaled by fp (1 / count for mean)."""
    b = row * HW
    e0 = hdr[b + H_E0]
    t = edges[EW * e0 + E_TGT]
    if t < 0 or (st[t] & RECV) == 0:
        return
    pin = edges[EW * e0 + E_SHP]
    pkeep = hdr[b + H_IP]
    m = shape_numel(xs, pin)
    scale = fp[hdr[b + H_FP]]
    g = view(gaddr[row], hdr[b + H_NUMEL], v)
    d = view(gaddr[t], m, v)
    i = tid
    while i < m:
        d[i] += g[in_index(i, xs, pin, pkeep)] * scale
        i += nt


# --- the sweep -----------------------------------------------------------------------------------
def sweep(hdr, edges, xs, fp, slots, v, gaddr, st, freed, hi, dt, status):
    """Sweep rows from `hi` down (see the module doc); (code, row) into status."""
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    row = hi
    while row >= 0:
        s = st[row]
        if (s & EXEC) != 0 and (s & (HAS | FED)) != 0:
            b = row * HW
            op = hdr[b + H_OP]
            kind = OP_KIND[op]
            code = SWEPT
            if (s & PRE) != 0:
                code = PREHOOKS
            elif op == OP_OUT or op == OP_ACC or op == OP_EXT:
                kind = K_SKIP
            elif kind == K_PYTHON or op == OP_PYFN or (s & PYRUN) != 0 or hdr[b + H_DT] != dt:
                code = PYNODE
            elif freed[row] != 0 and OP_NSAVED[op] > 0:
                code = FREED
            if code != SWEPT:
                if tid == 0:
                    status[0] = code
                    status[1] = row
                return
            if kind == K_SKIP:
                if op == OP_OUT and (s & HAS) != 0:
                    # output k of a multi-output node, k rows below it: the node must run
                    if tid == 0:
                        st[row - hdr[b + H_IP]] |= FED
                    cuda.syncthreads()
            else:
                if kind == K_EW:
                    ew_row(op, row, hdr, edges, xs, fp, slots, v, gaddr, st, tid, nt)
                elif kind == K_VIEW:
                    view_row(row, hdr, edges, v, gaddr, st, tid, nt)
                elif kind == K_EXPAND:
                    expand_row(row, hdr, edges, xs, v, gaddr, st, tid, nt)
                elif kind == K_PERMUTE:
                    permute_row(row, hdr, edges, xs, v, gaddr, st, tid, nt)
                else:
                    sum_row(row, hdr, edges, xs, fp, v, gaddr, st, tid, nt)
                cuda.syncthreads()
                if tid == 0:
                    st[row] = s | DONE
                    e0 = hdr[b + H_E0]
                    for j in range(hdr[b + H_NIN]):
                        t = edges[EW * (e0 + j) + E_TGT]
                        if t >= 0 and (st[t] & RECV) != 0:
                            st[t] |= HAS
                cuda.syncthreads()
        row -= 1
    if tid == 0:
        status[0] = SWEPT
        status[1] = -1
