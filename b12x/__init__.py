"""The system under test: trellis W4A16 kernels (CuTe DSL), their planning, dispatch and runtime.

Nothing here imports :mod:`reference` or :mod:`oracle`: a kernel must not lean on what judges it.
"""
