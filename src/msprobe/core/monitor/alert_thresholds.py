"""Data: the alert rules' defaults, calibrated so that ordinary training raises nothing.

Calibrated on 20 steps of each example model (`examples/pytorch_models.py`, `examples/mindspore_models.py`;
MLP/Adam, transformer/AdamW, CNN/SGD-momentum; three seeds each), every data type and op of
`examples/monitor_config.json`: with the guards below, the largest value seen against its series' recent
maximum was 2.7x, while a gradient spike planted by scaling the loss by 1000 showed as 1100x or more
(`tests/monitor/test_quiet_defaults.py` holds both ends). Must not import torch or mindspore.
"""

# rule name -> threshold used when the config gives none
RULE_DEFAULT_THRESHOLD = {
    "AnomalyTurbulence": 3.0,   # a magnitude above (1 + 3) = 4x the largest of its recent values
    "AnomalyNan": 1e10,         # NaN, or a magnitude above this
}
# AnomalyTurbulence compares a value with the last this-many recorded values of its own series
TURBULENCE_WINDOW = 10
# ... and only once the series has this many non-zero values (the first steps of any run move fast)
TURBULENCE_MIN_HISTORY = 3
# a value whose per-element size is below this fraction of the largest of its data type at that step is
# near zero (the gradient of a conv bias ahead of BatchNorm is rounding noise, ~1e-7 of the others)
NEAR_ZERO_FRACTION = 1e-4
