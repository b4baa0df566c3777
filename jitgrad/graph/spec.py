"""One entry per primitive (STYLE.md point 1).

An elementwise primitive is declared with its numpy forward and, per input, a gradient
formula written as an expression string, the way derivatives.yaml does it. The same
string is (a) evaluated on Tensors by the Python engine, so `create_graph=True` records
the backward as differentiable ops, and (b) compiled by `engine/codegen.py` into the
scalar body of the op's @njit kernel. One source, two executions (DESIGN.md point 6).

Saved values are named: self and other are inputs 0 and 1 (for every primitive), result is
the output, aux a non-differentiable array. Names usable in a formula: grad, self, other, result, aux (a saved non-differentiable
array, e.g. where's condition), p0, p1 (float params), and the functions in FUNCS.
Broadcasting is never handled in a formula: the engine reduces to the input's shape.

A structural primitive (reductions, matmul, views, indexing, joins, softmax) has a
hand-written kernel in kernels/structural.py and a Tensor-level `rule`; the test
tests/ops/test_kernels_vs_rules.py holds each kernel against its rule.
"""
import re


FUNCS = ("exp", "log", "cos", "sin", "sqrt", "sign", "where", "erf", "tanh", "pow", "zeros_like")
_VARS = ("self", "other", "result", "aux")
# Saved values a structural kernel reads as int64 indices (saved_index in kernels/structural.py);
# every other saved value is read at the row's float dtype. Recording casts to these (_tape.save).
INDEX_SAVES = ("aux", "target")

REGISTRY = {}   # name -> OpSpec
BY_OP = []      # opcode -> OpSpec: a row's H_OP indexes it
SPECS = BY_OP


class OpSpec:
    __slots__ = ("name", "node_name", "op", "base", "kind", "grads", "saves", "rule",
                 "nparams", "_code", "save_users", "index_saves", "kernel")

    def __init__(self, name, node_name, kind, grads=(), saves=(), rule=None, nparams=0, kernel=None):
        self.kernel = kernel  # structural: the @njit backward kernel (standard arguments, kernels/structural.py)
        self.name = name
        self.node_name = node_name
        self.op = len(BY_OP)
        self.base = self.op  # the opcode whose kernel runs this op (aliases share their base's)
        self.kind = kind
        self.grads = tuple(grads)
        self.rule = rule
        self.nparams = nparams
        if kind == "ew":
            used = set(re.findall(r"[A-Za-z_]\w*", " ".join(g for g in grads if g)))
            saves = tuple(v for v in _VARS if v in used)
            self.nparams = max(self.nparams, 2 if "p1" in used else 1 if "p0" in used else 0)
        self.saves = tuple(saves)
        # per saved value, the inputs whose gradient formula reads it (elementwise ops)
        self.save_users = tuple(tuple(j for j, g in enumerate(grads) if g and name in re.findall(r"[A-Za-z_]\w*", g))
                                for name in self.saves) if kind == "ew" else ()
        # per saved value: read as int64 indices (True) or at the row's dtype
        self.index_saves = tuple(kind == "struct" and n in INDEX_SAVES for n in self.saves)
        self._code = None
        BY_OP.append(self)
        REGISTRY[name] = self

    def code(self):
        """Compiled formula code objects for the Python engine."""
        if self._code is None:
            self._code = tuple(compile(g, f"<grad of {self.name}>", "eval") if g else None
                               for g in self.grads)
        return self._code

    def __repr__(self):
        return f"OpSpec({self.name!r}, {self.node_name}, op={self.op})"


def elementwise(name, node_name, *grads, nparams=0):
    return OpSpec(name, node_name, "ew", grads=grads, nparams=nparams)


def structural(name, node_name, saves=(), rule=None, kernel=None):
    return OpSpec(name, node_name, "struct", saves=saves, rule=rule, kernel=kernel)


def alias(name, spec, node_name):
    """The same kernel and rule under another PyTorch node name (e.g. SumBackward1). It gets
    its own opcode, so a row knows its node's name; the scheduler maps it to `base`."""
    s = OpSpec.__new__(OpSpec)
    for f in OpSpec.__slots__:
        setattr(s, f, getattr(spec, f))
    s.name, s.node_name = name, node_name
    s.op = len(BY_OP)
    BY_OP.append(s)
    REGISTRY[name] = s
    return s


# --- rows that are not primitives: the scheduler handles these opcodes itself ---------------
OP_ACC = OpSpec("_acc", "AccumulateGrad", "sink").op   # leaf sink row
OP_EXT = OpSpec("_ext", "ExternalEdge", "sink").op     # edge into an older tape
OP_PYFN = OpSpec("_pyfn", "PythonNode", "sink").op     # runs in Python (custom Function)
OP_OUT = OpSpec("_out", "ExtraOutput", "sink").op      # output k > 0 of a multi-output node
