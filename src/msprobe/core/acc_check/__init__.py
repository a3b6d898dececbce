"""Offline API pre-check (`msprobe acc_check`), the framework-neutral part.

Input specs and random/real input data from dump records, verdicts, the result/details CSV files with
resume, work splitting across workers, the run loop and its summary. The executors that call the
framework live in `msprobe.pytorch.acc_check` and `msprobe.mindspore.acc_check`.
Must not import torch or mindspore.
"""
