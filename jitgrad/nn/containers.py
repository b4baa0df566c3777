"""ModuleDict, ParameterList and ParameterDict: modules and parameters held by key or
position, registered so that parameters(), state_dict() and .to() see them."""
from collections import OrderedDict
from collections.abc import Mapping

from jitgrad.graph.tensor import Tensor
from jitgrad.nn.module import Module
from jitgrad.nn.parameter import Parameter


class ModuleDict(Module):
    def __init__(self, modules=None):
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __getitem__(self, key):
        return self._modules[key]

    def __setitem__(self, key, module):
        self.add_module(key, module)

    def __delitem__(self, key):
        del self._modules[key]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules)

    def __contains__(self, key):
        return key in self._modules

    def keys(self):
        return self._modules.keys()

    def values(self):
        return self._modules.values()

    def items(self):
        return self._modules.items()

    def pop(self, key):
        return self._modules.pop(key)

    def clear(self):
        self._modules.clear()

    def update(self, modules):
        pairs = modules.items() if hasattr(modules, "items") else modules
        for key, module in pairs:
            self[key] = module


def _as_parameter(value):
    # torch wraps a plain tensor put in a ParameterList/Dict as a Parameter
    if isinstance(value, Tensor) and not isinstance(value, Parameter):
        return Parameter(value)
    return value


class ParameterList(Module):
    """Values held by position as torch's: a tensor becomes a registered Parameter named
    "0", "1", ...; anything else is kept as a plain attribute of that name (torch's too)."""

    def __init__(self, values=None):
        super().__init__()
        self._size = 0
        for v in values or ():
            self.append(v)

    def __len__(self):
        return self._size

    def _name(self, i):
        i = int(i)
        if not -self._size <= i < self._size:
            raise IndexError(f"index {i} is out of range")
        return str(i % self._size)

    def __iter__(self):
        return iter([self[i] for i in range(self._size)])

    def __getitem__(self, i):
        if isinstance(i, slice):
            return ParameterList([self[j] for j in range(self._size)[i]])
        return getattr(self, self._name(i))

    def __setitem__(self, i, value):
        setattr(self, self._name(i), _as_parameter(value))

    def append(self, value):
        self._size += 1
        setattr(self, str(self._size - 1), _as_parameter(value))
        return self

    def extend(self, values):
        for v in values:
            self.append(v)
        return self

    def extra_repr(self):
        return "\n".join(f"({i}): Parameter containing: [{p.dtype!r} of size {tuple(p.shape)}]" if isinstance(p, Tensor)
                         else f"({i}): Object of type: {type(p).__name__}" for i, p in enumerate(self))


class ParameterDict(Module):
    """Values held by string key as torch's: a tensor becomes a registered Parameter of that
    name, anything else a plain attribute; the keys keep their order in _keys."""

    def __init__(self, parameters=None):
        super().__init__()
        self._keys = {}
        if parameters is not None:
            self.update(parameters)

    def __getitem__(self, key):
        return getattr(self, key)  # as torch: a missing key is an AttributeError

    def __setitem__(self, key, value):
        if not isinstance(key, str):
            raise TypeError(f"Index given to ParameterDict cannot be used as a key as it is not a string (type is "
                            f"'{type(key).__name__}'). Open an issue on github if you need non-string keys.")
        value = _as_parameter(value)
        if isinstance(value, Parameter):  # torch registers it, with the name checks that brings
            self.__dict__.pop(key, None)
            self.register_parameter(key, value)
        else:
            setattr(self, key, value)
        self._keys[key] = None

    def __delitem__(self, key):
        del self._keys[key]
        delattr(self, key)

    def __len__(self):
        return len(self._keys)

    def __iter__(self):
        return iter(self._keys)

    def __contains__(self, key):
        return key in self._keys

    def keys(self):
        return self._keys.keys()

    def values(self):
        return [self[k] for k in self._keys]

    def items(self):
        return [(k, self[k]) for k in self._keys]

    def pop(self, key):
        value = self[key]
        del self[key]
        return value

    def update(self, parameters):
        # as torch: an ordered mapping keeps its order, any other mapping is sorted by key
        if isinstance(parameters, (OrderedDict, ParameterDict)):
            pairs = list(parameters.items())
        elif isinstance(parameters, Mapping):
            pairs = sorted(parameters.items())
        else:
            pairs = list(parameters)
        for key, value in pairs:
            self[key] = value
