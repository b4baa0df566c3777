"""The specs of every primitive by their table name (ADD, MATMUL, ...): a view for code that
wants them in one place. Each is declared beside its forward in ops/<family>.py."""
from jitgrad.ops.elementwise import *  # noqa: F401,F403
from jitgrad.ops.linalg import *  # noqa: F401,F403
from jitgrad.ops.nn import *  # noqa: F401,F403
from jitgrad.ops.reduce import *  # noqa: F401,F403
from jitgrad.ops.shape import *  # noqa: F401,F403
