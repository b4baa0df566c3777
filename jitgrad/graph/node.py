"""Python-side graph nodes (`grad_fn`), with PyTorch's inspection API.

The graph itself lives in the tape (graph/tape.py); a Node is a view of one row,
made when someone asks for it (`tensor.grad_fn`, `next_functions`, the Python engine) and
cached weakly per tape, so the same row always gives the same object while it is alive.
The forward pass never creates nodes: that keeps recording cheap and leaves nothing for
the cycle collector or for backward to tear down.
"""
import threading
import weakref

from jitgrad._core.messages import freed_error, modified_error
from jitgrad.graph import saved as _saved
from jitgrad.graph.hooks import add_hook
from jitgrad.graph.rowinfo import RowInfo
from jitgrad.graph.spec import OP_ACC, OP_EXT, OP_OUT, OP_PYFN, SPECS


class Node:
    # _next caches _inputs: like PyTorch's, a node holds the nodes after it, so a graph being
    # walked stays alive and keeps its identities (references only point towards the leaves)
    __slots__ = ("_tape", "_row", "_next", "__weakref__")

    @property
    def _spec(self):
        return SPECS[self._tape.op(self._row)]

    def name(self):
        return self._spec.node_name

    @property
    def _inputs(self):
        """The node each input's gradient flows to (None for inputs that need none)."""
        nxt = self._next
        if nxt is None:
            tape, row = self._tape, self._row
            nxt = self._next = tuple(node_for(tape, tape.edge_target(row, j)) for j in range(tape.n_inputs(row)))
        return nxt

    @property
    def next_functions(self):
        tape = self._tape
        return tuple((n, tape.edge(self._row, j)[1]) if n is not None else (None, 0)
                     for j, n in enumerate(self._inputs))

    @property
    def metadata(self):
        # kept by the tape, not the node: node objects come and go, the row stays
        return self._tape.metadata.setdefault(self._row, {})

    def _sequence_nr(self):
        return (self._tape.id << 32) | self._row

    def __getattr__(self, name):
        # the saved values, as PyTorch exposes them: _saved_<name> for each name the op's
        # spec declares (graph/spec.py: saves, named as derivatives.yaml names them, and
        # fparams), read the way the spec says
        if name.startswith("_saved_"):
            key = name[len("_saved_"):]
            spec = self._spec
            if key in spec.saves and not key.startswith("_"):
                return _read_saved(self._tape, self._row, spec.saves.index(key))
            if key in spec.fparams and not key.startswith("_"):
                return RowInfo(self).floats(spec.nparams)[spec.fparams.index(key)]
        if name.startswith("_raw_saved_"):
            # the SavedTensor itself (graph/saved.py): hooks can be registered on it
            key = name[len("_raw_saved_"):]
            spec = self._spec
            if key in spec.saves and not key.startswith("_"):
                k = spec.saves.index(key)
                return _saved.entry(self._tape, self._row, k, _read_saved,
                                    none=not _saved.needed_in_row(self._tape, self._row)[k])
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __dir__(self):
        spec = self._spec
        names = [n for n in spec.saves if not n.startswith("_")]
        params = [n for n in spec.fparams if not n.startswith("_")]
        return sorted({*super().__dir__(), *("_saved_" + n for n in names + params),
                       *("_raw_saved_" + n for n in names)})

    def __call__(self, *grads):
        """Run the node's backward on grads (one per output), in the current grad mode, as
        PyTorch's nodes are callable: the gradients of its inputs (one, or a tuple)."""
        if len(grads) != 1:
            raise TypeError(f"expected 1 arguments, got {len(grads)} instead")
        if grads[0] is None:  # an undefined gradient: nothing flows
            return None
        out = self._apply(grads[0])
        return out[0] if len(out) == 1 else out

    def register_hook(self, fn):
        """fn(grad_inputs, grad_outputs) -> new grad_inputs or None, after the node runs."""
        return add_hook(self._tape.node_hooks, self._row, fn)

    def register_prehook(self, fn):
        """fn(grad_outputs) -> new grad_outputs or None, before the node runs."""
        return add_hook(self._tape.node_prehooks, self._row, fn)

    def __repr__(self):
        # the class name, as torch: <AccumulateGrad object ...> though its name() differs
        return f"<{type(self).__name__} object at {hex(id(self))}>"


def _read_saved(tape, row, k):
    """grad_fn._saved_<name> of saved value k: None for a value the op did not save (an
    operand only the gradient of an input that needs none would read), else as the spec
    declares it."""
    stale = tape.stale.get(row)
    if stale is None and tape.is_freed(row):
        raise freed_error()
    modified = tape.value_modified(row, k)  # as PyTorch's unpack checks each saved value's version
    if modified is not None:
        raise modified_error(*modified)
    if not _saved.needed_in_row(tape, row)[k]:
        return None
    ri = RowInfo.__new__(RowInfo)
    ri.tape, ri.row = tape, row
    return ri.saved_named(ri.spec().saves[k], exposed=True)


_classes = {}


def node_class(name):
    """The Node subclass named `name`. PyTorch exposes one Python class per node type;
    `type(y.grad_fn).__name__` is part of the API people rely on, so each node name gets
    its own subclass (aliases of one kernel under one name share it)."""
    cls = _classes.get(name)
    if cls is None:
        with _lazy_lock:  # one class per name, also when two threads ask for a new one at once
            cls = _classes.get(name)
            if cls is None:
                cls = _classes[name] = type(name, (Node,), {"__slots__": ()})
    return cls


class AccumulateGrad(Node):
    """The sink for a leaf: its row in the lowered graph collects the leaf's gradient.
    Unlike other nodes it is created eagerly (once per leaf and tape) and cached on the leaf,
    so that it is the same object wherever the leaf is reached."""
    # _at: (weakref to the tape, row) of its latest sink row, one attribute replaced whole.
    # The node is shared by every thread that records with the leaf, each adding rows to its
    # own tape: a reader must never pair one thread's tape with another's row.
    __slots__ = ("variable", "_metadata", "_at", "_prehooks", "_posthooks")

    # an AccumulateGrad outlives tapes: its hooks live on it ({0: {id: fn}}, see hooks.py)
    def register_hook(self, fn):
        return add_hook(lazy_dict(self, "_posthooks"), 0, fn, on_leaf=True)

    def register_prehook(self, fn):
        return add_hook(lazy_dict(self, "_prehooks"), 0, fn, on_leaf=True)

    @property
    def _tape(self):
        # weak: the tape holds this node (tape.leaves), a strong reference back would make
        # a cycle that only the garbage collector could free
        return self._at[0]()

    @property
    def _row(self):
        return self._at[1]

    def _where(self):
        """(tape or None, row), read together (see _at)."""
        ref, row = self._at
        return ref(), row

    @property
    def metadata(self):
        return lazy_dict(self, "_metadata")

    def name(self):
        # torch's C++ node name; the class name (what torchviz and the seeds print) stays
        # AccumulateGrad
        return "torch::autograd::AccumulateGrad"

    @property
    def _inputs(self):
        return ()

    @property
    def next_functions(self):
        return ()

    def _sequence_nr(self):
        # a sink has no outputs: it runs after everything that feeds it (the leaf's latest
        # tape, which _tape names, may be newer than the graph being run)
        return -1


NOWHERE = (lambda: None, -1)  # AccumulateGrad._at before its first row: no tape, row -1
_lazy_lock = threading.Lock()


def lazy_dict(obj, name):
    """obj.<name>, a dict made on first use: made once, under a lock, so that two threads
    registering hooks on one leaf's node at once keep both."""
    d = getattr(obj, name, None)
    if d is None:
        with _lazy_lock:
            d = getattr(obj, name, None)
            if d is None:
                d = {}
                setattr(obj, name, d)
    return d


def node_for(tape, row):
    """The Node of `row` in `tape` (None for row -1)."""
    if row < 0:
        return None
    ref = tape.nodes.get(row)
    if ref is not None:
        node = ref()
        if node is not None:
            return node
    op = tape.op(row)
    if op == OP_ACC:
        return tape.leaves[row]
    if op == OP_EXT:
        ft, frow = tape.ext[row]
        return node_for(ft, frow)
    if op == OP_PYFN:
        cls = tape.py_nodes[row]._fn._node_cls  # a view of the Function's ctx
    else:
        cls = node_class(SPECS[op].node_name)
    if op == OP_OUT:  # output k of a multi-output node: the node's row is k rows up
        return node_for(tape, row - tape.output_nr(row))
    node = object.__new__(cls)
    node._tape = tape
    node._row = row
    node._next = None
    tape.nodes[row] = weakref.ref(node)
    return node
