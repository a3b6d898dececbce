"""Column names of the compare result table per mode (msprobe-facts §8.5), and the rule thresholds
and exemption lists of §8.6. Data only: no logic, no imports.
"""

NPU_NAME, BENCH_NAME = "NPU Name", "Bench Name"
RESULT, ERR_MESSAGE, STACK, DATA_NAME = "Result", "Err_message", "NPU_Stack_Info", "Data_name"
REQUIRES_GRAD_CONSISTENT = "Requires_grad Consistent"
DIAGNOSIS = "Diagnosis"  # the diagnosis' labels (core/diagnosis/labels.py), after Err_message

COMMON = (NPU_NAME, BENCH_NAME, "NPU Dtype", "Bench Dtype", "NPU Tensor Shape", "Bench Tensor Shape",
          "NPU Requires_grad", "Bench Requires_grad")
NPU_STATS = ("NPU max", "NPU min", "NPU mean", "NPU l2norm")
BENCH_STATS = ("Bench max", "Bench min", "Bench mean", "Bench l2norm")
TENSOR_METRICS = ("Cosine", "EucDist", "MaxAbsErr", "MaxRelativeErr", "One Thousandth Err Ratio",
                  "Five Thousandths Err Ratio")
STAT_DIFFS = ("Max diff", "Min diff", "Mean diff", "L2norm diff")
STAT_REL_ERRS = ("MaxRelativeErr", "MinRelativeErr", "MeanRelativeErr", "NormRelativeErr")
MD5 = ("NPU MD5", "BENCH MD5")
TAIL = (REQUIRES_GRAD_CONSISTENT, RESULT, ERR_MESSAGE)

# Columns of each mode, in file order; the stack column (when stack.json exists) goes after Err_message.
MODE_COLUMNS = {
    "tensor": COMMON + TENSOR_METRICS + NPU_STATS + BENCH_STATS + TAIL,
    "statistics": COMMON + STAT_DIFFS + STAT_REL_ERRS + NPU_STATS + BENCH_STATS + TAIL,
    "md5": COMMON + MD5 + TAIL,
    "structure": COMMON + TAIL,
}
TRAILING = {"tensor": (DATA_NAME,)}  # after the stack column

# Result rules (§8.6). Relative errors are fractions here (the table shows them as percentages).
STATS_ERROR_INPUT_MAX = 0.1      # error: every input within 10% ...
STATS_ERROR_OUTPUT_MIN = 0.5     # ... and an output off by more than 50%
STATS_WARN_RATIO = 10.0          # warning: an output 10x worse than the worst input ...
STATS_WARN_ZERO_INPUT = 0.1      # ... or, with exact inputs, an output off by more than 10%
TENSOR_ERROR_INPUT_1E3 = 0.9     # error: inputs' one-thousandth ratio above this ...
TENSOR_ERROR_OUTPUT_1E3 = 0.1    # ... and an output's below this
TENSOR_WARN_INPUT_COSINE = 0.9   # warning: inputs' cosine above this ...
TENSOR_WARN_COSINE_DROP = 0.1    # ... and the output's cosine lower by more than this

# APIs whose outputs are not computed from their inputs' values: only the row checks apply.
INPUT_RULES_EXEMPT = frozenset({"_reduce_scatter_base", "_all_gather_base", "all_to_all_single",
                                "batch_isend_irecv"})
# APIs whose values are meaningless to compare (uninitialised memory, conversions): no rule applies.
ALL_RULES_EXEMPT = frozenset({"empty", "empty_like", "numpy", "to", "__setitem__", "empty_with_format",
                              "new_empty_strided", "new_empty", "empty_strided"})
# Fused projections legitimately differ in dtype/shape between implementations.
FUSED_NAME_PARTS = ("qkv", "gate_up")
