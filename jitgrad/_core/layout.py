"""The tape's flat layout: the one definition every reader of the columns imports.

The tape (graph/tape.py) writes these columns while the forward runs; the scheduler
(engine/scheduler.py) and the kernels (kernels/) read them. Nothing else indexes the
columns: Python code reads a row through graph.tape.Row.

  hdr    HW ints per row, at row * HW + H_*:
           H_OP     opcode (index into the op registry, graph/spec.py)
           H_DT     dtype code of the row's gradient (DT_*)
           H_NIN    number of inputs (edges)
           H_E0     first edge, in edge units (the edge's ints start at EW * H_E0)
           H_NUMEL  the output's element count
           H_SHP    pointer into xs: the output's shape
           H_FP     pointer into fp: the float params
           H_KP     the first saved value: a slot index, or for one-element elementwise
                    rows an index straight into v
           H_IP     pointer into xs: the int params; for an OP_OUT row, its output number
  edges  EW ints per input: E_TGT target row (-1: no gradient), E_NR the target's
         output number, E_SHP pointer into xs: the input's shape
  slots  SW ints per saved value: S_REF address of its data, or -(index + 1) into v for
         an inline one-element copy; S_NUMEL; S_KEEP where Python finds it again

CUDA rows (values on the device, gpu/array.DeviceArray) have their own dtype codes,
DT_CUDA_F64 / DT_CUDA_F32: the CPU sweep sees a code other than its run's and hands the
row back, so it never dereferences a device address. Their S_REF is a device address
(DeviceArray.ptr), and they keep no inline copies of device values in v: v holds only
Python numbers used as operands, mirrored to the device with the rest of the tape
(gpu/sweep.py).
"""
import numpy as np

HW = 9  # header width
H_OP, H_DT, H_NIN, H_E0, H_NUMEL, H_SHP, H_FP, H_KP, H_IP = range(HW)
EW = 3  # edge width
E_TGT, E_NR, E_SHP = range(EW)
SW = 3  # slot width
S_REF, S_NUMEL, S_KEEP = range(SW)

# dtype codes of a row (H_DT): the dtype of its output and gradient. A compiled sweep runs
# the rows of one code (its tape's most common float dtype) and hands every other row back
# to Python one by one, its gradient kept there at the row's own dtype (engine/compiled.py);
# DT_OTHER is a dtype without compiled kernels.
DT_F64, DT_F32, DT_OTHER, DT_CUDA_F64, DT_CUDA_F32 = 0, 1, 2, 3, 4
# DT_PY, or'ed into a row's code: the row itself runs in Python whatever the sweep's dtype
# (its inputs have other dtypes or devices, as x.double() or a float32 * float64 product;
# or hooks packed its saved values). DT_MASK takes the output's code back out of it.
DT_PY = 8
DT_MASK = 7
DT_OF = {np.dtype(np.float64): DT_F64, np.dtype(np.float32): DT_F32}   # numpy dtype -> code
NP_OF = {DT_F64: np.dtype(np.float64), DT_F32: np.dtype(np.float32)}   # code -> numpy dtype
CUDA_DT_OF = {np.dtype(np.float64): DT_CUDA_F64, np.dtype(np.float32): DT_CUDA_F32}
CUDA_NP_OF = {DT_CUDA_F64: np.dtype(np.float64), DT_CUDA_F32: np.dtype(np.float32)}

# per-row state bits during a backward call (the scheduler's `st` array):
RECV = 1    # takes gradient: on a path from a root to something that needs it
EXEC = 2    # may run (grad(): on a path to a requested input)
HAS = 4     # got gradient
FED = 8     # one of the node's further outputs got gradient (multi-output nodes)
DONE = 16   # ran
PRE = 32    # hooks to run in Python before the row
PYRUN = 64  # the node itself runs in Python (it has post-hooks)

# what a sweep returns (status, row) with; the driver (engine/compiled.py) acts on it
SWEPT = 0         # done
FREED = 1         # the row's saved values were freed: "backward through the graph a second time"
FALLBACK = 2      # the compiled path does not run this row: the Python engine takes the call
PYNODE = 3        # the node runs in Python (custom Function, post-hooks); resume below it
PREHOOKS = 4      # hooks to run before the row; clear PRE and resume at the row
LEAF_READY = 5    # the row ran and made a hooked leaf ready; resume below the row
NEED_KERNEL = 6   # the row's kernel is not compiled yet (engine/kernel_table.py); resume at the row

# --- jitgrad.compile's replay program (compiler/plan.py writes it; engine/replayer.py and
# the forward kernels read it) ---------------------------------------------------------------
#   prog  FW ints per instruction, at i * FW + F_*:
#           F_OP    opcode (a primitive's; PY_OP: Python runs it, the interpreter returns i)
#           F_ARGS  pointer into fin: the input value ids, then the output value ids: the
#                   result, one per saved value of the op's spec (in spec.saves order: an
#                   input's or the result's id where the op saves those) and any extra output
#           F_NIN   the number of inputs
#           F_FP    pointer into fp: the op's float params (a row's, see H_FP)
#           F_IP    pointer into xs: the op's int params (count, then values; a row's H_IP)
#           F_MADE  bit k set: the kernel writes saved value k (it is neither an input nor
#                   the result, e.g. layer_norm's mean); unset ones it reads or skips
#   vals  VW ints per value: V_ADDR the address of its (C-contiguous) data, V_NUMEL, V_SHP
#         pointer into xs: its shape, V_DT its dtype code (VD_*)
FW = 6
F_OP, F_ARGS, F_NIN, F_FP, F_IP, F_MADE = range(FW)
PY_OP = -1
NOP_OP = -2   # an instruction whose results nothing reads (compiler/plan.py's _live): skipped
VW = 4
V_ADDR, V_NUMEL, V_SHP, V_DT = range(VW)
VD_F64, VD_F32, VD_I64, VD_BOOL, VD_I32 = range(5)
VD_OF = {np.dtype(np.float64): VD_F64, np.dtype(np.float32): VD_F32, np.dtype(np.int64): VD_I64,
         np.dtype(np.bool_): VD_BOOL, np.dtype(np.int32): VD_I32}

# engine/replayer.train_step_packed's int header: scalars, then (offset, length) of each array
# packed in ints (prog fin vals xs hdr edges bxs slots vdst vsrc seed_rows seed_offs sinks
# ptrs sizes), floats (fp bfp) and data (v seed out sc)
PK_LO, PK_HI, PK_BHI, PK_DT, PK_KIND, PK_FLAG1, PK_FLAG2, PK_NPTR, PK_PTRW, PK_NSC, PK_SCW = range(11)
PK_ARRAYS = 11
PK_COUNT = 21
