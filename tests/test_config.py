import pytest

from rlhf.config import ConfigError, load_config


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
    ("ppo.min_new_tokens=99", "min_new_tokens cannot exceed max_new_tokens"),
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
