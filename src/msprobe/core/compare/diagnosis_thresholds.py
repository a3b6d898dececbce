"""Tolerances of the divergence diagnosis. Data only: no logic, no imports.

Errors are relative and scale-free (see `diagnosis_rows.row_error`): 0 means identical, 1e-3 means
"off by a thousandth of the tensor's range or norm".
"""

# Below these relative errors two tensors of this dtype count as the same value: the rounding and
# reduction-order noise two correct runs (different kernels or devices) show at that precision. A row
# compared across two dtypes uses the coarser one.
DTYPE_NOISE_FLOOR = {
    "float64": 1e-10,
    "float32": 1e-5,
    "float16": 2e-3,
    "bfloat16": 1.6e-2,
    "float8_e4m3fn": 1.3e-1,
    "float8_e5m2": 2.5e-1,
}
INTEGER_NOISE_FLOOR = 0.0        # integer and bool tensors must match exactly
UNKNOWN_DTYPE_NOISE_FLOOR = 1e-5

# A call "introduces" error strongly when its outputs are at least this many times further off than
# its inputs (or than the noise floor when the inputs match). Weaker introductions are listed after.
AMPLIFICATION = 10.0
# A call whose inputs already diverge is named only when it makes the error this much worse: backward
# passes routinely grow relative error by 10x (exp, division, small gradients), 100x rarely by accident.
AMPLIFIED_ONLY = 100.0
# A backward whose forward diverged reads saved tensors that differ; in the models we measured a correct
# backward stayed within 9x of the error of its forward and gradient inputs, a 1.5x-wrong formula was 58x.
BACKWARD_AMPLIFIED = 30.0

# Collectives move values between ranks: their output may differ because another rank diverged.
COMMUNICATION_PREFIXES = ("Distributed.",)

# Evidence kept per suspect (rows of inputs and outputs, most divergent first) and suspects kept.
EVIDENCE_ROWS = 6
MAX_SUSPECTS = 20
