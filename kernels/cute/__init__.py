"""Our own CuTe DSL kernels: one kernel per file, a class per kernel, and `compile_utils.py`, what
compiling any of them takes (target arch, cutlass dtypes, a cache of compiled variants, fake-tensor
compiles). Each kernel's host adapter lives one level up (`decode.py`; `decode_int8kv.py` for the int8-KV
main kernel, which shares `decode.py`'s combine kernel and launch helpers).

Importing this package imports nothing heavy; each module imports `cutlass` itself, so callers
import a kernel module only when they are about to compile it.
"""
