"""Saved values as PyTorch's SavedVariable exposes them: `grad_fn._raw_saved_<name>` is a
SavedTensor, whose `register_hooks(pack, unpack)` replaces the stored value by what pack
returns, and `saved_tensors_hooks` packs every value an op saves the same way.

A row's saved values stay in the tape's columns (graph/tape.py); a SavedTensor is made
only when hooks pack a value or someone asks for `_raw_saved_<name>`, and is kept in
tape.packed[row] (one entry per saved value, None until made). Readers ask tape.hooked(row, k)
whether to unpack instead of reading the column. A row with a hooked value runs in the
Python engine (the compiled kernels read the columns).
"""
import weakref

from jitgrad._core import modes as _modes
from jitgrad.graph.spec import SPECS

CALL_ERROR = ("register_hooks(): incompatible function arguments. The following argument types are supported:\n"
              "    1. (self: torch._C._autograd.SavedTensor, arg0: collections.abc.Callable, "
              "arg1: collections.abc.Callable) -> None\n")
FREED_ERROR = ("Calling register_hooks on a saved tensor after it has been freed. Saved intermediate values of the "
               "graph are freed when you call .backward() or autograd.grad(). Specify retain_graph=True if you "
               "need to backward through the graph a second time or if you need to access saved variables after "
               "calling backward.")
TWICE_ERROR = ("Calling register_hooks on a saved tensor whose hooks have already been set. "
               "Hint: only one pair of hooks is allowed at a time.")
NONE_ERROR = "Calling register_hooks on a saved tensor with value None is forbidden"


class SavedTensor:
    """One saved value of one node (torch._C._autograd.SavedTensor)."""
    __slots__ = ("_tape_ref", "_row", "_k", "_none", "_read", "_hooks", "_packed", "__weakref__")

    def __init__(self, tape, row, k, none, read):
        # weak: the tape holds this object (tape.packed), which must not hold it back
        self._tape_ref = weakref.ref(tape)
        self._row, self._k = row, k
        self._none = none        # the op saved nothing here (an operand no gradient reads)
        # read(tape, row, k): the value as `_saved_<name>` gives it, what a later pack
        # receives (graph/node.py reads it; it sits above this module)
        self._read = read
        self._hooks = None       # (pack, unpack) once set
        self._packed = None

    def register_hooks(self, *hooks):
        if len(hooks) != 2 or not all(callable(h) for h in hooks):
            raise TypeError(CALL_ERROR)
        tape = self._tape_ref()
        if tape is None or tape.is_freed(self._row):
            raise RuntimeError(FREED_ERROR)
        if self._hooks is not None:
            raise RuntimeError(TWICE_ERROR)
        if self._none:
            raise RuntimeError(NONE_ERROR)
        self._pack(hooks, self._read(tape, self._row, self._k))
        tape.run_in_python(self._row)

    def _pack(self, hooks, t):
        self._packed = pack(hooks[0], t)
        self._hooks = hooks

    def is_packed(self):
        return self._hooks is not None

    def unpack(self):
        """The saved value, as grad_fn._saved_<name> gives it (None: nothing saved)."""
        tape = self._tape_ref()
        return None if self._none or tape is None else self._read(tape, self._row, self._k)

    @property
    def data(self):
        """What is stored: pack's result once hooks are set, else the value itself."""
        return self._packed if self._hooks is not None else self.unpack()

    @property
    def unpack_hook(self):
        return None if self._hooks is None else self._hooks[1]

    def unpack_tensor(self):
        return checked_unpack(self._hooks[1], self._packed)


def checked_unpack(unpack, packed):
    """unpack(packed), which must give a Tensor."""
    out = unpack(packed)
    if not hasattr(out, "_data"):
        raise TypeError(f"Output of saved tensor unpack_hook expected to be a Tensor but got result of type "
                        f"{type(out).__name__}")
    return out


def pack(hook, t):
    """hook(t) under no_grad, as PyTorch packs; a pack that writes t in place is an error."""
    before = t._version
    with _modes.no_grad():
        packed = hook(t)
    if t._version != before:
        raise RuntimeError(
            "A saved tensor pack hook is modifying its input in place. Tensors provided as input to pack hook "
            "cannot be modified by in-place operations as this can lead to unexpected side-effects. Please "
            "open an issue if you need to perform in-place operations on the input to a pack hook.")
    return packed


def entry(tape, row, k, read, none=False):
    """Saved value k of `row` as a SavedTensor, made on first use (see SavedTensor)."""
    entries = tape.packed.get(row)
    if entries is None:
        entries = tape.packed[row] = [None] * len(SPECS[tape.op(row)].saves)
    st = entries[k]
    if st is None:
        st = entries[k] = SavedTensor(tape, row, k, none, read)
    return st


def pack_row(tape, row, tensors, hooks):
    """saved_tensors_hooks: pack each tensor the row saves (None: a value the op does not
    save, see needed) with the innermost hooks; the row then runs in the Python engine."""
    for k, t in enumerate(tensors):
        st = entry(tape, row, k, None, none=t is None)  # packed now: read is never needed
        if t is not None:
            st._pack(hooks, t)
    tape.run_in_python(row)


def needed(spec, requires):
    """Per saved value of `spec`, whether a gradient that will be computed reads it
    (requires: per input, whether it requires grad). PyTorch saves only those: x * y with
    only x requiring grad saves y. An op that declares no save_users saves all it declares."""
    key = (spec, *requires) if len(requires) <= 4 else None
    need = _NEEDED.get(key)
    if need is None:
        if not spec.save_users:
            need = (True,) * len(spec.saves)
        else:
            need = tuple(any(requires[j] for j in users if j < len(requires)) for users in spec.save_users)
        if key is not None:
            _NEEDED[key] = need
    return need


# (spec, requires...) -> needed's answer: asked once per recorded structural op, and the
# answers are few (one per op and pattern of up to 4 inputs requiring grad; ops with more
# inputs, cat / stack, are not cached: their patterns could grow without bound)
_NEEDED = {}


def needed_in_row(tape, row):
    spec = SPECS[tape.op(row)]
    return needed(spec, [tape.edge_target(row, j) >= 0 for j in range(tape.n_inputs(row))])
