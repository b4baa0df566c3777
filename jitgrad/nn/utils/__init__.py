"""torch.nn.utils: gradient clipping and the parameters <-> vector conversions."""
from jitgrad.nn.utils.clip_grad import clip_grad_norm_, clip_grad_value_  # noqa: F401
from jitgrad.nn.utils.convert_parameters import parameters_to_vector, vector_to_parameters  # noqa: F401
