"""torch.backends: the flags code written for PyTorch sets or reads before it picks a device
(`torch.backends.mps.is_available()`, `torch.backends.cudnn.benchmark = True`). jitgrad has
no MPS backend and does not use cuDNN: these say so, and their flags change nothing."""
from jitgrad.backends import cudnn, mps  # noqa: F401
