"""einsum composed from permute / reshape / sum / matmul: each pair of operands is contracted
with one batched matmul, so gradients are those of the primitives.

A letter repeated within one operand takes that operand's diagonal (a product with an identity
mask, then a sum); letters that appear in one operand only and not in the output are summed
first; `...` stands for the broadcast dims, right-aligned across operands.
"""
import numpy as np

from jitgrad.graph.tensor import Tensor, tensor
from jitgrad.ops import elementwise as ew
from jitgrad.ops import linalg, reduce, shape

_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
_ELL = [chr(0x100 + i) for i in range(64)]  # private labels for the dims under `...`


def _parse(equation, ops):
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ops):
        raise RuntimeError("einsum(): more operands were provided than specified in the equation"
                           if len(ops) > len(terms) else
                           "einsum(): fewer operands were provided than specified in the equation")
    n_ell = 0
    labels = []
    for i, (term, op) in enumerate(zip(terms, ops)):
        for ch in term.replace("...", ""):
            if ch not in _LETTERS:
                raise RuntimeError(f"einsum(): invalid subscript given at index {lhs.index(ch)} in the equation "
                                   f"string, subscripts must be in [a-zA-Z]")
        named = len(term.replace("...", ""))
        if "..." in term:
            k = op.ndim - named
            if k < 0:
                raise RuntimeError(f"einsum(): the number of subscripts in the equation ({named}) is more than the "
                                   f"number of dimensions ({op.ndim}) for operand {i}")
            n_ell = max(n_ell, k)
            head, tail = term.split("...")
            labels.append(list(head) + _ELL[64 - k:] + list(tail) if k else list(head) + list(tail))
        else:
            if named != op.ndim:
                raise RuntimeError(f"einsum(): the number of subscripts in the equation ({named}) does not match "
                                   f"the number of dimensions ({op.ndim}) for operand {i} and no ellipsis was given")
            labels.append(list(term))
    ell = _ELL[64 - n_ell:]
    if arrow:
        if "..." in rhs:
            head, tail = rhs.split("...")
            out = list(head) + ell + list(tail)
        else:
            out = list(rhs)
        for ch in rhs.replace("...", ""):
            if not any(ch in lab for lab in labels):
                raise RuntimeError(f"einsum(): output subscript {ch} does not appear in the equation for any "
                                   "input operand")
    else:
        counts = {}
        for lab in labels:
            for ch in lab:
                counts[ch] = counts.get(ch, 0) + 1
        out = ell + sorted(ch for ch, c in counts.items() if c == 1 and ch not in _ELL)
    return labels, out


def _diagonals(x, lab, k):
    """Take the diagonal for each label repeated in one operand."""
    while len(set(lab)) != len(lab):
        ch = next(c for c in lab if lab.count(c) > 1)
        i = lab.index(ch)
        j = lab.index(ch, i + 1)
        if x.shape[i] != x.shape[j]:
            raise RuntimeError(f"einsum(): subscript {ch} is repeated for operand {k} but the sizes don't match, "
                               f"{x.shape[i]} != {x.shape[j]}")
        eye = np.eye(x.shape[i], dtype=bool).reshape([x.shape[i] if k in (i, j) else 1 for k in range(x.ndim)])
        x = reduce.sum(ew.where(tensor(eye), x, 0), j)
        lab = lab[:j] + lab[j + 1:]
    return x, lab


def _sum_out(x, lab, keep):
    dims = tuple(i for i, ch in enumerate(lab) if ch not in keep)
    if not dims:
        return x, lab
    return reduce.sum(x, dims), [ch for ch in lab if ch in keep]


def _sizes(pairs):
    sizes = {}
    for x, lab in pairs:
        for n, ch in zip(x.shape, lab):
            if n != 1 or ch not in sizes:
                if ch in sizes and sizes[ch] not in (1, n):
                    raise RuntimeError("einsum(): operands do not broadcast with remapped shapes (original->remapped)")
                sizes[ch] = n if sizes.get(ch, 1) == 1 else sizes[ch]
    return sizes


def _contract(a, la, b, lb, keep, sizes):
    """Contract two operands over the labels they share that `keep` does not need."""
    batch = [ch for ch in la if ch in lb and ch in keep]
    summed = [ch for ch in la if ch in lb and ch not in keep]
    left = [ch for ch in la if ch not in lb]
    right = [ch for ch in lb if ch not in la]

    def arrange(x, lab, order):
        x = shape.permute(x, *[lab.index(ch) for ch in order])
        full = tuple(sizes[ch] for ch in order)
        return shape.expand(x, full) if tuple(x.shape) != full else x

    def prod(chs):
        p = 1
        for ch in chs:
            p *= sizes[ch]
        return p
    a = arrange(a, la, batch + left + summed)
    b = arrange(b, lb, batch + summed + right)
    nb, nl, ns, nr = prod(batch), prod(left), prod(summed), prod(right)
    c = linalg.matmul(shape.reshape(a, (nb, nl, ns)), shape.reshape(b, (nb, ns, nr)))
    lab = batch + left + right
    return shape.reshape(c, tuple(sizes[ch] for ch in lab)), lab


def einsum(equation, *operands):
    if len(operands) == 1 and isinstance(operands[0], (tuple, list)):
        operands = tuple(operands[0])
    if not operands:
        raise RuntimeError("einsum(): must provide at least one operand")
    for op in operands:
        if not isinstance(op, Tensor):
            raise TypeError(f"einsum(): argument 'operands' must be tuple of Tensors, not {type(op).__name__}")
    labels, out = _parse(equation, operands)
    pairs = [_diagonals(x, list(lab), k) for k, (x, lab) in enumerate(zip(operands, labels))]
    sizes = _sizes(pairs)
    for ch in out:
        sizes.setdefault(ch, 1)
    # labels each operand must keep: those in the output or in another operand
    def needed(k, rest):
        keep = set(out)
        for lab in rest:
            keep.update(lab)
        return keep
    x, lab = _sum_out(*pairs[0], needed(0, [p[1] for p in pairs[1:]]))
    for k in range(1, len(pairs)):
        later = [p[1] for p in pairs[k + 1:]]
        y, ly = _sum_out(*pairs[k], needed(k, [lab] + later))
        x, lab = _contract(x, lab, y, ly, needed(k, later), sizes)
    x, lab = _sum_out(x, lab, set(out))
    # a label of size 1 broadcast to nothing (ellipsis dims missing from every operand)
    for ch in out:
        if ch not in lab:
            x = shape.unsqueeze(x, x.ndim)
            lab = lab + [ch]
    x = shape.permute(x, *[lab.index(ch) for ch in out]) if lab != out else x
    full = tuple(sizes[ch] for ch in out)
    return shape.expand(x, full) if tuple(x.shape) != full else x
