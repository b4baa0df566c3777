"""nn.Parameter: a leaf Tensor that a Module registers as one of its parameters."""
import copy

import numpy as np

from jitgrad.graph.tensor import Tensor, _init_from


class Parameter(Tensor):
    __slots__ = ()

    def __new__(cls, data=None, requires_grad=True):
        t = object.__new__(cls)
        if data is None:
            arr = np.empty(0, np.float32)
        elif isinstance(data, Tensor):
            arr = data._data
        else:  # torch calls data.detach() on anything that is not a Tensor
            raise AttributeError(f"'{type(data).__name__}' object has no attribute 'detach'")
        _init_from(t, arr)
        t.requires_grad = requires_grad
        return t

    def __init__(self, data=None, requires_grad=True):
        pass  # everything happens in __new__

    def __deepcopy__(self, memo):
        # torch's Parameter.__deepcopy__: a new parameter over a copy of the data, no .grad
        if id(self) not in memo:
            memo[id(self)] = type(self)(Tensor._make(copy.deepcopy(self._data, memo)), self.requires_grad)
        return memo[id(self)]

    def __repr__(self):
        return "Parameter containing:\n" + super().__repr__()

    __str__ = __repr__
