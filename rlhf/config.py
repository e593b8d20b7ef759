"""The loop's configuration: one TOML file (`rlhf-loop.toml`), one section per stage, every value overridable.

```toml
[round]
min_new_pairs = 16
[reward]
epochs = 3
[ppo]
kl_ctl = 0.1
[sampling]
temperature = 0.7
```
A flag `--set ppo.kl_ctl=0.05` overrides one value; unknown sections or keys are refused by name, so a typo
never silently trains with a default.
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

from rlhf.generate import AnswerSampling
from rlhf.ppo import PPOConfig
from rlhf.reward_strategies import VotesConfig
from rlhf.reward_train import RewardTrainConfig

DEFAULT_CONFIG_FILE = "rlhf-loop.toml"


class ConfigError(ValueError):
    """A configuration file or override that cannot be applied; the message names the file, section and key."""


@dataclass
class RoundConfig:
    """What a round does around the trainers."""

    min_new_pairs: int = 16
    """Refuse a round with fewer new preference pairs than this since the last finished round."""
    min_accuracy: float = 0.55
    """Refuse PPO when the reward model's held-out accuracy is below this."""
    ppo_prompts: int = 64
    """Prompts PPO trains on per round (sampled from the store, seeded)."""
    next_pairs: int = 32
    """Pairs generated for annotation from the new policy at the end of the round."""
    versus_share: float = 0.25
    """Share of the next pairs that put the new policy against an earlier one."""
    adapt_ppo_to_head: bool = True
    """PPO on a head or ensemble reward model (the few-vote strategies) normalises its scores by their running mean and
    std (ppo.normalize_rewards) and takes GAE's lambda as 1 (ppo.lam). Cross-validation on few votes picks a strong L2,
    so raw head scores move by hundredths, little beside the KL penalty; and a mean-pooled head is no value function
    for the critic it initialises, so lambda 0.95 leaves a 64-token answer's first tokens 0.95^63 = 4% of the reward.
    Measured (README, "Learning from few votes"): 32 steps from the default model raised the share of answers with a
    courtesy word from 10% to 19% with lambda 1 and left it at 11% with 0.95. A "full" reward model (scored at the
    last token, DeepSpeed-Chat's critic init) keeps [ppo] as set."""
    checkpoints_dir: str = "data/checkpoints"
    """Where reward models and policies of each round are saved, in a folder per database: <dir>/<db name>/round-N."""
    seed: int = 0
    """Seed for splits, prompt choice and training."""


@dataclass
class LoopConfig:
    """Every knob of the loop, one dataclass per stage."""

    round: RoundConfig = field(default_factory=RoundConfig)
    reward: RewardTrainConfig = field(default_factory=RewardTrainConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    sampling: AnswerSampling = field(default_factory=AnswerSampling)
    votes: VotesConfig = field(default_factory=VotesConfig)
    """Reward-model strategy by vote count and active choice of the next pairs (rlhf.reward_strategies)."""

    def as_dict(self) -> dict[str, dict[str, Any]]:
        return {section.name: _jsonable(dataclasses.asdict(getattr(self, section.name)))
                for section in dataclasses.fields(self)}


def _jsonable(values: dict) -> dict:
    return json.loads(json.dumps(values, default=str))


def _coerce(value: Any, current: Any, where: str) -> Any:
    """Turn a TOML or command-line value into the type of the field's current value."""
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
    if isinstance(current, float) and isinstance(value, int):
        return float(value)
    if isinstance(current, (list, tuple)) and isinstance(value, list):
        return type(current)(value)
    if not isinstance(value, type(current)):
        raise ConfigError(f"{where}: expected {type(current).__name__}, got {value!r}")
    return value


def _apply(config: LoopConfig, section: str, key: str, value: Any, where: str) -> None:
    sections = {f.name for f in dataclasses.fields(config)}
    if section not in sections:
        raise ConfigError(f"{where}: unknown section [{section}]; sections are {', '.join(sorted(sections))}")
    stage = getattr(config, section)
    keys = {f.name for f in dataclasses.fields(stage)}
    if key not in keys:
        raise ConfigError(f"{where}: unknown key {section}.{key}; keys are {', '.join(sorted(keys))}")
    setattr(stage, key, _coerce(value, getattr(stage, key), f"{where}: {section}.{key}"))


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> LoopConfig:
    """Defaults, then the file (when given, or `rlhf-loop.toml` when it exists), then `section.key=value` overrides."""
    config = LoopConfig()
    if path is None and Path(DEFAULT_CONFIG_FILE).is_file():
        path = DEFAULT_CONFIG_FILE
    if path is not None:
        path = Path(path)
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
                _apply(config, section, key, value, str(path))
    for override in overrides or []:
        name, sep, value = override.partition("=")
        section, dot, key = name.strip().partition(".")
        if not sep or not dot:
            raise ConfigError(f"--set {override!r}: expected SECTION.KEY=VALUE, for example ppo.kl_ctl=0.05")
        _apply(config, section, key, value.strip(), f"--set {override}")
    for section in dataclasses.fields(config):
        stage = getattr(config, section.name)
        if hasattr(stage, "__post_init__"):
            try:
                stage.__post_init__()
            except ValueError as error:
                raise ConfigError(f"[{section.name}]: {error}") from error
    return config
