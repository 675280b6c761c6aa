"""The executable specification of trellis (EXL3 / QTIP / b12x) formats, in pure PyTorch.

One module per concern, readable top to bottom; see docs/architecture.md for the map. Nothing
here imports :mod:`b12x` or :mod:`oracle`.
"""
