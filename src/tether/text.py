"""Hostile text made visible: control, bidi and zero-width characters shown as `<U+XXXX>`.

Text that a workflow or an attacker wrote (titles, comments, run ids) reaches terminals, logs and
the inbox; an escape sequence, a right-to-left override or a zero-width joiner can make it read
differently from what it is. `visible` returns a copy where each such character is spelled out.
It is for display only: it never changes what is stored, and it imports nothing from Tether.
"""

from __future__ import annotations

import re

# Bidi embeddings/overrides (U+202A-202E), isolates (U+2066-2069), marks (LRM, RLM, ALM) and
# zero-width characters (ZWSP, ZWNJ, ZWJ, word joiner, the invisible operators U+2061-2065, BOM):
# they change how text reads without being seen. Also the line and paragraph separators, which
# break lines in some terminals and logs.
_INVISIBLE = (
    "\u202a-\u202e\u2066-\u2069\u200e\u200f\u061c\u200b-\u200d\u2060-\u2065\ufeff\u2028\u2029"
)
# C0 controls except tab/newline/carriage return, DEL and the C1 controls (U+0080-009F): these
# include ESC and CSI, which start terminal escape sequences.
_CONTROL = "\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f"
_HOSTILE = re.compile(f"[{_CONTROL}{_INVISIBLE}]")
_HOSTILE_OR_BREAK = re.compile(f"[{_CONTROL}{_INVISIBLE}\t\n\r]")
_BREAKS = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def code(char: str) -> str:
    """The visible spelling of one character: `<U+202E>`."""
    return f"<U+{ord(char):04X}>"


def _spell(match: re.Match[str]) -> str:
    char = match.group()
    return _BREAKS.get(char) or code(char)


def visible(text: str, *, newlines: bool = True) -> str:
    """`text` with each control, bidi or zero-width character replaced by `<U+XXXX>`.

    With `newlines=False` (one-line places: log lines, table cells) newline, carriage return and
    tab become the two characters `\\n`, `\\r`, `\\t` too, so the text cannot forge a line.
    """
    pattern = _HOSTILE if newlines else _HOSTILE_OR_BREAK
    return pattern.sub(_spell, text)


def hostile(text: str, *, newlines: bool = True) -> bool:
    """Whether `visible` would change `text`."""
    pattern = _HOSTILE if newlines else _HOSTILE_OR_BREAK
    return pattern.search(text) is not None


def pieces(text: str) -> list[tuple[str, bool]]:
    """`text` cut into (piece, spelled) pairs, for renderers that style the spelled-out parts.

    Newlines, carriage returns and tabs are kept as they are (HTML shows them as spaces); every
    other hostile character becomes its own piece `("<U+XXXX>", True)`.
    """
    out: list[tuple[str, bool]] = []
    start = 0
    for match in _HOSTILE.finditer(text):
        if match.start() > start:
            out.append((text[start : match.start()], False))
        out.append((code(match.group()), True))
        start = match.end()
    if start < len(text):
        out.append((text[start:], False))
    return out
