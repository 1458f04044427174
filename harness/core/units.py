"""Byte units and how sizes are shown: the one place KiB, MiB, GiB and TiB are defined.

Records and report.json keep the bytes themselves. A size shown to a person goes through `human_bytes` (three
significant digits in the largest unit reached: "56.0 GiB", "1.82 TiB", never "1.82e+03 GiB"), through
`exact_bytes` where it is compared against a log to the byte ("38,168,170,112 B"), or is divided by these
constants where a fixed unit is the point (a table's GiB column, vLLM's own "112.00 GiB").
"""

from __future__ import annotations

KIB = 2**10
MIB = 2**20
GIB = 2**30
TIB = 2**40
UNIT_BYTES = {"B": 1, "KiB": KIB, "MiB": MIB, "GiB": GIB, "TiB": TIB}  # torch's and NVML's spellings
_UNITS = (("TiB", TIB), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB))


def human_bytes(num_bytes: float | int | None, *, none: str = "n/a") -> str:
    """3 significant digits in the largest binary unit the value reaches: 512 B, 8.00 MiB, 56.0 GiB, 1.82 TiB."""
    if num_bytes is None:
        return none
    sign, value = ("-", -num_bytes) if num_bytes < 0 else ("", num_bytes)
    for unit, scale in _UNITS:
        if value >= scale:
            scaled = value / scale
            # 3 significant digits, never an exponent: 1023.9 MiB reads "1024 MiB", not "1.02e+03 MiB".
            digits = 2 if scaled < 10 else (1 if scaled < 100 else 0)
            return f"{sign}{scaled:.{digits}f} {unit}"
    return f"{sign}{int(value)} B"


def round_up(value: int, multiple: int) -> int:
    """value rounded up to a multiple of multiple (> 0), in integers: vLLM's round_up."""
    return -(-value // multiple) * multiple


def next_pow2(n: int) -> int:
    """The smallest power of two >= n, for n >= 1: Triton's block sizes and the sampler's rows."""
    return 1 << max(0, (n - 1).bit_length())


def exact_bytes(num_bytes: int) -> str:
    """Bytes with thousands separators, for the figure a human compares against a log: 38,168,170,112 B."""
    return f"{num_bytes:,} B"
