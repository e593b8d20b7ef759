"""What text the app takes in: how long a prompt or a better answer may be, and which characters none may hold.

The limits are settings (`[app] max_prompt_chars`, `max_answer_chars` in loop/config.py, whose defaults are these
constants): one 50 MB prompt made one pair take a minute and 7 GB, and every showing sent it whole to the browser.
Control characters (NUL and the like) are refused rather than dropped, as in names (annotate.identity): a file of
NUL bytes is not a prompt, and a character nobody can see should not reach a model or an annotator unnoticed.
"""

from __future__ import annotations

import re
import unicodedata

MAX_PROMPT_CHARS = 16000
"""The default longest prompt, in characters."""
MAX_ANSWER_CHARS = 8000
"""The default longest better answer (demonstration), in characters."""
TEXT_CONTROLS = "\n\t\r"
"""The control characters text may hold: line breaks and tabs."""

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
"""Unicode's control characters (category Cc, which the standard never changes), found at C speed."""
_C0_NAMES = ("NUL SOH STX ETX EOT ENQ ACK BEL BS HT LF VT FF CR SO SI DLE DC1 DC2 DC3 DC4 NAK SYN ETB CAN EM SUB ESC "
             "FS GS RS US").split()


def control_characters(text: str, allowed: str = TEXT_CONTROLS, invisible: bool = False) -> dict[str, int]:
    """Each refused character of `text` -> the position (from 1) of its first occurrence, in the order found.

    Refused: control characters (Unicode category Cc) other than those in `allowed`; with `invisible` also format,
    surrogate, private-use and unassigned characters (all of category C: what names refuse)."""
    found: dict[str, int] = {}
    if invisible:
        candidates = ((index, char) for index, char in enumerate(text) if unicodedata.category(char).startswith("C"))
    else:
        candidates = ((match.start(), match.group()) for match in _CONTROL.finditer(text))
    for index, char in candidates:
        if char not in allowed and char not in found:
            found[char] = index + 1
    return found


def character_name(char: str) -> str:
    """A short name for a character a person cannot see: "NUL", "DEL", "U+0085", "U+200B ZERO WIDTH SPACE"."""
    if char < " ":
        return _C0_NAMES[ord(char)]
    if char == "\x7f":
        return "DEL"
    name = unicodedata.name(char, "")
    return f"U+{ord(char):04X} {name}" if name else f"U+{ord(char):04X}"


def _controls_problem(what: str, text: str) -> str:
    found = control_characters(text)
    if not found:
        return ""
    shown = ", ".join(f"{character_name(char)} at character {position}" for char, position in list(found.items())[:3])
    more = f" and {len(found) - 3} more" if len(found) > 3 else ""
    return f"{what} holds control characters ({shown}{more})"


def prompt_problem(text: str, max_chars: int = MAX_PROMPT_CHARS) -> str:
    """Why `text` cannot be a prompt ("" when it can): too long, or control characters other than line breaks
    and tabs. The reason is a clause for a message that names the file and line before it."""
    length = len(text.strip())  # as stored
    if length > max_chars:
        return (f"the prompt is {length:,} characters; the longest accepted is {max_chars:,} ([app] "
                f"max_prompt_chars): shorten it or raise the limit")
    problem = _controls_problem("the prompt", text)
    return f"{problem}; prompts are text: remove them" if problem else ""


def answer_problem(text: str, max_chars: int = MAX_ANSWER_CHARS) -> str:
    """Why `text` cannot be a better answer ("" when it can), as a sentence for the person who wrote it."""
    length = len(text.strip())  # as stored
    if length > max_chars:
        return (f"Your better answer is {length:,} characters; the longest accepted is {max_chars:,}: please "
                f"shorten it.")
    problem = _controls_problem("Your better answer", text)
    return f"{problem}: please remove them." if problem else ""
