"""jitgrad.optim: SGD, Adam, AdamW, as torch.optim. Updates run on the parameters' arrays in
place, outside the graph."""
from . import lr_scheduler  # noqa: F401  (torch.optim.lr_scheduler is reachable as an attribute)
from .adam import Adam, AdamW  # noqa: F401
from .optimizer import Optimizer  # noqa: F401
from .sgd import SGD  # noqa: F401
