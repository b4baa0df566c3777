"""Pytrees as torch.utils._pytree sees them: tuples, lists, dicts and namedtuples are
nodes, anything else (None included) is a leaf.

The transforms flatten their arguments and results to lists of tensors and rebuild the
structure afterwards; a TreeSpec compares and prints like torch's, because torch.func's
error messages quote it.
"""


class TreeSpec:
    __slots__ = ("type", "context", "children", "num_leaves")

    def __init__(self, type_, context, children):
        self.type = type_
        self.context = context
        self.children = children
        self.num_leaves = sum(c.num_leaves for c in children)

    def __eq__(self, other):
        return (isinstance(other, TreeSpec) and not isinstance(other, LeafSpec) and self.type is other.type
                and self.context == other.context and self.children == other.children)

    def __hash__(self):
        return hash((self.type, len(self.children)))

    def __repr__(self, indent=0):
        text = ""
        if self.children:
            indent += 2
            text = self.children[0].__repr__(indent) + ("," if len(self.children) > 1 else "")
            text += ",".join("\n" + " " * indent + c.__repr__(indent) for c in self.children[1:])
        return f"TreeSpec({self.type.__name__}, {self.context}, [{text}])"

    def unflatten(self, leaves):
        it = iter(leaves)
        return self._build(it)

    def _build(self, it):
        parts = [c._build(it) for c in self.children]
        if self.type is dict:
            return dict(zip(self.context, parts))
        if self.type is list:
            return parts
        if self.type is tuple:
            return tuple(parts)
        return self.type(*parts)  # a namedtuple


class LeafSpec(TreeSpec):
    __slots__ = ()

    def __init__(self):
        self.type, self.context, self.children, self.num_leaves = None, None, [], 1

    def __eq__(self, other):
        return isinstance(other, LeafSpec)

    def __hash__(self):
        return 0

    def __repr__(self, indent=0):
        return "*"

    def _build(self, it):
        return next(it)


_LEAF = LeafSpec()


def _is_namedtuple(x):
    return isinstance(x, tuple) and hasattr(type(x), "_fields")


def tree_flatten(tree):
    """(leaves, spec) of `tree`."""
    leaves = []
    return leaves, _flatten(tree, leaves)


def _flatten(tree, leaves):
    if isinstance(tree, dict):
        keys = list(tree)
        return TreeSpec(dict, keys, [_flatten(tree[k], leaves) for k in keys])
    if isinstance(tree, (list, tuple)):
        kind = type(tree) if _is_namedtuple(tree) else (list if isinstance(tree, list) else tuple)
        return TreeSpec(kind, kind if kind not in (list, tuple) else None, [_flatten(x, leaves) for x in tree])
    leaves.append(tree)
    return _LEAF


def tree_unflatten(leaves, spec):
    return spec.unflatten(leaves)


def tree_leaves(tree):
    return tree_flatten(tree)[0]


def tree_map(fn, tree):
    leaves, spec = tree_flatten(tree)
    return spec.unflatten([fn(x) for x in leaves])


class _Star:
    def __repr__(self):
        return "*"


def treespec_pprint(spec):
    """The structure drawn with `*` for each leaf, as torch's treespec_pprint."""
    return repr(spec.unflatten([_Star()] * spec.num_leaves))
