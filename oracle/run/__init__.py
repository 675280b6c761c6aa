"""Running cases: the GPU runners, the grid a GPU job runs, the CUDA-graph protocol, sharding
over GPUs, coverage of the registry by the runners, and replay of saved cases. Imports
:mod:`oracle.report`, :mod:`oracle.cases` and :mod:`oracle.judge`."""
