"""Every number setting declares its range where it is declared (rlhf.settings_range), and the configuration refuses a
value outside it, NaN or infinity by its section.key as soon as a file, `--set` or flag gives it (exit status 2)."""

import dataclasses
import math

import pytest

import app
from loop.config import LoopConfig
from loop.config_files import ConfigError, load_config
from rlhf.ppo.config import PPOConfig
from rlhf.reward.config import RewardTrainConfig, StrategyConfig, VotesConfig
from rlhf.sampling import Sampling
from rlhf.settings_range import field_range
from rlhf.sft.config import SFTConfig


def _is_number_field(item: dataclasses.Field, value) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, (int, float)) or (value is None and bool({"int", "float"} & _types(item)))


def _types(item: dataclasses.Field) -> set[str]:
    return set(str(item.type).replace(" ", "").split("|"))


def number_settings(table, prefix: str) -> list[tuple[str, dataclasses.Field]]:
    """(section.key, field) of every number setting of `table` and of the tables within it (ppo.sampling)."""
    found = []
    for item in dataclasses.fields(table):
        value = getattr(table, item.name)
        if dataclasses.is_dataclass(value):
            found += number_settings(value, f"{prefix}.{item.name}")
        elif _is_number_field(item, value):
            found.append((f"{prefix}.{item.name}", item))
    return found


CONFIG = LoopConfig()
SETTINGS = [setting for section in dataclasses.fields(CONFIG)
            for setting in number_settings(getattr(CONFIG, section.name), section.name)]
IDS = [key for key, _item in SETTINGS]
IN_RANGE_BUT_REFUSED_BY_THEIR_SECTION = {"ppo.sampling.temperature=0.0": "[ppo]: sampling.temperature must be above 0"}
"""In-range ends a section's own check refuses: PPO samples, so its rollouts cannot be greedy."""


def _whole(item: dataclasses.Field) -> bool:
    return "int" in _types(item)


def outside_values(item: dataclasses.Field) -> list:
    """Values just past each end of the field's range, NaN and both infinities for a float."""
    allowed = field_range(item)
    step = 1 if _whole(item) else 1e-3
    values = []
    if allowed.low is not None:
        values.append(allowed.low if allowed.low_open else allowed.low - step)
    if allowed.high is not None:
        values.append(allowed.high if allowed.high_open else allowed.high + step)
    return values + ([] if _whole(item) else [math.nan, math.inf, -math.inf])


def inside_ends(item: dataclasses.Field) -> list:
    """Each end of the field's range, or a value just inside it where the end is not taken."""
    allowed = field_range(item)
    step = 1 if _whole(item) else 1e-6
    ends = []
    if allowed.low is not None:
        ends.append(allowed.low + step if allowed.low_open else allowed.low)
    if allowed.high is not None:
        ends.append(allowed.high - step if allowed.high_open else allowed.high)
    return [int(end) if _whole(item) else float(end) for end in ends]


def test_the_walk_finds_the_number_settings_of_every_section():
    assert {"ppo.kl_ctl", "ppo.sampling.top_p", "sampling.max_new_tokens", "round.min_new_pairs", "pairs.seed",
            "reward.max_steps", "app.max_prompt_chars", "app.max_answer_chars", "serve.port"} <= set(IDS)
    assert not {"ppo.adaptive_kl", "serve.share", "app.db"} & set(IDS)  # bools and strings are not numbers


@pytest.mark.parametrize("key, item", SETTINGS, ids=IDS)
def test_every_number_setting_declares_its_range(key, item):
    assert field_range(item) is not None, f"{key} has no range: declare it with rlhf.settings_range.ranged"
    assert field_range(item).low is not None or field_range(item).high is not None, key


@pytest.mark.parametrize("key, item", SETTINGS, ids=IDS)
def test_a_value_outside_the_range_nan_or_infinity_is_refused_by_its_key(key, item):
    for value in outside_values(item):
        with pytest.raises(ConfigError) as refused:
            load_config(None, [f"{key}={value!r}"], default_file=None)
        message = str(refused.value)
        assert f"{key} " in message and "must be" in message, message
        assert field_range(item).text in message, message


@pytest.mark.parametrize("key, item", SETTINGS, ids=IDS)
def test_the_ends_of_the_range_are_taken(key, item):
    for value in inside_ends(item):
        override = f"{key}={value!r}"
        if override in IN_RANGE_BUT_REFUSED_BY_THEIR_SECTION:
            with pytest.raises(ConfigError, match=IN_RANGE_BUT_REFUSED_BY_THEIR_SECTION[override].replace("[", r"\[")
                               .replace("]", r"\]")):
                load_config(None, [override], default_file=None)
            continue
        config = load_config(None, [override], default_file=None)
        section, *path = key.split(".")
        table = getattr(config, section)
        for part in path[:-1]:
            table = getattr(table, part)
        assert getattr(table, path[-1]) == value


def test_the_defaults_pass_and_an_optional_setting_may_stay_unset():
    assert load_config(None, [], default_file=None) == LoopConfig()
    assert load_config(None, ["pairs.seed=none", "reward.max_steps=none"], default_file=None) == LoopConfig()
    for table in (PPOConfig(), RewardTrainConfig(), VotesConfig(), StrategyConfig(), Sampling(), SFTConfig()):
        assert dataclasses.replace(table) == table  # __post_init__ runs again on the defaults


@pytest.mark.parametrize("override, message", [
    ("ppo.kl_ctl=NaN", "--set ppo.kl_ctl=NaN: ppo.kl_ctl must be a finite number 0 or more, not nan"),
    ("ppo.kl_ctl=inf", "--set ppo.kl_ctl=inf: ppo.kl_ctl must be a finite number 0 or more, not inf"),
    ("ppo.actor_lr=-1e-5", "--set ppo.actor_lr=-1e-5: ppo.actor_lr must be above 0 (a learning rate), not -1e-05"),
    ("sft.learning_rate=-1", "sft.learning_rate must be above 0 (a learning rate), not -1.0"),
    ("sampling.max_new_tokens=-5", "--set sampling.max_new_tokens=-5: sampling.max_new_tokens must be at least 1, "
                                   "not -5"),
    ("round.min_new_pairs=-1", "round.min_new_pairs must be 0 or more (0: no minimum), not -1"),
    ("ppo.sampling.top_p=0", "ppo.sampling.top_p must be above 0 and at most 1 (1: off), not 0.0"),
    ("pairs.seed=1.5", "pairs.seed must be a whole number between 0 and 4294967295 (a seed), not 1.5"),
    ("reward.max_steps=true", "reward.max_steps must be a whole number at least 1, not True"),
])
def test_the_probes_of_issue_32_are_refused_naming_the_key_and_its_range(override, message):
    with pytest.raises(ConfigError) as refused:
        load_config(None, [override], default_file=None)
    assert message in str(refused.value)


@pytest.mark.parametrize("argv, message", [
    (["--rm-lr", "-1"], "app.py: --rm-lr: reward.learning_rate must be 0 or more (a learning rate; 0 measures the "
                        "model as loaded), not -1.0"),
    (["--set", "ppo.kl_ctl=NaN"], "app.py: --set ppo.kl_ctl=NaN: ppo.kl_ctl must be a finite number 0 or more"),
    (["--sft-lr", "-1"], "app.py: --sft-lr: sft.learning_rate must be above 0 (a learning rate), not -1.0"),
    (["--max-new-tokens", "-5"], "app.py: --max-new-tokens: sampling.max_new_tokens must be at least 1, not -5"),
])
def test_a_command_given_a_value_out_of_range_exits_2_naming_the_key(argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # no rlhf-loop.toml
    db = tmp_path / "none.db"
    assert app.main(["--train-reward", "--db", str(db), *argv]) == 2
    assert message in capsys.readouterr().err
    assert not db.exists()


@pytest.mark.parametrize("text, message", [
    ("[ppo]\nkl_ctl = nan\n", "ppo.kl_ctl must be a finite number 0 or more, not nan"),
    ("[ppo.sampling]\ntop_p = inf\n", "ppo.sampling.top_p must be a finite number above 0 and at most 1"),
    ("[round]\nmin_new_pairs = -1\n", "round.min_new_pairs must be 0 or more"),
])
def test_a_file_value_out_of_range_is_refused_naming_the_file_and_the_key(text, message, tmp_path):
    path = tmp_path / "loop.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as refused:
        load_config(path, default_file=None)
    assert str(refused.value).startswith(f"{path}: {message}")


@pytest.mark.parametrize("build, message", [
    (lambda: PPOConfig(kl_ctl=math.nan), "kl_ctl must be a finite number 0 or more, not nan"),
    (lambda: PPOConfig(gamma=1.5), "gamma must be between 0 and 1, not 1.5"),
    (lambda: Sampling(temperature=-0.1), "temperature must be 0 or more (0: greedy), not -0.1"),
    (lambda: RewardTrainConfig(heldout_fraction=1.0), "heldout_fraction must be at least 0 and below 1"),
    (lambda: VotesConfig(cv_folds=1), "cv_folds must be at least 2, not 1"),
    (lambda: SFTConfig(max_grad_norm=0.0), "max_grad_norm must be above 0 (always clipped), not 0.0"),
])
def test_a_dataclass_built_in_code_checks_its_ranges_too(build, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build()


def test_the_tiny_values_tests_and_benches_use_are_taken():
    PPOConfig(batch_size=1, mini_batch_size=1, steps=1, epochs=1, ppo_epochs=1, seed=0,
              sampling=Sampling(max_new_tokens=1, temperature=3.0, top_p=1.0, repetition_penalty=100.0))
    RewardTrainConfig(learning_rate=0.0, max_steps=1, batch_size=1, min_pairs=1, heldout_fraction=0.0)
    VotesConfig(n_heads=0, oversample=2, lpft_from_votes=0, random_share=0.0)
    SFTConfig(epochs=1, batch_size=1, warmup_ratio=0.0)
