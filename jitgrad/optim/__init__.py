"""jitgrad.optim: SGD, Adam, AdamW, RMSprop, Adadelta, as torch.optim. Updates run on the parameters' arrays in
place, outside the graph."""
from jitgrad.optim import lr_scheduler  # noqa: F401  (torch.optim.lr_scheduler is reachable as an attribute)
from jitgrad.optim.adadelta import Adadelta  # noqa: F401
from jitgrad.optim.adam import Adam, AdamW  # noqa: F401
from jitgrad.optim.optimizer import Optimizer  # noqa: F401
from jitgrad.optim.rmsprop import RMSprop  # noqa: F401
from jitgrad.optim.sgd import SGD  # noqa: F401
