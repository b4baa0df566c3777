"""Python-side graph nodes (`grad_fn`). They carry PyTorch's inspection API and own the
lifetime of the graph; the engine never walks them on the compiled path: each node only
knows its (tape, row) in the lowered arrays."""


_HW, _H_E0 = 9, 3  # the tape's header layout (autograd/_tape.py)


class Node:
    # _metadata and _ext are rarely set, so recording leaves them unset (read with getattr)
    __slots__ = ("_spec", "_tape", "_row", "_inputs", "_k", "_metadata", "_ext", "__weakref__")

    def name(self):
        return self._spec.node_name

    @property
    def __name__(self):
        return self.name()

    @property
    def next_functions(self):
        tape = self._tape
        e0 = tape.hdr[self._row * _HW + _H_E0]
        return tuple((n, tape.edges[3 * (e0 + j) + 1]) if n is not None else (None, 0)
                     for j, n in enumerate(self._inputs))

    @property
    def metadata(self):
        md = getattr(self, "_metadata", None)
        if md is None:
            md = self._metadata = {}
        return md

    def _sequence_nr(self):
        return (self._tape.id << 32) | self._row

    def __repr__(self):
        return f"<{self.name()} object at {hex(id(self))}>"


def _make_node_class(name):
    # PyTorch exposes one Python class per node type; `type(y.grad_fn).__name__` is part of
    # the API people rely on, so each op gets its own subclass.
    return type(name, (Node,), {"__slots__": ()})


class AccumulateGrad(Node):
    """The sink for a leaf: its row in the lowered graph collects the leaf's gradient."""
    __slots__ = ("variable",)

    def name(self):
        return "AccumulateGrad"

    @property
    def next_functions(self):
        return ()
