"""default_collate / default_convert: how a DataLoader turns a list of samples into a batch.

A batch of tensors is stacked along a new first dimension, numpy arrays and numpy scalars
become tensors first, Python floats a float64 tensor and ints an int64 one, strings stay a
list; dicts, named tuples and sequences are collated field by field (a tuple's fields come
back as a list, as in torch). `collate_fn_map` maps an element type to its collate function,
so a user can extend default_collate by type as torch allows.
"""
import collections.abc
import copy
import re

import numpy as np

from jitgrad.graph.tensor import Tensor, as_tensor, tensor
from jitgrad.ops.shape import stack

# numpy dtypes of strings, bytes and objects: torch has no tensor for them
_NP_STR_OR_OBJECT = re.compile(r"[SaUO]")
ERR = "default_collate: batch must contain tensors, numpy arrays, numbers, dicts or lists; found {}"


def _tensors(batch, *, collate_fn_map=None):
    return stack(batch, 0)


def _arrays(batch, *, collate_fn_map=None):
    if _NP_STR_OR_OBJECT.search(batch[0].dtype.str):
        raise TypeError(ERR.format(batch[0].dtype))
    return collate([as_tensor(b) for b in batch], collate_fn_map=collate_fn_map)


def _numpy_scalars(batch, *, collate_fn_map=None):
    return as_tensor(np.array(batch))


def _floats(batch, *, collate_fn_map=None):
    return tensor(batch, dtype=np.float64)


def _ints(batch, *, collate_fn_map=None):
    return tensor(batch)


def _unchanged(batch, *, collate_fn_map=None):
    return batch


default_collate_fn_map = {
    Tensor: _tensors,
    np.ndarray: _arrays,
    (np.bool_, np.number, np.object_): _numpy_scalars,
    float: _floats,
    int: _ints,
    str: _unchanged,
    bytes: _unchanged,
}


def _for_type(elem, collate_fn_map):
    """The collate function for elem: its exact type's, else the first entry it is an instance of."""
    if collate_fn_map is None:
        return None
    fn = collate_fn_map.get(type(elem))
    if fn is not None:
        return fn
    return next((f for t, f in collate_fn_map.items() if isinstance(elem, t)), None)


def collate(batch, *, collate_fn_map=None):
    """Collate a list of samples by the type of the first one (see the module doc)."""
    elem = batch[0]
    fn = _for_type(elem, collate_fn_map)
    if fn is not None:
        return fn(batch, collate_fn_map=collate_fn_map)
    if isinstance(elem, collections.abc.Mapping):
        fields = {key: collate([d[key] for d in batch], collate_fn_map=collate_fn_map) for key in elem}
        return _same_mapping(elem, fields)
    if isinstance(elem, tuple) and hasattr(elem, "_fields"):  # a named tuple keeps its type
        return type(elem)(*(collate(s, collate_fn_map=collate_fn_map) for s in zip(*batch)))
    if isinstance(elem, collections.abc.Sequence):
        size = len(elem)
        if any(len(e) != size for e in batch):
            raise RuntimeError("each element in list of batch should be of equal size")
        fields = [collate(s, collate_fn_map=collate_fn_map) for s in zip(*batch)]
        return fields if isinstance(elem, tuple) else _same_sequence(elem, fields)
    raise TypeError(ERR.format(type(elem)))


def default_collate(batch):
    return collate(batch, collate_fn_map=default_collate_fn_map)


def default_convert(data):
    """What a DataLoader without batching (batch_size=None) does to each sample: numpy
    arrays and scalars become tensors, containers are converted element by element."""
    if isinstance(data, Tensor):
        return data
    if isinstance(data, np.ndarray):
        return data if _NP_STR_OR_OBJECT.search(data.dtype.str) else as_tensor(data)
    if isinstance(data, (np.bool_, np.number)):
        return as_tensor(np.array(data))
    if isinstance(data, collections.abc.Mapping):
        return _same_mapping(data, {key: default_convert(data[key]) for key in data})
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(default_convert(d) for d in data))
    if isinstance(data, tuple):
        return [default_convert(d) for d in data]
    if isinstance(data, collections.abc.Sequence) and not isinstance(data, (str, bytes)):
        return _same_sequence(data, [default_convert(d) for d in data])
    return data


def _same_mapping(like, fields):
    """fields in a mapping of like's type where that type allows (a copy updated, or built
    from a dict), else a dict."""
    try:
        if isinstance(like, collections.abc.MutableMapping):
            out = copy.copy(like)
            out.update(fields)
            return out
        return type(like)(fields)
    except TypeError:
        return fields


def _same_sequence(like, items):
    """items in a sequence of like's type where that type allows, else a list."""
    try:
        if isinstance(like, collections.abc.MutableSequence):
            out = copy.copy(like)
            for i, v in enumerate(items):
                out[i] = v
            return out
        return type(like)(items)
    except TypeError:
        return items
