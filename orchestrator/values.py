"""What a stored value is, read back: the one definition of a measured number and of a text cell.

A value read from a table can be None, NaN (pandas' missing number), pd.NA, a numpy scalar or a
bool; every reader asks these two questions the same way. Stdlib only (the CLI's start imports it).
"""

from __future__ import annotations

import math
from numbers import Real
from typing import Any


def finite(v: Any) -> bool:
    """A measured number: a finite int or float (numpy scalars included). None, NaN, inf, pd.NA and
    bools are not (a flag is not a figure)."""
    return isinstance(v, Real) and not isinstance(v, bool) and math.isfinite(v)


def as_text(v: Any) -> str:
    """A text column's value, or "" where it is missing (None, NaN, pd.NA)."""
    return v if isinstance(v, str) else ""
