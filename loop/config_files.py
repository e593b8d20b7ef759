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
            if current is not None:
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


def set_value(config: LoopConfig, section: str, key: str, value: Any, where: str) -> None:
    """Set `section.key` to `value` (converted to the field's type); unknown names are refused with the known ones."""
    sections = {f.name for f in dataclasses.fields(config)}
    if section not in sections:
        raise ConfigError(f"{where}: unknown section [{section}]; sections are {', '.join(sorted(sections))}")
    stage = getattr(config, section)
    fields = {f.name: f for f in dataclasses.fields(stage)}
    if key not in fields:
        raise ConfigError(f"{where}: unknown key {section}.{key}; keys are {', '.join(sorted(fields))}")
    optional = fields[key].default is None
    setattr(stage, key, _coerce(value, getattr(stage, key), f"{where}: {section}.{key}", optional))


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
        for key, value in values.items():
            set_value(config, section, key, value, str(path))


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
        stage = getattr(config, section.name)
        if hasattr(stage, "__post_init__"):
            try:
                stage.__post_init__()
            except ValueError as error:
                raise ConfigError(f"[{section.name}]: {error}") from error
    return config


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(value)


def unset_overrides(config: LoopConfig) -> list[str]:
    """`section.key=none` for every unset value: TOML cannot say "unset", so a child given the configuration as a file
    also gets these, lest rlhf-loop.toml set what the parent had unset."""
    return [f"{section}.{key}=none" for section, values in config.as_dict().items()
            for key, value in values.items() if value is None]


def config_as_toml(config: LoopConfig) -> str:
    """The whole configuration as TOML (unset values as comments), for `--show-config`."""
    lines = []
    for section, values in config.as_dict().items():
        lines.append(f"[{section}]")
        for key, value in values.items():
            lines.append(f"# {key} = (unset)" if value is None else f"{key} = {_toml_value(value)}")
        lines.append("")
    return "\n".join(lines)
