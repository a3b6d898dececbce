"""Row objects of an acc_check run and the two CSV layouts (result: one row per API; details: one row
per compared output). Column names follow seed 002; the dtype-aware verdict is in trailing columns.
Must not import torch or mindspore.
"""

from dataclasses import dataclass, field
from typing import Optional

from msprobe.core.acc_check.verdict import ERROR, PASS, SKIP

RESULT_COLUMNS = ("API Name", "Forward Test Success", "Backward Test Success", "Message",
                  "Forward Dtype Check", "Backward Dtype Check")
DETAILS_COLUMNS = ("API Name", "Bench Dtype", "Tested Dtype", "Shape", "Cosine", "MaxAbsErr", "MaxRelativeErr",
                   "Status", "Message", "MaxUlpErr", "ReductionLength", "Dtype Status")


@dataclass
class DetailRow:
    """One compared output (`Functional.linear.0.forward.output.0`) or input gradient."""

    api_name: str
    bench_dtype: str
    tested_dtype: str
    shape: tuple
    cosine: float
    max_abs_err: float
    max_rel_err: float
    status: str
    message: str
    ulp_err: float
    reduction_length: int
    dtype_status: str

    def __bool__(self):
        return self.status == PASS

    def cells(self):
        return [self.api_name, self.bench_dtype, self.tested_dtype, str(tuple(self.shape)), _num(self.cosine),
                _num(self.max_abs_err), _num(self.max_rel_err), self.status, self.message, _num(self.ulp_err),
                str(self.reduction_length), self.dtype_status]


@dataclass
class ApiResult:
    """The verdict of one API call: forward, backward ('' when the dump has no backward), details."""

    name: str
    forward: str
    backward: str
    message: str = ""
    forward_dtype: str = ""
    backward_dtype: str = ""
    details: list = field(default_factory=list)
    worst: Optional[DetailRow] = None  # the row with the lowest cosine / largest error, for the summary

    def __bool__(self):
        return self.forward in (PASS, SKIP) and self.backward in (PASS, SKIP, "")

    @property
    def failed(self):
        return ERROR in (self.forward, self.backward)

    @property
    def skipped(self):
        return self.forward == SKIP

    def cells(self):
        return [self.name, self.forward, self.backward, self.message, self.forward_dtype, self.backward_dtype]


def combine(statuses):
    """Status of a direction from its rows: error if any row errs, pass if all pass; '' for no rows."""
    statuses = list(statuses)
    if not statuses:
        return ""
    if ERROR in statuses:
        return ERROR
    if all(s == SKIP for s in statuses):
        return SKIP
    return PASS


def _num(v):
    if v is None:
        return ""
    return repr(float(v))
