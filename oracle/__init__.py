"""The differential oracle: judges :mod:`b12x` against :mod:`reference`."""
