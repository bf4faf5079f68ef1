"""The slots of the arrays a SEQ kernel and its engine share: what the code generators
(`cep_core.compiler.seq_codegen`) write into kernels and the engines
(`cep_core.engine.seq_base`) read back."""

from enum import StrEnum


class Row(StrEnum):
    """Which array of a channel row an attribute lives in (`Layout.slots`)."""

    INT = "i"
    FLOAT = "f"

INT64_MIN = -(2 ** 63)
INT64_MAX = 2 ** 63 - 1

# ctr slots (an int64 array the kernels update in place; seq_runtime's compact_pending reads
# PN and PKN); POOL: the AIP kernel's Kleene pool fill
PN, PKN, PALIVE, PEL, OVF, ERR, POOL = range(7)
CTR_SIZE = 8
# pending record columns before the per-variable slots (compact_pending reads P_NEXT = 3)
P_PART, P_DEC, P_FIRST, P_NEXT, P_CNT = range(5)
P_FIXED = 5
