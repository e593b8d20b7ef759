"""The vote bar's choices: how much better, as Llama 2's annotators said it, plus tie, both bad and skip.

A screen choice is about what the page shows left (A) and right (B); `screen_vote` turns it into the side
Showing.stored_choice reads and the strength the store records (1 slightly, 2 much better; none for the others).
"""

from __future__ import annotations

# Screen choice -> button label and key, in the bar's order: the keys run left to right like the buttons.
VOTE_BUTTONS = (
    ("left_much", "A much better", "1"),
    ("left", "A slightly better", "2"),
    ("tie", "Tie", "3"),
    ("right", "B slightly better", "4"),
    ("right_much", "B much better", "5"),
    ("both_bad", "Both are bad", "6"),
    ("skip", "Skip", "7"),
)
SCREEN_CHOICES = tuple(choice for choice, _label, _key in VOTE_BUTTONS)
CHOICE_LABELS = {choice: label for choice, label, _key in VOTE_BUTTONS}
GRADED_CHOICES = ("left_much", "left", "right", "right_much")
"""The buttons of the A/B scale (primary buttons; the bar keeps them on one row)."""
KEYS = {key: f"vote-{choice}" for choice, _label, key in VOTE_BUTTONS}
"""Keys 1-7 click the vote buttons (ui_style.keyboard_js)."""
VOTE_NOT_SAVED = ("**Your vote could not be saved** (the server's disk is full or the database is unavailable), so it "
                  "was not counted: try again in a minute, or tell your admin.")
"""The status line when the store could not write a vote: the pair stays on screen to vote on again."""


def screen_vote(choice: str) -> tuple[str, int | None]:
    """(screen side or other choice, strength): "left_much" -> ("left", 2), "left" -> ("left", 1), "tie" -> ("tie",
    None). The API's plain "left" and "right" (bench/annotate_load.py) are the slightly-better votes."""
    if choice not in SCREEN_CHOICES:
        raise ValueError(f"unknown choice {choice!r}; use one of {', '.join(SCREEN_CHOICES)}")
    side = choice.removesuffix("_much")
    if side in ("left", "right"):
        return side, 2 if choice.endswith("_much") else 1
    return choice, None


def stored_vote_label(screen_choice: str, strength: int | None) -> str:
    """The label of a vote already stored, as this showing's sides read it ("A much better", "Tie", ...)."""
    if screen_choice in ("left", "right") and strength == 2:
        return CHOICE_LABELS[f"{screen_choice}_much"]
    if screen_choice in ("left", "right") and strength is None:
        return f"{'A' if screen_choice == 'left' else 'B'} better"
    return CHOICE_LABELS[screen_choice]
