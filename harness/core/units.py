"""Human sizes: bytes in B, KiB, MiB, GiB or TiB with three significant digits ("56.0 GiB", "1.82 TiB").

Every human-facing size goes through `human_bytes`, so no output says "1.82e+03 GiB"; records and report.json
keep the bytes themselves.
"""

from __future__ import annotations

_UNITS = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


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


def exact_bytes(num_bytes: int) -> str:
    """Bytes with thousands separators, for the figure a human compares against a log: 38,168,170,112 B."""
    return f"{num_bytes:,} B"
