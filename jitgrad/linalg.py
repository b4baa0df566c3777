"""torch.linalg's norms and cross product (composed ops, see ops/mathops.py)."""
from jitgrad.ops.mathops import linalg_cross as cross  # noqa: F401
from jitgrad.ops.mathops import linalg_norm as norm  # noqa: F401
from jitgrad.ops.mathops import matrix_norm, vector_norm  # noqa: F401
