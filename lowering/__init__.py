"""Graph rewrites that route subgraphs to `fa4::` ops. Launches no kernel; emits op calls only."""

from .passes import run_torch_ir_passes  # noqa: F401
from .records import Record  # noqa: F401
