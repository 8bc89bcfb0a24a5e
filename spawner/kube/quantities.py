"""Kubernetes quantities: what the quota writes, and reading what a configuration wrote.

The quota writes CPUs in millicores at most ("500m", "2") and bytes as plain
whole numbers, never rounded to a unit. A configuration may write the same
limit otherwise (KubeSpawner writes cpu_limit 8 as 8.0, "32Gi" is bytes too),
so limits are compared by value (``same_quantity``).
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any


def cpu_quantity(cpus: float) -> str:
    """CPUs as a quantity: "2", "500m"; never below 1m (Kubernetes' smallest)."""
    milli = max(1, round(cpus * 1000))
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def byte_quantity(size: int | float) -> str:
    """Bytes as a plain whole number, never rounded to a unit."""
    return str(max(1, int(size)))


_QUANTITY = re.compile(r"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
                       r"(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?")
_SUFFIXES = {"Ki": Decimal(2**10), "Mi": Decimal(2**20), "Gi": Decimal(2**30),
             "Ti": Decimal(2**40), "Pi": Decimal(2**50), "Ei": Decimal(2**60),
             "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
             "k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"),
             "T": Decimal("1e12"), "P": Decimal("1e15"), "E": Decimal("1e18")}


def parse_quantity(value: Any) -> Decimal | None:
    """A Kubernetes quantity's value ("8", 8.0, "8000m", "32Gi"); None when it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return Decimal(str(value))
    match = _QUANTITY.fullmatch(value.strip()) if isinstance(value, str) else None
    if match is None:
        return None
    number, suffix = match.group(1), match.group(2) or ""
    if suffix[:1] in ("e", "E"):
        return Decimal(number) * Decimal(10) ** int(suffix[1:])
    return Decimal(number) * _SUFFIXES[suffix]


def same_quantity(a: Any, b: Any) -> bool:
    """Equal as quantities: KubeSpawner writes cpu_limit 8 as 8.0 and mem_limit as an
    int, the quota as "8" and a string of bytes; those are the same limit."""
    qa, qb = parse_quantity(a), parse_quantity(b)
    if qa is not None and qb is not None:
        return qa == qb
    return type(a) is type(b) and a == b  # True is not 1 here
