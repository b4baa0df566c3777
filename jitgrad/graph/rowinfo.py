"""What a Python rule needs to know about its node, read back from the tape row."""
from jitgrad._core.layout import E_NR, E_SHP, E_TGT, EW, H_E0, H_FP, H_IP, H_NIN, H_OP, H_SHP, HW
from jitgrad.graph.spec import OP_ACC, OP_EXT, SPECS
from jitgrad.graph import tensor as _tensor  # the Tensor <-> Node pair: saved values read as Tensors


class RowInfo:
    __slots__ = ("tape", "row", "base")

    def __init__(self, node):
        self.tape = node._tape
        self.row = node._row
        self.base = self.row * HW

    def _edge(self, j):
        return EW * (self.tape.hdr[self.base + H_E0] + j)

    def n_inputs(self):
        return self.tape.hdr[self.base + H_NIN]

    def in_shape(self, j):
        return self.tape.shape_at(self.tape.edges[self._edge(j) + E_SHP])

    def out_shape(self):
        return self.tape.shape_at(self.tape.hdr[self.base + H_SHP])

    def ints(self):
        p = self.tape.hdr[self.base + H_IP]
        return tuple(self.tape.xs[p + 1:p + 1 + self.tape.xs[p]])

    def spec(self):
        return SPECS[self.tape.hdr[self.base + H_OP]]

    def iparams(self):
        """The int params by the names the spec declares (spec.iparams): ri.iparams().ta."""
        return self.spec().read_ints(self.ints())

    def floats(self, n):
        p = self.tape.hdr[self.base + H_FP]
        return tuple(self.tape.fp[p:p + n])

    def saved(self, k, shape):
        return self.tape.saved_value_of_row(self.row, k, shape)

    def input(self, j, data):
        """Saved input j as a Tensor whose grad_fn is the input's, so that under
        create_graph the rule's ops differentiate through it."""
        tape = self.tape
        e = self._edge(j)
        t = tape.edges[e + E_TGT]
        if t < 0:
            return _tensor.wrap(data)
        op = tape.hdr[t * HW + H_OP]
        if op == OP_ACC:
            return tape.leaves[t].variable  # the leaf itself (its data is the saved value)
        if op == OP_EXT:
            ft, frow = tape.ext[t]
            return _tensor.linked(data, ft, frow, tape.edges[e + E_NR])
        return _tensor.linked(data, tape, t, tape.edges[e + E_NR])

    def saved_input(self, k, j):
        packed = self.tape.packed.get(self.row)
        if packed is not None:  # saved_tensors_hooks: the tensor unpack returns, as it is
            unpack, values = packed
            return unpack(values[k])
        return self.input(j, self.saved(k, self.in_shape(j)))

    def result(self, k, always_linked=False):
        data = self.saved(k, self.out_shape())
        if always_linked:
            t = _tensor.wrap(data)
            t._requires_grad, t._tape, t._row, t._output_nr = True, self.tape, self.row, 0
            return t
        return _tensor.linked(data, self.tape, self.row)

    def saved_named(self, name, exposed=False):
        """Saved value `name` of the row's spec, as the spec declares it (graph/spec.py,
        `saves`): an argument of the op is read back as that input (with its grad_fn), the
        result as the output, others through the spec's `saved_as` reader (default: the
        array at the output's shape). exposed: for `grad_fn._saved_<name>` (the result is
        then always linked to its node, as PyTorch's saved output)."""
        spec = self.spec()
        k = spec.saves.index(name)
        reader = spec.saved_as.get(name)
        if reader is not None:
            return reader(self, k)
        j = spec.input_of(name)
        if j is not None:
            return self.saved_input(k, j)
        if name == "result":
            return self.result(k, always_linked=exposed)
        return self.saved(k, self.out_shape())
