"""The one configuration of every command: defaults < rlhf-loop.toml < --config FILE < --set < a command's own flags.

```toml
[app]
db = "data/rlhf-loop.db"
[ppo]
kl_ctl = 0.1
```
Each default is written once, on its dataclass field (loop.config); the command-line flags that set a field
(`--rm-lr` is `reward.learning_rate`) take their help and default from that field (`commands.flags`). Unknown
sections or keys are refused by name, so a typo never silently trains with a default. `app.py` builds the object once
and hands it to the command it runs; the app writes it back as TOML for the children it starts.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from loop.config import LoopConfig
from rlhf.settings_range import range_problem

DEFAULT_CONFIG_FILE = "rlhf-loop.toml"


class ConfigError(ValueError):
    """A configuration file or override that cannot be applied; the message names the file, section and key."""


UNSET_WORDS = ("none", "None", "null")
"""What `--set section.key=none` writes to unset a key whose default is unset (a warm start, a seed)."""


def _coerce(value: Any, current: Any, where: str, optional: bool = False) -> Any:
    """Turn a TOML or command-line value into the type of the field's current value; `optional` fields (default
    None) are unset again by the words of UNSET_WORDS, even after a file set them."""
    if optional and value in UNSET_WORDS:
        return None
    if isinstance(value, str) and not isinstance(current, str):
        try:
            value = json.loads(value) if value not in ("None", "none") else None
        except json.JSONDecodeError:
            value = _float_or_text(value) if isinstance(current, float) else value
            if current is not None and isinstance(value, str):
                raise ConfigError(f"{where}: cannot read {value!r} as {type(current).__name__}") from None
    if current is None or value is None:
        return value
    if isinstance(current, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {value!r}")
        return value
    if isinstance(current, float) and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(current, (list, tuple)) and isinstance(value, list):
        return type(current)(value)
    if not isinstance(value, type(current)):
        raise ConfigError(f"{where}: expected {type(current).__name__}, got {value!r}")
    return value


def _float_or_text(text: str) -> float | str:
    """`text` as a float when Python reads it as one (JSON has no `inf` or `nan`: the range check refuses them by
    name), else `text` as it is."""
    try:
        return float(text)
    except ValueError:
        return text


def _keys(table) -> list[str]:
    """Every key of a section, a table within it (ppo.sampling) as its dotted keys."""
    keys = []
    for item in dataclasses.fields(table):
        inner = getattr(table, item.name)
        keys += [f"{item.name}.{key}" for key in _keys(inner)] if dataclasses.is_dataclass(inner) else [item.name]
    return keys


def _table_of(config: LoopConfig, section: str, key: str, where: str):
    """(the dataclass that holds `section.key`, the field's name): a key may name a table within the section
    (`ppo`, `sampling.temperature`); unknown names are refused with the known ones."""
    sections = {f.name for f in dataclasses.fields(config)}
    if section not in sections:
        raise ConfigError(f"{where}: unknown section [{section}]; sections are {', '.join(sorted(sections))}")
    stage = table = getattr(config, section)
    *tables, name = key.split(".")
    for part in tables:
        inner = getattr(table, part, None) if part in {f.name for f in dataclasses.fields(table)} else None
        if not dataclasses.is_dataclass(inner):
            raise ConfigError(f"{where}: unknown key {section}.{key}; keys are {', '.join(_keys(stage))}")
        table = inner
    if name not in {f.name for f in dataclasses.fields(table)}:
        moved = [known for known in _keys(stage) if known.endswith(f".{name}")]
        hint = f" (did you mean {section}.{moved[0]}?)" if len(moved) == 1 and table is stage else ""
        raise ConfigError(f"{where}: unknown key {section}.{key}{hint}; keys are {', '.join(_keys(stage))}")
    if dataclasses.is_dataclass(getattr(table, name)):
        raise ConfigError(f"{where}: {section}.{key} is a table of keys; set {section}.{key}.KEY "
                          f"(keys: {', '.join(_keys(getattr(table, name)))})")
    return table, name


def set_value(config: LoopConfig, section: str, key: str, value: Any, where: str) -> None:
    """Set `section.key` (the key dotted when it is in a table of the section: ppo, sampling.temperature) to `value`,
    converted to the field's type and within its range (rlhf.settings_range); unknown names are refused with the known
    ones."""
    table, name = _table_of(config, section, key, where)
    item = next(f for f in dataclasses.fields(table) if f.name == name)
    value = _coerce(value, getattr(table, name), f"{where}: {section}.{key}", item.default is None)
    problem = range_problem(item, value)
    if problem:
        raise ConfigError(f"{where}: {section}.{key} {problem}")
    setattr(table, name, value)


def _apply_values(config: LoopConfig, section: str, values: dict, where: str, prefix: str = "") -> None:
    """The keys of one TOML table, its own tables ([ppo.sampling]) within it."""
    for key, value in values.items():
        if isinstance(value, dict):
            _apply_values(config, section, value, where, f"{prefix}{key}.")
        else:
            set_value(config, section, prefix + key, value, where)


def _apply_file(config: LoopConfig, path: Path) -> None:
    if not path.is_file():
        raise ConfigError(f"configuration file {path} does not exist")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise ConfigError(f"{path}: {error}") from error
    for section, values in data.items():
        if not isinstance(values, dict):
            raise ConfigError(f"{path}: {section} must be a [section] of keys")
        _apply_values(config, section, values, str(path))


def _check(table, name: str) -> None:
    """Run the checks of `table` (a section, or a table within one) and of the tables it holds, innermost first."""
    for item in dataclasses.fields(table):
        inner = getattr(table, item.name)
        if dataclasses.is_dataclass(inner):
            _check(inner, f"{name}.{item.name}")
    if hasattr(table, "__post_init__"):
        try:
            table.__post_init__()
        except ValueError as error:
            raise ConfigError(f"[{name}]: {error}") from error


def load_config(path: str | Path | None = None, overrides: list[str] | None = None,
                flag_values: list[tuple[str, str, Any, str]] | None = None,
                default_file: str | Path | None = DEFAULT_CONFIG_FILE) -> LoopConfig:
    """Defaults < `default_file` (rlhf-loop.toml in the working directory, when it exists) < the file at `path` <
    `section.key=value` overrides < `flag_values` ((section, key, value, flag) of the command's own flags)."""
    config = LoopConfig()
    if default_file is not None and Path(default_file).is_file() and \
            (path is None or Path(path).resolve() != Path(default_file).resolve()):
        _apply_file(config, Path(default_file))
    if path is not None:
        _apply_file(config, Path(path))
    for override in overrides or []:
        name, sep, value = override.partition("=")
        section, dot, key = name.strip().partition(".")
        if not sep or not dot:
            raise ConfigError(f"--set {override!r}: expected SECTION.KEY=VALUE, for example ppo.kl_ctl=0.05")
        set_value(config, section, key, value.strip(), f"--set {override}")
    for section, key, value, flag in flag_values or []:
        set_value(config, section, key, value, flag)
    for section in dataclasses.fields(config):
        _check(getattr(config, section.name), section.name)
    return config


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(value)


def _flat(values: dict, prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted key, value) of a section's values, a table's keys after its name."""
    return [item for key, value in values.items()
            for item in (_flat(value, f"{prefix}{key}.") if isinstance(value, dict) else [(prefix + key, value)])]


def unset_overrides(config: LoopConfig) -> list[str]:
    """`section.key=none` for every unset value: TOML cannot say "unset", so a child given the configuration as a file
    also gets these, lest rlhf-loop.toml set what the parent had unset."""
    return [f"{section}.{key}=none" for section, values in config.as_dict().items()
            for key, value in _flat(values) if value is None]


def _table_lines(name: str, values: dict) -> list[str]:
    """[name] with its keys, then each table within it as [name.table]."""
    lines = [f"[{name}]"]
    lines += [f"# {key} = (unset)" if value is None else f"{key} = {_toml_value(value)}"
              for key, value in values.items() if not isinstance(value, dict)]
    lines.append("")
    for key, value in values.items():
        if isinstance(value, dict):
            lines += _table_lines(f"{name}.{key}", value)
    return lines


def config_as_toml(config: LoopConfig) -> str:
    """The whole configuration as TOML (unset values as comments), for `--show-config`."""
    return "\n".join(line for section, values in config.as_dict().items() for line in _table_lines(section, values))
