"""Our own CuTe DSL kernels: one kernel per file, a class per kernel.

Importing this package imports nothing heavy; each module imports `cutlass` itself, so callers
import a kernel module only when they are about to compile it.
"""
