"""Tests for tether.text: which characters are spelled out as `<U+XXXX>`, how line breaks are
treated in one-line places, and that ordinary text (accents, scripts, emoji) is left alone."""

from __future__ import annotations

import pytest

from tether.text import hostile, pieces, visible


@pytest.mark.parametrize(
    ("char", "shown"),
    [
        ("\u202a", "<U+202A>"),
        ("\u202b", "<U+202B>"),
        ("\u202c", "<U+202C>"),
        ("\u202d", "<U+202D>"),
        ("\u202e", "<U+202E>"),
        ("\u2066", "<U+2066>"),
        ("\u2067", "<U+2067>"),
        ("\u2068", "<U+2068>"),
        ("\u2069", "<U+2069>"),
        ("\u200e", "<U+200E>"),
        ("\u200f", "<U+200F>"),
        ("\u061c", "<U+061C>"),
        ("\u200b", "<U+200B>"),
        ("\u200c", "<U+200C>"),
        ("\u200d", "<U+200D>"),
        ("\u2060", "<U+2060>"),
        ("\ufeff", "<U+FEFF>"),
        ("\x1b", "<U+001B>"),
        ("\x00", "<U+0000>"),
        ("\x07", "<U+0007>"),
        ("\x7f", "<U+007F>"),
        ("\x9b", "<U+009B>"),
        ("\u2028", "<U+2028>"),
    ],
)
def test_each_bidi_zero_width_and_control_character_is_spelled_out(char: str, shown: str) -> None:
    assert visible(f"a{char}b") == f"a{shown}b"
    assert hostile(f"a{char}b")


def test_a_right_to_left_override_cannot_reverse_how_a_file_name_reads() -> None:
    assert visible("invoice\u202egpj.exe") == "invoice<U+202E>gpj.exe"


def test_a_terminal_escape_sequence_loses_its_escape_character() -> None:
    assert visible("\x1b[2J\x1b]0;owned\x07title") == "<U+001B>[2J<U+001B>]0;owned<U+0007>title"


def test_newlines_and_tabs_are_kept_by_default() -> None:
    assert visible("line one\nline two\tend\r") == "line one\nline two\tend\r"
    assert not hostile("line one\nline two")


def test_newlines_are_escaped_when_the_text_must_stay_on_one_line() -> None:
    forged = "deploy\n2026-01-01 INFO approved by admin\r\tx"
    shown = visible(forged, newlines=False)
    assert shown == "deploy\\n2026-01-01 INFO approved by admin\\r\\tx"
    assert all(char not in shown for char in "\n\r\t")
    assert hostile("a\nb", newlines=False)


def test_ordinary_text_in_any_script_is_unchanged() -> None:
    text = "Déployer v1.2.3 — 部署 — نشر — 🚀 ok"
    assert visible(text, newlines=False) == text
    assert not hostile(text, newlines=False)


def test_pieces_mark_which_parts_were_spelled_out() -> None:
    assert pieces("a\u202eb\u200b") == [
        ("a", False),
        ("<U+202E>", True),
        ("b", False),
        ("<U+200B>", True),
    ]
    assert pieces("") == []
    assert pieces("plain") == [("plain", False)]
