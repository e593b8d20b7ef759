"""The one configuration of every command: defaults < rlhf-loop.toml < --config FILE < --set < a command's own flags.

```toml
[app]
db = "data/rlhf-loop.db"
[ppo]
kl_ctl = 0.1
```
Each default is written once, on its dataclass field; the command-line flags that set a field (`--rm-lr` is
`reward.learning_rate`) take their help and default from that field (`commands.flags`). Unknown sections or keys are
refused by name, so a typo never silently trains with a default. `app.py` builds the object once and hands it to
the command it runs.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from rlhf.round.config import TrainingConfig
from rlhf.sft.config import SFTConfig

DEFAULT_CONFIG_FILE = "rlhf-loop.toml"


class ConfigError(ValueError):
    """A configuration file or override that cannot be applied; the message names the file, section and key."""


@dataclass
class AppSettings:
    """What every command works on."""

    db: str = "data/rlhf-loop.db"
    """The SQLite database of prompts, pairs, votes, policies and rounds."""
    model: str = "default"
    """Base model: 'default' (the embedded SmolLM2-135M-Instruct), a Hugging Face id or a local folder."""
    overlap: int = 1
    """How many people vote on each pair (more than 1 measures agreement)."""


@dataclass
class ServeSettings:
    """The annotation app in the browser."""

    host: str = "127.0.0.1"
    """Address to listen on; anything but this machine needs an auth file."""
    port: int = 7860
    """Port to listen on."""
    share: bool = False
    """Create a public Gradio link (needs an auth file)."""
    auth: str | None = None
    """Auth file of name:scrypt-hash lines (written by --add-user); required off localhost."""
    admins: list = field(default_factory=list)
    """Names made admin at start; when empty, the first person to sign in is admin."""
    first_batch: int = 32
    """Pairs generated in the background on a first start with no pairs (0: none)."""
    auto_round_every: int = 0
    """Start a training round after every N new votes (0: off; also set in Admin)."""

    def __post_init__(self) -> None:
        if self.first_batch < 0 or self.auto_round_every < 0:
            raise ValueError("first_batch and auto_round_every take 0 or a positive number")


@dataclass
class SimulateSettings:
    """Simulated annotators (`--simulate`, `--demo-loop`)."""

    annotator: str = "polite"
    """The demo loop's simulated annotator and judge: a built-in rule or module:function."""
    votes: int = 50
    """Votes to cast (per round in the demo loop)."""
    noise: float = 0.0
    """Share of a/b votes flipped, like disagreeing people."""
    annotator_name: str | None = None
    """Name the votes are cast under (default sim:RULE)."""
    seed: int = 0
    """Seed of the simulated votes, their flips and the demo's evaluation prompts."""
    rounds: int = 3
    """Rounds of the demo loop."""
    eval_prompts: int = 64
    """Prompts kept out of PPO on which the demo loop judges each policy: the same ones every round and every run on a
    database (drawn with the seed)."""
    eval_answers: int = 1
    """Answers per evaluation prompt, each judged against the first policy's (more narrow the win rate when the
    judge ties often)."""
    reward: str = "model"
    """PPO's reward in the demo loop: "model" (the reward model trained on the votes) or "oracle" (the simulated
    annotator's own score of each answer). Only annotators with a score have an oracle; the votes are still cast and
    the reward model still trained and measured."""
    oracle_ceiling: bool = False
    """After each demo round, PPO once more from the same policy with the annotator's own score as the reward, judged
    beside it (oracle_win_rate). Same settings and seed; its policy is a folder beside the round's (ceiling-policy),
    not a policy of the loop: the most the round's PPO could buy with a perfect reward model."""

    def __post_init__(self) -> None:
        if self.eval_answers < 1 or self.eval_prompts < 1:
            raise ValueError(f"eval_prompts and eval_answers must be at least 1 (got {self.eval_prompts} and "
                             f"{self.eval_answers}): the win rate needs answers to judge")
        if self.reward not in ("model", "oracle"):
            raise ValueError(f"reward is model or oracle, not {self.reward!r}")
        if self.reward == "oracle" and self.oracle_ceiling:
            raise ValueError("oracle_ceiling compares the reward model's rounds with the oracle's: it needs "
                             "reward = \"model\" (with reward = \"oracle\" the rounds are the ceiling already)")
        if not 0.0 <= self.noise <= 1.0:
            raise ValueError(f"noise is a share of votes between 0 and 1, not {self.noise}")


@dataclass
class LoopConfig(TrainingConfig):
    """Every knob of rlhf-loop, one dataclass per section of rlhf-loop.toml."""

    app: AppSettings = field(default_factory=AppSettings)
    serve: ServeSettings = field(default_factory=ServeSettings)
    simulate: SimulateSettings = field(default_factory=SimulateSettings)
    sft: SFTConfig = field(default_factory=SFTConfig)

    def as_dict(self) -> dict[str, dict[str, Any]]:
        return {section.name: _jsonable(dataclasses.asdict(getattr(self, section.name)))
                for section in dataclasses.fields(self)}


def _jsonable(values: dict) -> dict:
    return json.loads(json.dumps(values, default=str))


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
