"""Ops in the `fa4` torch.library namespace and the kernels behind them. Importing registers them."""

# Run from the repository root, this directory is also importable as a top-level `kernels`, a name
# transformers imports to probe for the HF kernels package: registering the ops a second time there
# would replace the `torch.ops.fa4` objects the rewrites already hold.
if __name__ == "fa4_inductor.kernels":
    from . import attention  # noqa: F401
