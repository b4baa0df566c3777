"""Look at a backward graph: `make_dot` (a graphviz Digraph, like torchviz.make_dot) and
`print_graph` (an indented text outline of the `grad_fn` chain).

Both walk `tensor.grad_fn` and `node.next_functions`, as torchviz does with PyTorch.
jitgrad's nodes are views of tape rows, cached weakly per tape (graph/node.py): the
same row gives the same object for as long as someone holds it, and a node holds the nodes
after it. So the walk keeps every node (and every saved tensor it reads) alive until it is
done; then `id()` is a stable identity and a node reached along two paths appears once.

graphviz (the Python package, `pip install jitgrad[viz]`) is imported only by make_dot;
rendering (`dot.render`, `dot.pipe`) needs Graphviz's `dot` binary, `dot.source` does not.
"""
import sys

from jitgrad.graph.node import AccumulateGrad
from jitgrad.graph.tensor import Tensor

__all__ = ["make_dot", "print_graph"]

SAVED_PREFIX = "_saved_"


def _is_tensor(x):
    return isinstance(x, Tensor)


def _size_to_str(size):
    return "(" + ", ".join("%d" % v for v in size) + ")"


def _saved_values(fn):
    """[(attr, value)] for the values `fn` saved for backward: the `_saved_*` attributes
    of built-in nodes (self/other/result/aux, from the op spec), `saved_tensors` of a
    custom Function node. A node whose saved values were freed by backward gives none."""
    out = []
    if isinstance(fn, AccumulateGrad):
        return out
    try:
        saves = tuple(getattr(fn._spec, "saves", ()) or ())
    except (AttributeError, IndexError):
        saves = ()
    for key in saves:
        try:
            val = getattr(fn, SAVED_PREFIX + key)
        except (AttributeError, RuntimeError):
            continue
        out.append((key, val))
    if not saves:
        try:
            st = fn.saved_tensors  # custom Function nodes forward this to their ctx
        except (AttributeError, RuntimeError):
            st = None
        if st:
            for i, t in enumerate(st):
                out.append(("saved_tensors[%d]" % i, t))
    return out


def _fn_label(fn, show_attrs, max_attr_chars, keep):
    name = type(fn).__name__          # as torchviz: AccumulateGrad, not torch::autograd::...
    if not show_attrs:
        return name
    attrs = {}
    for attr, val in _saved_values(fn):
        keep.append(val)
        if _is_tensor(val):
            attrs[attr] = "[saved tensor]"
        elif isinstance(val, tuple) and any(_is_tensor(t) for t in val):
            attrs[attr] = "[saved tensors]"
        else:
            attrs[attr] = str(val)
    if not attrs:
        return name
    max_attr_chars = max(max_attr_chars, 3)
    col1 = max(len(k) for k in attrs)
    col2 = min(max(len(str(v)) for v in attrs.values()), max_attr_chars)
    sep = "-" * max(col1 + col2 + 2, len(name))
    fmt = "%-" + str(col1) + "s: %" + str(col2) + "s"

    def truncate(s):
        return s[:col2 - 3] + "..." if len(s) > col2 else s
    return name + "\n" + sep + "\n" + "\n".join(fmt % (k, truncate(str(v))) for k, v in attrs.items())


def _resize_graph(dot, size_per_element=0.15, min_size=12):
    size = max(min_size, len(dot.body) * size_per_element)
    dot.graph_attr.update(size="%s,%s" % (size, size))


def make_dot(var, params=None, show_attrs=False, show_saved=False, max_attr_chars=50):
    """The backward graph of `var` (a Tensor or a tuple of Tensors) as a graphviz.Digraph.

    Blue boxes are leaves (AccumulateGrad's variable), named from `params` (a dict
    name -> tensor, e.g. dict(model.named_parameters())) and shown with their shape; grey
    boxes are backward nodes; green boxes are the output tensor(s). With `show_saved`, the
    tensors each node saved for backward are orange boxes tied to it by dotted edges; with
    `show_attrs`, each node's label lists them.
    """
    from graphviz import Digraph

    if params is not None:
        if not all(_is_tensor(p) for p in params.values()):
            raise TypeError("make_dot: params must map names to tensors")
        param_map = {id(v): k for k, v in params.items()}
    else:
        param_map = {}

    node_attr = dict(style="filled", shape="box", align="left", fontsize="10", ranksep="0.1",
                     height="0.2", fontname="monospace")
    dot = Digraph(node_attr=node_attr, graph_attr=dict(size="12,12"))
    seen = set()   # ids of nodes and tensors already drawn
    keep = []      # everything whose id() is used, alive until the walk ends

    def var_label(t, name=None):
        if not name:
            name = param_map.get(id(t), "")
        return "%s\n %s" % (name, _size_to_str(t.size()))

    def add_saved_node(t, name):
        keep.append(t)
        if id(t) not in seen:
            seen.add(id(t))
            if t.is_leaf and t.requires_grad:  # the leaf itself was saved: draw it as a leaf
                dot.node(str(id(t)), var_label(t), fillcolor="lightblue")
            else:
                dot.node(str(id(t)), var_label(t, name), fillcolor="orange")

    def add_nodes(root):
        stack = [root]
        while stack:
            fn = stack.pop()
            if id(fn) in seen:
                continue
            seen.add(id(fn))
            keep.append(fn)

            if show_saved:
                for attr, val in _saved_values(fn):
                    if _is_tensor(val):
                        add_saved_node(val, attr)
                        dot.edge(str(id(fn)), str(id(val)), dir="none", style="dotted")
                    elif isinstance(val, tuple):
                        for i, t in enumerate(val):
                            if _is_tensor(t):
                                add_saved_node(t, "%s[%d]" % (attr, i))
                                dot.edge(str(id(fn)), str(id(t)), dir="none", style="dotted")

            if isinstance(fn, AccumulateGrad):
                v = fn.variable
                keep.append(v)
                if id(v) not in seen:
                    seen.add(id(v))
                    dot.node(str(id(v)), var_label(v), fillcolor="lightblue")
                dot.edge(str(id(v)), str(id(fn)))

            dot.node(str(id(fn)), _fn_label(fn, show_attrs, max_attr_chars, keep))

            nexts = [u for u, _ in fn.next_functions if u is not None]
            for u in nexts:
                keep.append(u)
                dot.edge(str(id(u)), str(id(fn)))
            stack.extend(reversed(nexts))

    def add_base_tensor(t, color="darkolivegreen1"):
        if id(t) in seen:
            return
        seen.add(id(t))
        keep.append(t)
        dot.node(str(id(t)), var_label(t), fillcolor=color)
        fn = t.grad_fn
        if fn is not None:
            keep.append(fn)
            add_nodes(fn)
            dot.edge(str(id(fn)), str(id(t)))

    if isinstance(var, (tuple, list)):
        for v in var:
            add_base_tensor(v)
    else:
        add_base_tensor(var)

    _resize_graph(dot)
    return dot


def print_graph(var, file=None, *, params=None):
    """Print (to `file`, default stdout) and return the `grad_fn` chain of `var` as an
    indented outline, each node's inputs two spaces in under it:

        SumBackward0
          ReluBackward0
            MmBackward0
              AccumulateGrad (w)

    A leaf is named from `params` (a dict name -> tensor) when it is there, else shown by
    its shape. A backward node reached a second time is printed as
    "MulBackward0 (seen above)" and not expanded again, so shared subgraphs stay linear.
    """
    param_map = {id(v): k for k, v in params.items()} if params else {}
    lines = []
    seen = set()
    keep = []

    def leaf_label(fn):
        v = fn.variable
        name = param_map.get(id(v))
        return "AccumulateGrad " + ("(%s)" % name if name is not None else _size_to_str(v.size()))

    def walk(root):
        stack = [(root, 0)]
        while stack:
            fn, depth = stack.pop()
            pad = "  " * depth
            if isinstance(fn, AccumulateGrad):
                lines.append(pad + leaf_label(fn))
                continue
            if id(fn) in seen:
                lines.append(pad + type(fn).__name__ + " (seen above)")
                continue
            seen.add(id(fn))
            keep.append(fn)
            lines.append(pad + type(fn).__name__)
            nexts = [u for u, _ in fn.next_functions if u is not None]
            keep.extend(nexts)
            stack.extend((u, depth + 1) for u in reversed(nexts))

    for t in (var if isinstance(var, (tuple, list)) else (var,)):
        fn = t.grad_fn
        if fn is not None:
            walk(fn)
        elif t.requires_grad:
            name = param_map.get(id(t))
            lines.append("AccumulateGrad " + ("(%s)" % name if name is not None else _size_to_str(t.size())))
        else:
            lines.append("None")

    text = "\n".join(lines) + "\n"
    (sys.stdout if file is None else file).write(text)
    return text
