"""Name `x + y` as `Tensor.__add__` (msProbe's name) although torch hands the mode `Tensor.add`.

The function mode cannot tell `x + y` from `x.add(y)`; the caller's current bytecode instruction can
(BINARY_OP vs CALL). Looked at only for the handful of methods an operator maps to. Under
torch.compile the instruction is the one Dynamo is tracing (capture/compiled_sites.py).
"""

import dis
import functools
import sys

from msprobe.pytorch.capture.api_table import is_inplace

_NB = {"ADD": "add", "AND": "and", "FLOOR_DIVIDE": "floordiv", "LSHIFT": "lshift", "MATRIX_MULTIPLY": "matmul",
       "MULTIPLY": "mul", "REMAINDER": "mod", "OR": "or", "POWER": "pow", "RSHIFT": "rshift",
       "SUBTRACT": "sub", "TRUE_DIVIDE": "truediv", "XOR": "xor"}
_CMP = ("lt", "le", "eq", "ne", "gt", "ge")

# Methods whose call may come from an operator.
OPERATOR_METHODS = frozenset({
    "add", "sub", "mul", "div", "true_divide", "floor_divide", "remainder", "fmod", "matmul", "pow",
    "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_left_shift", "bitwise_right_shift", "neg",
    "bitwise_not", "lt", "le", "eq", "ne", "gt", "ge", "add_", "sub_", "mul_", "div_", "floor_divide_",
    "remainder_", "pow_", "bitwise_and_", "bitwise_or_", "bitwise_xor_", "bitwise_left_shift_",
    "bitwise_right_shift_", "matmul_",
})


def _binary_op_table():
    """BINARY_OP oparg -> dunder (Python 3.11+)."""
    table = {}
    for i, (name, _) in enumerate(getattr(dis, "_nb_ops", ())):
        base = name[3:]
        inplace = base.startswith("INPLACE_")
        op = _NB.get(base[8:] if inplace else base)
        if op:
            table[i] = f"__i{op}__" if inplace else f"__{op}__"
    return table


_BINARY_OP = dis.opmap.get("BINARY_OP")
_COMPARE_OP = dis.opmap.get("COMPARE_OP")
_UNARY = {dis.opmap.get("UNARY_NEGATIVE"): "__neg__", dis.opmap.get("UNARY_INVERT"): "__invert__"}
_OLD = {}  # Python < 3.11: one opcode per operator
for _name, _code in dis.opmap.items():
    for _pre, _fmt in (("BINARY_", "__{}__"), ("INPLACE_", "__i{}__")):
        if _name.startswith(_pre) and _name[len(_pre):] in _NB:
            _OLD[_code] = _fmt.format(_NB[_name[len(_pre):]])
_TABLE = _binary_op_table()


@functools.cache
def operator_table():
    """(opcode << 8 | argument byte) -> (dunder, whether it is in place), for every instruction that is an
    operator: what `instruction_operator` answers, as one lookup (the L1 mode's C handler reads it)."""
    table = {}
    for opcode in {_BINARY_OP, _COMPARE_OP, *_UNARY, *_OLD} - {None}:
        for arg in range(256):
            name = instruction_operator(opcode, arg)
            if name:
                table[opcode << 8 | arg] = (name, is_inplace(name))
    return table


def operator_name(depth=2):
    """The dunder the caller `depth` frames up is executing, or None when it is a plain call."""
    frame = sys._getframe(depth)
    code = frame.f_code.co_code
    i = frame.f_lasti
    if i < 0 or i + 1 >= len(code):
        return None
    return instruction_operator(code[i], code[i + 1])


def instruction_operator(opcode, arg):
    """The dunder an instruction (opcode, its argument byte) executes, or None when it is no operator."""
    if opcode == _BINARY_OP:
        return _TABLE.get(arg)
    if opcode == _COMPARE_OP:
        arg = arg >> 4 if sys.version_info >= (3, 12) else arg
        return f"__{_CMP[arg]}__" if arg is not None and 0 <= arg < len(_CMP) else None
    return _UNARY.get(opcode) or _OLD.get(opcode)
