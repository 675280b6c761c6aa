"""How an output is judged: envelopes, metrics, verdicts, the tolerance model and the MoE judge,
plus the generic checks of dispatch tables and tile registries. The oracle's lowest room: it
imports only :mod:`reference`."""
