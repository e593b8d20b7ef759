"""docs/configuration.md's tables, written from the dataclass fields (their defaults and docstrings) and the flags
that set them, so the reference cannot drift from the code: `python -m commands.config_reference` rewrites them, and a
test fails when they are out of date."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from loop.config import LoopConfig
from commands.flags import CONFIG_FLAGS, field_docs
from rlhf.settings_range import field_range

DOC_PATH = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
MARKER = "<!-- Generated from the dataclasses by `python -m commands.config_reference`: edit the fields, not below. -->"


def _default_text(value) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    return f"`{value}`"


def _table(name: str, table, flags_of: dict[str, list[str]]) -> list[str]:
    """The table of one section (or of a table within one, as [ppo.sampling]), then those of its tables."""
    cls = type(table)
    docs = {}
    for base in reversed(cls.__mro__):
        if dataclasses.is_dataclass(base):
            docs.update(field_docs(base))
    parts = [f"## [{name}]\n\n`{cls.__name__}` ({cls.__module__}): {' '.join((cls.__doc__ or '').split())}\n",
             "| key | default | flag | range | meaning |\n|---|---|---|---|---|"]
    inner = []
    for item in dataclasses.fields(table):
        value = getattr(table, item.name)
        shown = _default_text(value)
        if dataclasses.is_dataclass(value):  # a table of its own, listed after this one
            inner += _table(f"{name}.{item.name}", value, flags_of)
            shown = f"[{name}.{item.name}]"
        flag = ", ".join(flags_of.get(f"{name}.{item.name}", []))
        allowed = field_range(item)
        meaning = docs.get(item.name, "").replace("|", "\\|")
        parts.append(f"| `{item.name}` | {shown} | {flag} | {allowed.text if allowed else ''} | {meaning} |")
    return parts + [""] + inner


def reference_tables() -> str:
    """One table per section: key, default, the flags that set it, the numbers it takes (rlhf.settings_range), and the
    field's docstring."""
    flags_of: dict[str, list[str]] = {}
    for flags in CONFIG_FLAGS.values():
        for flag, keys, _extra in flags:
            for key in keys:
                flags_of.setdefault(key, []).append(f"`{flag}`")
    config = LoopConfig()
    return "\n".join(line for section in dataclasses.fields(config)
                     for line in _table(section.name, getattr(config, section.name), flags_of))


def main() -> int:
    text = DOC_PATH.read_text(encoding="utf-8")
    head = text.split(MARKER)[0].rstrip() + "\n\n"
    DOC_PATH.write_text(head + MARKER + "\n\n" + reference_tables(), encoding="utf-8")
    print(f"wrote {DOC_PATH}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
