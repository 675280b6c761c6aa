"""What the oracle judges: the variant registry, b12x's declarations in its terms, the grid of
cases and its stratified sample. Imports :mod:`oracle.judge` (a variant's tolerance), nothing
above."""
