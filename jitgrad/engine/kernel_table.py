"""The kernel tables: which compiled kernel runs each opcode's rows, filled as graphs use them.

The sweep (engine/scheduler.py) runs a row that is not a one-element elementwise one by
calling the address in its dtype's table at the row's opcode (kernels/table.py). An
entry is 0 until a graph reaches that opcode: then the sweep returns NEED_KERNEL and the
driver calls `ensure`, which compiles the kernels of every opcode the tape uses that has
none yet (or loads them from their own cache entries), so one tape costs one round trip.
-1 marks an opcode without a compiled kernel (the Python engine runs it).

Which function is an opcode's kernel: an elementwise op's is generated (codegen's
ew_<op>_<name>), a structural op's is its spec's `kernel`, an alias's its base's.

Before compiling anything that is not cached, ensure() says so on stderr, once per
process (_core/verbosity.py), with the names of what it compiles.

Threads: several threads can run their first backward at once. Each dtype's table is
made once, under the lock (a second table would be orphaned: the thread holding it would
be told NEED_KERNEL forever while ensure() filled the other), and entries are only filled
under it; readers check without it (double-checked), so a warm lookup costs a dict get.
"""
import threading
import time

import numpy as np
from numba.core.config import DISABLE_JIT

from jitgrad._core import verbosity
from jitgrad._core.layout import H_DT, H_NUMEL, H_OP, HW, NP_OF
from jitgrad.engine import codegen
from jitgrad.graph.spec import BY_OP
from jitgrad.kernels import _cache, table

_lock = threading.Lock()


class KernelTables:
    """One generated module's tables, one per dtype code (DT_F64, DT_F32)."""

    def __init__(self, module):
        self.module = module
        self.nops = len(BY_OP)
        self.is_ew = np.array([s.kind == "ew" for s in BY_OP], bool)
        self.tables = {}
        self.twins = {}  # structural kernel -> its table_jit twin
        self.primed = set()  # dtype codes whose first backward in this process has run

    def __getitem__(self, code):
        kt = self.tables.get(code)
        if kt is None:
            with _lock:
                kt = self.tables.get(code)
                if kt is None:  # published only once complete: readers take it without the lock
                    kt = np.zeros(self.nops, np.int64)
                    for spec in BY_OP[:self.nops]:
                        if self.kernel(spec) is None:
                            kt[spec.op] = -1
                    self.tables[code] = kt
        return kt

    def kernel(self, spec):
        """The dispatcher that runs `spec`'s rows, or None (sinks, ops without a kernel).
        Called with _lock held (the twins are made once)."""
        if spec.kind == "ew":
            return getattr(self.module, codegen.ew_kernel_name(spec))
        kernel = BY_OP[spec.base].kernel if spec.kind == "struct" else None
        if kernel is None:
            return None
        if kernel not in self.twins:
            self.twins[kernel] = table.for_table(kernel)
        return self.twins[kernel]

    def ensure(self, code, ops, also=()):
        """Fill dtype `code`'s entries for `ops` (opcodes), compiling what is not cached.
        `also`: other compiles about to happen (named in the message), e.g. the engine's."""
        kt = self[code]
        with _lock:
            todo = sorted({int(op) for op in ops if 0 <= op < self.nops and kt[op] == 0})
            if not todo:
                verbosity.compiling(also)
                return
            sig = table.kernel_signature(NP_OF[code])
            kernels = [(op, self.kernel(BY_OP[op])) for op in todo]
            fresh = [] if DISABLE_JIT else [BY_OP[op].name for op, k in kernels if not _cache.is_cached(k, sig)]
            names = [*also, *(["kernels for " + ", ".join(dict.fromkeys(fresh))] if fresh else [])]
            verbosity.compiling(names)
            t0 = time.perf_counter()
            for op, k in kernels:
                kt[op] = table.address(k, sig)
            if fresh:
                verbosity.compiled(names, time.perf_counter() - t0)

    def ensure_rows(self, code, hdr, nrows, also=()):
        """ensure() for every opcode that the rows at dtype `code` among rows 0 .. nrows - 1
        of a tape's header use outside the sweep's inline path (one-element elementwise rows
        need no kernel; rows at another dtype are handed back, and need none at this one)."""
        ops = hdr[H_OP:nrows * HW:HW]
        big = hdr[H_NUMEL:nrows * HW:HW] != 1
        mine = hdr[H_DT:nrows * HW:HW] == code
        self.ensure(code, np.unique(ops[(big | ~self.is_ew[ops]) & mine]), also)
