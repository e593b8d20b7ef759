import pytest

from loop.config import LoopConfig

from loop.config_files import ConfigError, config_as_toml, load_config


def test_defaults_are_deepspeed_chat_ppo_and_moderate_sampling():
    config = load_config(None, [])
    assert (config.ppo.kl_ctl, config.ppo.clip_reward_value, config.ppo.cliprange, config.ppo.cliprange_value,
            config.ppo.gamma, config.ppo.lam) == (0.1, 5.0, 0.2, 0.2, 1.0, 0.95)
    assert config.sampling.temperature == 0.7


def test_file_then_flags_override_in_that_order(tmp_path):
    path = tmp_path / "loop.toml"
    path.write_text("[ppo]\nkl_ctl = 0.05\nsteps = 3\n[round]\nmin_new_pairs = 40\n")
    config = load_config(path, ["ppo.kl_ctl=0.2", "ppo.adaptive_kl=true", "round.checkpoints_dir=/tmp/x"])
    assert (config.ppo.kl_ctl, config.ppo.steps, config.ppo.adaptive_kl) == (0.2, 3, True)
    assert (config.round.min_new_pairs, config.round.checkpoints_dir) == (40, "/tmp/x")
    assert isinstance(config.ppo.kl_ctl, float)


@pytest.mark.parametrize("override, message", [
    ("ppo.kl_clt=0.1", "unknown key ppo.kl_clt"),
    ("rewards.epochs=2", "unknown section [rewards]"),
    ("ppo.steps=many", "cannot read 'many' as int"),
    ("ppo.adaptive_kl=1", "expected true or false"),
    ("kl_ctl=0.1", "expected SECTION.KEY=VALUE"),
    ("ppo.sampling.min_new_tokens=99", "[ppo.sampling]: min_new_tokens cannot exceed max_new_tokens"),
    ("ppo.temperature=0.5", "unknown key ppo.temperature .did you mean ppo.sampling.temperature"),
    ("ppo.sampling=0.5", "ppo.sampling is a table of keys; set ppo.sampling.KEY"),
    ("ppo.sampling.temperature=0", "[ppo]: sampling.temperature must be above 0 .PPO samples., not 0.0"),
])
def test_bad_overrides_are_refused_by_name(override, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_config(None, [override])


def test_a_missing_or_broken_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml")
    broken = tmp_path / "broken.toml"
    broken.write_text("[ppo\n")
    with pytest.raises(ConfigError, match="broken.toml"):
        load_config(broken)


def test_shipped_example_config_loads():
    config = load_config("rlhf-loop.example.toml")
    assert config.round.min_new_pairs >= 1


def test_rlhf_loop_toml_then_the_config_file_then_overrides_then_flags(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rlhf-loop.toml").write_text("[ppo]\nkl_ctl = 0.05\nsteps = 3\n[app]\ndb = \"here.db\"\n")
    extra = tmp_path / "extra.toml"
    extra.write_text("[ppo]\nsteps = 7\n[round]\nmin_new_pairs = 40\n")
    config = load_config(extra, ["round.min_new_pairs=50"], [("simulate", "seed", 9, "--seed")])
    # rlhf-loop.toml is read first and --config on top of it (it no longer replaces it)
    assert (config.ppo.kl_ctl, config.ppo.steps, config.app.db) == (0.05, 7, "here.db")
    assert (config.round.min_new_pairs, config.simulate.seed) == (50, 9)
    assert load_config(None, []).ppo.steps == 3
    assert load_config(None, [], default_file=None).ppo.steps == LoopConfig().ppo.steps


def test_a_sections_own_check_is_a_config_error_naming_the_section():
    # a check across keys (a key's own range is refused as it is set: tests/test_config_ranges.py)
    with pytest.raises(ConfigError, match=r"\[simulate\]: oracle_ceiling compares the reward model's rounds"):
        load_config(None, ["simulate.reward=oracle", "simulate.oracle_ceiling=true"], default_file=None)
    with pytest.raises(ConfigError, match=r"\[simulate\]: oracle is score or win_rate, not 'mean'"):
        load_config(None, ["simulate.oracle=mean"], default_file=None)


def test_the_shown_configuration_loads_back_as_the_same_configuration(tmp_path):
    config = load_config(None, ["ppo.kl_ctl=0.03", "serve.admins=[\"ann\"]", "simulate.annotator_name=bob"],
                         default_file=None)
    shown = tmp_path / "shown.toml"
    shown.write_text(config_as_toml(config))
    assert load_config(shown, [], default_file=None) == config
