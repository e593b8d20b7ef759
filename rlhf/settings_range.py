"""The numbers a setting takes, declared once on its dataclass field (`ranged(default, allowed)`) and checked wherever
the setting is made: a dataclass's `__post_init__` (`check_ranges`) and each value a configuration file, `--set` or
flag gives (`range_problem`, loop.config_files). No NaN or infinity anywhere; the docs' tables show each range.

    kl_ctl: float = ranged(0.1, at_least(0))  # refused: -0.1, nan, inf
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

RANGE_KEY = "range"
"""The key of a field's metadata that holds its Range."""


@dataclass(frozen=True)
class Range:
    """The finite numbers a setting takes: from `low` to `high` (None: no bound), each end taken unless `low_open` or
    `high_open` says it is not; `note` says what the number is or what an end means ("a learning rate", "0: off")."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    note: str = ""

    def admits(self, value: float) -> bool:
        """Whether `value` (a number) is finite and within the range."""
        if not math.isfinite(value):
            return False
        above_low = self.low is None or (value > self.low if self.low_open else value >= self.low)
        below_high = self.high is None or (value < self.high if self.high_open else value <= self.high)
        return above_low and below_high

    @property
    def text(self) -> str:
        """The range in words, its note after it: "above 0 (a learning rate)", "0 or more (0: off)"."""
        low = None if self.low is None else f"{'above' if self.low_open else 'at least'} {_number(self.low)}"
        high = None if self.high is None else f"{'below' if self.high_open else 'at most'} {_number(self.high)}"
        if low == "at least 0" and high is None:
            low = "0 or more"
        elif not (self.low_open or self.high_open) and low and high:
            low, high = f"between {_number(self.low)} and {_number(self.high)}", None
        words = " and ".join(part for part in (low, high) if part) or "any number"
        return f"{words} ({self.note})" if self.note else words


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def at_least(low: float, note: str = "") -> Range:
    """`low` or more."""
    return Range(low=low, note=note)


def above(low: float, note: str = "") -> Range:
    """More than `low`."""
    return Range(low=low, low_open=True, note=note)


def between(low: float, high: float, note: str = "", low_open: bool = False, high_open: bool = False) -> Range:
    """From `low` to `high`, both taken unless `low_open` / `high_open`."""
    return Range(low=low, high=high, low_open=low_open, high_open=high_open, note=note)


LEARNING_RATE = above(0, "a learning rate")
"""An optimiser's step size: 0 trains nothing, a negative one climbs the loss."""
SHARE = between(0, 1, "a share")
"""A fraction of something (votes flipped, pairs drawn at random, steps warming up)."""
SEED = between(0, 2**32 - 1, "a seed")
"""A seed: accelerate's set_seed hands it to numpy, which takes 0 to 2**32 - 1."""
POSITIVE_COUNT = at_least(1)
"""A number of things that cannot be none (steps, epochs, a batch's rows, tokens)."""


def ranged(default: Any, allowed: Range) -> Any:
    """A dataclass field with `default` whose values must lie in `allowed`."""
    return dataclasses.field(default=default, metadata={RANGE_KEY: allowed})


def field_range(item: dataclasses.Field) -> Range | None:
    """The Range declared on the dataclass field `item`; None for a field declared without one."""
    return item.metadata.get(RANGE_KEY)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def range_problem(item: dataclasses.Field, value: Any) -> str | None:
    """Why `value` cannot be the setting `item` ("must be above 0 (a learning rate), not -1e-05"), or None when it
    can: an optional setting (default None) may be None; a number field takes a finite number in its range, a whole
    one when the field is an int; a field without a range takes any finite number, and anything when not a number."""
    allowed = field_range(item)
    if value is None and item.default is None:
        return None
    if allowed is None:
        return f"must be a finite number, not {value!r}" if _is_number(value) and not math.isfinite(value) else None
    whole = "int" in str(item.type).replace(" ", "").split("|")
    if not _is_number(value) or (whole and not isinstance(value, int)):
        kind = "a whole number " if whole else "a number "
    else:
        kind = "" if math.isfinite(value) else "a finite number "
    if kind or not allowed.admits(value):
        return f"must be {kind}{allowed.text}, not {value!r}"
    return None


def check_ranges(table: Any) -> None:
    """Raise ValueError naming the first field of the dataclass `table` whose value is outside its range."""
    for item in dataclasses.fields(table):
        problem = range_problem(item, getattr(table, item.name))
        if problem:
            raise ValueError(f"{item.name} {problem}")
