"""acc_check executor for MindSpore dumps: `Mint.*`, `MintFunctional.*`, `Functional.*` (mindspore.ops)
and `Tensor.*` names resolved at run time, re-run in the dumped dtypes and in float64 on the CPU,
forward and backward (via `mindspore.vjp`).
"""
