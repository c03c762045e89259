"""What a value is, read back: the one definition of a measured number and of a text cell, and how
much of a user's value an error message shows.

A value read from a table can be None, NaN (pandas' missing number), pd.NA, a numpy scalar or a
bool; every reader asks these two questions the same way. Stdlib only (the CLI's start imports it).
"""

from __future__ import annotations

import math
import re
import reprlib
from numbers import Real
from typing import Any

SHOWN_MAX = 300
_SHOWN = reprlib.Repr()   # (keyword arguments only from Python 3.12)
_SHOWN.maxlevel, _SHOWN.maxdict, _SHOWN.maxlist, _SHOWN.maxtuple, _SHOWN.maxset = 2, 6, 6, 6, 6
_SHOWN.maxstring = _SHOWN.maxother = 80


def finite(v: Any) -> bool:
    """A measured number: a finite int or float (numpy scalars included). None, NaN, inf, pd.NA and
    bools are not (a flag is not a figure)."""
    return isinstance(v, Real) and not isinstance(v, bool) and math.isfinite(v)


def as_text(v: Any) -> str:
    """A text column's value, or "" where it is missing (None, NaN, pd.NA)."""
    return v if isinstance(v, str) else ""


def shown(v: Any) -> str:
    """A user's value as an error message shows it: its repr, cut to a few hundred characters at most
    (a value built by YAML aliases can be astronomically long written out)."""
    text = _SHOWN.repr(v)
    return text if len(text) <= SHOWN_MAX else text[: SHOWN_MAX - 3] + "..."


_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_safe(v: Any) -> Any:
    """A CSV cell a spreadsheet will not run (OWASP, CSV injection): text beginning = + - @ tab or CR
    gets a leading ' ; numbers and other values pass as they are (a negative number stays a number)."""
    return "'" + v if isinstance(v, str) and v.startswith(_FORMULA_START) else v


def md_inert(v: Any) -> str:
    """Text for a Markdown page a viewer renders: & and < as entities (no raw HTML tag, no entity), > kept
    (readable, harmless alone)."""
    return str(v).replace("&", "&amp;").replace("<", "&lt;")


_CODE_SPAN = re.compile(r"(`+)[^\n]*?\1")   # CommonMark: a run of backticks closed by a run as long


def md_page_inert(text: str) -> str:
    """A whole Markdown page made inert (md_inert) outside its code spans, where a viewer shows text as it is
    (an entity there would show as `&lt;`): what a user named (a model, a flag set, a task, a reason) renders
    as text, never as HTML, wherever the page put it."""
    out, at = [], 0
    for m in _CODE_SPAN.finditer(text):
        out += [md_inert(text[at:m.start()]), m.group(0)]
        at = m.end()
    return "".join(out) + md_inert(text[at:])
