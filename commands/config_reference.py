"""docs/configuration.md's tables, written from the dataclass fields (their defaults and docstrings) and the flags
that set them, so the reference cannot drift from the code: `python -m commands.config_reference` rewrites them, and a
test fails when they are out of date."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from loop.config import LoopConfig
from commands.flags import CONFIG_FLAGS, field_docs

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


def reference_tables() -> str:
    """One table per section: key, default, the flags that set it, and the field's docstring."""
    flags_of: dict[str, list[str]] = {}
    for flags in CONFIG_FLAGS.values():
        for flag, keys, _extra in flags:
            for key in keys:
                flags_of.setdefault(key, []).append(f"`{flag}`")
    config = LoopConfig()
    parts = []
    for section in dataclasses.fields(config):
        stage = getattr(config, section.name)
        cls = type(stage)
        docs = {}
        for base in reversed(cls.__mro__):
            if dataclasses.is_dataclass(base):
                docs.update(field_docs(base))
        parts.append(f"## [{section.name}]\n\n`{cls.__name__}` ({cls.__module__}): "
                     f"{' '.join((cls.__doc__ or '').split())}\n")
        parts.append("| key | default | flag | meaning |\n|---|---|---|---|")
        for item in dataclasses.fields(stage):
            flag = ", ".join(flags_of.get(f"{section.name}.{item.name}", []))
            meaning = docs.get(item.name, "").replace("|", "\\|")
            parts.append(f"| `{item.name}` | {_default_text(getattr(stage, item.name))} | {flag} | {meaning} |")
        parts.append("")
    return "\n".join(parts)


def main() -> int:
    text = DOC_PATH.read_text(encoding="utf-8")
    head = text.split(MARKER)[0].rstrip() + "\n\n"
    DOC_PATH.write_text(head + MARKER + "\n\n" + reference_tables(), encoding="utf-8")
    print(f"wrote {DOC_PATH}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
