"""Ops in the `fa4` torch.library namespace and the kernels behind them. Importing registers them."""

from . import attention  # noqa: F401
