"""What a Python rule needs to know about its node, read back from the tape row."""
import gc
import weakref

from jitgrad._core.forward import state as _forward
from jitgrad.graph import tensor as _tensor  # the Tensor <-> Node pair: saved values read as Tensors
from jitgrad.graph.spec import OP_ACC, OP_EXT, SPECS


class RowInfo:
    __slots__ = ("tape", "row")

    def __init__(self, node):
        self.tape = node._tape
        self.row = node._row

    def op(self):
        return self.tape.op(self.row)

    def n_inputs(self):
        return self.tape.n_inputs(self.row)

    def needs(self, j):
        """Whether input j's gradient is wanted (it required grad when the op ran)."""
        return self.tape.edge_target(self.row, j) >= 0

    def in_shape(self, j):
        return self.tape.in_shape(self.row, j)

    def out_shape(self):
        return self.tape.out_shape(self.row)

    def ints(self):
        return self.tape.iparams(self.row)

    def spec(self):
        return SPECS[self.tape.op(self.row)]

    def iparams(self):
        """The int params by the names the spec declares (spec.iparams): ri.iparams().ta."""
        return self.spec().read_ints(self.ints())

    def floats(self, n):
        return self.tape.fparams(self.row, n)

    def saved(self, k, shape):
        return self.tape.saved_value_of_row(self.row, k, shape)

    def input(self, j, data, unpacked=None):
        """Saved input j as a Tensor whose grad_fn is the input's, so that under
        create_graph the rule's ops differentiate through it. unpacked: the data an unpack
        hook gave (else the input is a leaf's, the leaf itself is returned)."""
        tape = self.tape
        t, nr, _ = tape.edge(self.row, j)
        if t < 0:
            x = _tensor.wrap(data)
            if _forward.live:  # its tangent, kept by ops/_forward._note_constant_inputs
                rows = _forward.by_tape.get(tape)
                tangent = rows.get((self.row, -1 - j)) if rows is not None else None
                if tangent is not None:
                    x._fw = tangent
            return x
        op = tape.op(t)
        if op == OP_ACC:
            leaf = tape.leaves[t].variable
            if unpacked is None and tape.leaf_values.get(id(data)) is not data or unpacked is leaf._data:
                return leaf  # the leaf itself: PyTorch's saved original (its .data as it is now)
            # an unpack hook's value for the leaf (or an op's saved copy of one): a tensor
            # whose gradient goes to the leaf, as PyTorch's unpacked leaf has its grad accumulator
            tape.leaf_values[id(data)] = data
            return _tensor.linked(data, tape, t)
        if op == OP_EXT:
            ft, frow = tape.ext[t]
            return _tensor.linked(data, ft, frow, nr)
        return _tensor.linked(data, tape, t, nr)

    def saved_input(self, k, j, exposed=False):
        st = self.tape.hooked(self.row, k)
        if st is not None:
            # packed by hooks: unpack's data, with the input's grad_fn (as PyTorch unpacks)
            if st._none:
                return None
            data = st.unpack_tensor()._data
            return self.input(j, data, unpacked=data)
        data = self.saved(k, self.in_shape(j))
        if exposed:  # torch's saved original: the input tensor itself, while it lives
            t = self.original_input(j)
            if t is not None:
                return t
        return self.input(j, data)

    def original_input(self, j):
        """The live Tensor object that input j was (a leaf's comes back through `input`)."""
        tape = self.tape
        t, nr, _ = tape.edge(self.row, j)
        if t < 0 or tape.op(t) == OP_ACC:
            return None
        if tape.op(t) == OP_EXT:
            tape, t = tape.ext[t]
        return original(tape, t, nr)

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
            return self.saved_input(k, j, exposed)
        if name == "result":
            return self.result(k, always_linked=exposed)
        return self.saved(k, self.out_shape())


# tape -> (rows it had when scanned, {(row, output nr): weakref of the Tensor object})
_originals = weakref.WeakKeyDictionary()


def original(tape, row, nr):
    """The Tensor object that is output `nr` of `row`, if it is alive.
    torch's SavedVariable keeps an input tensor itself, so grad_fn._saved_self is the input.
    A row keeps only the array: holding each input's Tensor would cost every op a reference
    (and a cycle through the tape). So the inspection API (grad_fn._saved_<name>,
    SavedTensor.data) looks the object up among the live ones, once per tape for the rows it
    has then; backward never does."""
    scanned, found = _originals.get(tape, (-1, None))
    if row >= scanned:
        found = {}
        for o in gc.get_referrers(tape):  # (its tensors hold it: one pass over the heap in C)
            if isinstance(o, _tensor.Tensor) and o._tape is tape:
                found.setdefault((o._row, o._output_nr), weakref.ref(o))
        _originals[tape] = (tape.nrows, found)
    ref = found.get((row, nr))
    t = None if ref is None else ref()
    # still that output (an in-place op rebases a tensor onto a new row); its data may be
    # another array than the row's copy of a one-element value, or one .data assigned since,
    # which torch's saved original shows as well
    if t is not None and t._tape is tape and t._row == row and t._output_nr == nr:
        return t
    return None
