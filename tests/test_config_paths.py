"""Every way of setting a value reaches the code that uses it, for every command that uses its section.

One value per section is set through each of rlhf-loop.toml (in the working directory), `--config FILE` and `--set
section.key=value`; `app.main` runs the command with the function it hands the setting to replaced by a recorder, so
no model is loaded. The app's children (pairs, rounds) are followed through the configuration file the app writes
for them: the child command is run in this process, as `python app.py` would run it.
"""

from __future__ import annotations

from dataclasses import replace

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import app
import commands.data
import loop.round
from loop.pair_request import PairsReport
from loop.policies import PolicyModel
from annotate.store import Store
from loop.config_files import load_config
from loop.config import ppo_settings

WAYS = ("toml", "config", "set")


def toml_literal(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value) if isinstance(value, str) else repr(value)


def set_literal(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return value if isinstance(value, str) else repr(value)


def setting_argv(way: str, directory: Path, settings: dict[str, object]) -> list[str]:
    """Write `settings` ({"section.key": value}) the given way; the arguments that way needs on the command line."""
    if way == "set":
        return [arg for name, value in settings.items() for arg in ("--set", f"{name}={set_literal(value)}")]
    sections: dict[str, list[str]] = {}
    for name, value in settings.items():
        section, key = name.split(".")
        sections.setdefault(section, []).append(f"{key} = {toml_literal(value)}")
    text = "".join(f"[{section}]\n" + "\n".join(lines) + "\n" for section, lines in sections.items())
    if way == "toml":
        (directory / "rlhf-loop.toml").write_text(text, encoding="utf-8")
        return []
    path = directory / "settings" / "team.toml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return ["--config", str(path)]


@pytest.fixture()
def ws(tmp_path, monkeypatch):
    """A working directory (the current one) with a database of prompts and the files the commands read."""
    monkeypatch.chdir(tmp_path)
    # loop.app_server sets these with setdefault; set them here so they are undone after the test
    monkeypatch.setenv("GRADIO_ANALYTICS_CACHE_FREQUENCY", "1000")
    monkeypatch.setenv("GRADIO_ANALYTICS_MAX_EVENTS", "1000")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Question {i}?"}) + "\n" for i in range(6)), encoding="utf-8")
    db = tmp_path / "loop.db"
    with Store(db) as store:
        store.import_prompts(prompts)
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": f"Q{i}?", "chosen": "Gladly, thank you.", "rejected": "No."}) + "\n"
                             for i in range(4)), encoding="utf-8")
    sft = tmp_path / "sft.jsonl"
    sft.write_text(json.dumps({"prompt": "Hi?", "response": "Hello, glad to help."}) + "\n", encoding="utf-8")
    reward_dir = tmp_path / "rm"
    reward_dir.mkdir()
    (reward_dir / "reward_model.json").write_text("{}", encoding="utf-8")  # what is_reward_model_dir looks for
    return SimpleNamespace(dir=tmp_path, db=str(db), prompts=str(prompts), pairs=str(pairs), sft=str(sft),
                           reward_dir=str(reward_dir), out=str(tmp_path / "out"))


# Routes: each replaces the function a command hands its settings to with a recorder (into `got`) and returns the
# command's arguments.

def route_train_round(monkeypatch, ws, got):
    from annotate.metrics import ROUND_ACTOR_POLICY_ID, ROUND_POLICY_ID

    def run_round(db_path, base_model, config, log=print, **kwargs):
        got.update(db=str(db_path), base_model=base_model, config=config, round_kwargs=kwargs)
        with Store(db_path) as store:  # a finished round, its policy the base: what the demo reports on
            policy = store.ensure_base_policy(base_model)
            round_id = store.start_round()
            store.finish_round(round_id, {ROUND_POLICY_ID.name: policy.id, ROUND_ACTOR_POLICY_ID: policy.id})
        return SimpleNamespace(round_id=round_id, policy_id=policy.id, metrics={})

    monkeypatch.setattr(loop.round, "run_round", run_round)
    return ["--train-round"]


def route_train_reward(monkeypatch, ws, got):
    import rlhf.reward.train

    def train_reward_model(pairs, config, on_progress=None):
        got.update(pairs=pairs, reward=config)
        return SimpleNamespace(heldout_accuracy=None, metrics={}, path=config.out_dir)

    monkeypatch.setattr(rlhf.reward.train, "train_reward_model", train_reward_model)
    return ["--train-reward", "--data", ws.pairs, "--out", ws.out]


def route_train_ppo(monkeypatch, ws, got):
    import rlhf.ppo.train

    def train_ppo(actor_path, reward_model_path, prompts, config, out_dir, reference_path=None):
        got.update(actor=actor_path, reward_model=reward_model_path, prompts=prompts, ppo=config)
        return SimpleNamespace(history=[{"ppo/score": 0.0, "ppo/kl": 0.0}], saved_path=str(out_dir))

    monkeypatch.setattr(rlhf.ppo.train, "train_ppo", train_ppo)
    return ["--train-ppo", "--reward-model", ws.reward_dir, "--prompts", ws.prompts, "--out", ws.out]


def route_sft(monkeypatch, ws, got):
    import rlhf.sft.train

    def train_sft(model_path, examples, config=None, out_dir="", *args, **kwargs):
        got.update(model=model_path, examples=examples, sft=config)
        return SimpleNamespace(out_dir=Path(out_dir), steps=1, seconds=0.0, losses=[1.0], final_loss=0.5)

    monkeypatch.setattr(rlhf.sft.train, "train_sft", train_sft)
    return ["--sft", ws.sft, "--out", ws.out]


class LoadedPolicy(torch.nn.Linear):
    """Stands in for a policy's loaded model (on the CPU, as the real one here) and says which path it came from."""

    def __init__(self, path: str):
        super().__init__(1, 1)
        self.path = path


def record_pair_making(monkeypatch, got):
    """Pair making's entry points as recorders: the last round's pair judge, its loading, queue_pairs."""
    import loop.pairs
    import loop.policies

    def load_pair_judge(path, votes):
        got.update(judge_path=path, judge_votes=votes)  # and no judge: the pairs are drawn at random

    def queue_pairs(store, request, votes, judge=None, model=None, progress=None):
        loaded = model.model if model is not None else store.policy(request.policy_id).path
        got.update(model=getattr(loaded, "path", loaded), n_pairs=request.n_pairs, votes=votes,
                   sampling=request.sampling)
        return PairsReport(policy_id=request.policy_id)

    monkeypatch.setattr(loop.policies, "pair_judge_path", lambda store: "last-round-rm")
    monkeypatch.setattr(loop.policies, "load_pair_judge", load_pair_judge)
    monkeypatch.setattr(loop.pairs, "queue_pairs", queue_pairs)
    monkeypatch.setattr(loop.policies, "load_policy_model", lambda path: PolicyModel(LoadedPolicy(path), None))


def route_generate_pairs(monkeypatch, ws, got):
    record_pair_making(monkeypatch, got)
    return ["--generate-pairs", "3"]


def route_simulate(monkeypatch, ws, got):
    def simulate_votes(store, judge, annotator, n_votes, overlap=1, seed=0, score=None):
        got.update(n_votes=n_votes, overlap=overlap, seed=seed, annotator=annotator)
        return SimpleNamespace(votes=0, choices={}, queue_empty=False, much_better=0)

    monkeypatch.setattr(commands.data, "simulate_votes", simulate_votes)
    return ["--simulate", "polite"]


def route_demo_loop(monkeypatch, ws, got):
    import annotate.simulate
    import loop.policies

    record_pair_making(monkeypatch, got)

    def policy_answers(policy_path, prompts, sampling, per_prompt, seed=None, batch_size=None):
        got.setdefault("answer_policies", []).append(policy_path)
        got["eval_sampling"] = sampling
        return ["Thank you, glad to help."] * (len(prompts) * per_prompt)

    def simulate_votes(store, judge, annotator, n_votes, overlap=1, seed=0, score=None):
        got.update(n_votes=n_votes, annotator=annotator)
        return SimpleNamespace(votes=n_votes, choices={}, queue_empty=False)

    monkeypatch.setattr(loop.policies, "policy_answers", policy_answers)
    monkeypatch.setattr(annotate.simulate, "simulate_votes", simulate_votes)
    route_train_round(monkeypatch, ws, got)  # the demo's rounds: run_round of loop.round
    return ["--demo-loop", "--rounds", "1", "--eval-prompts", "2"]


def route_serve(monkeypatch, ws, got):
    """`python app.py`: the app's configuration (AppConfig), its round runner and pair generator, and the file of
    settings it writes for its children."""
    import loop.app_server
    from annotate.ui_session import AppConfig

    class Demo:
        def queue(self, **kwargs):
            return self

        def launch(self, **kwargs):
            got["launch"] = kwargs

    def build_app(*args, **kwargs):
        got["app_config"] = next(a for a in [*args, *kwargs.values()] if isinstance(a, AppConfig))
        return Demo()

    class RoundRunner:
        def __init__(self, store, command, cwd=None, auto_every=0, **kwargs):
            got.update(round_command=list(command), auto_every=auto_every)

    class ChildProcessPairGenerator:
        def __init__(self, command, cwd=None, **kwargs):
            got["pair_command"] = command

    real_write = loop.app_server.write_child_config

    def write_child_config(config):
        got["serve_config"] = config
        got["child_config_file"] = real_write(config)
        return got["child_config_file"]

    monkeypatch.setattr(loop.app_server, "build_app", build_app)
    monkeypatch.setattr(loop.app_server, "RoundRunner", RoundRunner)
    monkeypatch.setattr(loop.app_server, "ChildProcessPairGenerator", ChildProcessPairGenerator)
    monkeypatch.setattr(loop.app_server, "write_child_config", write_child_config)
    monkeypatch.setattr(loop.app_server, "check_port", lambda host, port: None)  # 7860 may be taken: test_one_writer
    return ["--serve"]


def run_child(monkeypatch, ws, got, child_argv: list[str], route) -> dict:
    """Check that a child command of the app is `python app.py ... --config <the file the app wrote>` and that the file
    holds the app's configuration; then run the child here, as the app would, with `route`'s recorders."""
    import loop.app_server

    path = got["child_config_file"]
    assert child_argv[:2] == [sys.executable, str(loop.app_server.APP_PATH)], child_argv
    assert "--config" in child_argv, f"the app's child does not read the app's configuration: {child_argv}"
    assert child_argv[child_argv.index("--config") + 1] == str(path)
    assert path == Path(f"{ws.db}.serve.toml") and path.is_file()
    assert load_config(path).as_dict() == got["serve_config"].as_dict()
    child = {}
    expected = route(monkeypatch, ws, child)
    assert child_argv[2] == expected[0]  # the child runs the command the route records
    assert app.main(child_argv[2:]) == 0
    return child


def route_serve_pairs_child(monkeypatch, ws, got):
    """The app's pair making: the child `app.py --generate-pairs N ... --config FILE`."""
    argv = route_serve(monkeypatch, ws, got)
    got["after"] = lambda: got.update(
        child=run_child(monkeypatch, ws, got, got["pair_command"](2, 0.25), route_generate_pairs))
    return argv


def route_serve_round_child(monkeypatch, ws, got):
    """The app's rounds: the child `app.py --train-round --config FILE`."""
    argv = route_serve(monkeypatch, ws, got)
    got["after"] = lambda: got.update(
        child=run_child(monkeypatch, ws, got, got["round_command"], route_train_round))
    return argv


ROUTES = {
    "--train-round": route_train_round,
    "--train-reward": route_train_reward,
    "--train-ppo": route_train_ppo,
    "--sft": route_sft,
    "--generate-pairs": route_generate_pairs,
    "--simulate": route_simulate,
    "--demo-loop": route_demo_loop,
    "app": route_serve,
    "app pairs child": route_serve_pairs_child,
    "app round child": route_serve_round_child,
}

ROWS = [
    # (section.key, value, command, what reached the code)
    ("app.model", "org/base-model", "--train-round", lambda got: got["base_model"]),
    ("app.model", "org/base-model", "--train-reward", lambda got: got["reward"].model),
    ("app.model", "org/base-model", "--train-ppo", lambda got: got["actor"]),
    ("app.model", "org/base-model", "--sft", lambda got: got["model"]),
    ("app.model", "org/base-model", "--generate-pairs", lambda got: got["model"]),  # the base policy's path
    ("app.model", "org/base-model", "--demo-loop", lambda got: got["answer_policies"][0]),
    ("app.overlap", 2, "--simulate", lambda got: got["overlap"]),
    ("round.min_new_pairs", 7, "--train-round", lambda got: got["config"].round.min_new_pairs),
    ("round.min_new_pairs", 7, "app round child", lambda got: got["child"]["config"].round.min_new_pairs),
    ("reward.learning_rate", 0.00035, "--train-reward", lambda got: got["reward"].learning_rate),
    ("reward.learning_rate", 0.00035, "--train-round", lambda got: got["config"].reward.learning_rate),
    ("ppo.kl_ctl", 0.0123, "--train-ppo", lambda got: got["ppo"].kl_ctl),
    ("ppo.kl_ctl", 0.0123, "--train-round", lambda got: got["config"].ppo.kl_ctl),
    ("ppo.kl_ctl", 0.0123, "app round child", lambda got: got["child"]["config"].ppo.kl_ctl),
    ("sampling.temperature", 0.33, "--generate-pairs", lambda got: got["sampling"].temperature),
    ("sampling.temperature", 0.33, "--train-round", lambda got: got["config"].sampling.temperature),
    ("sampling.temperature", 0.33, "--demo-loop", lambda got: got["sampling"].temperature),
    ("sampling.temperature", 0.33, "--demo-loop", lambda got: got["eval_sampling"].temperature),
    ("sampling.temperature", 0.33, "app pairs child", lambda got: got["child"]["sampling"].temperature),
    ("votes.oversample", 6, "--generate-pairs", lambda got: got["votes"].oversample),
    ("votes.oversample", 6, "--generate-pairs", lambda got: got["judge_votes"].oversample),
    ("votes.oversample", 6, "--train-round", lambda got: got["config"].votes.oversample),
    ("votes.oversample", 6, "--demo-loop", lambda got: got["judge_votes"].oversample),
    ("votes.oversample", 6, "app pairs child", lambda got: got["child"]["votes"].oversample),
    ("sft.epochs", 5, "--sft", lambda got: got["sft"].epochs),
    ("simulate.votes", 3, "--simulate", lambda got: got["n_votes"]),
    ("simulate.votes", 3, "--demo-loop", lambda got: got["n_votes"]),
    ("simulate.votes", 3, "--demo-loop", lambda got: got["n_pairs"]),  # pairs made for the votes
    ("simulate.reward", "oracle", "--demo-loop",
     lambda got: "oracle" if got["round_kwargs"]["reward_function"] else "model"),
    ("simulate.oracle_ceiling", True, "--demo-loop", lambda got: got["round_kwargs"]["ceiling_reward"] is not None),
    ("serve.first_batch", 5, "app", lambda got: got["app_config"].first_batch_pairs),
    ("serve.auto_round_every", 9, "app", lambda got: got["auto_every"]),
]


def test_every_row_sets_a_value_that_is_not_the_default():
    defaults = load_config(None, [], default_file=None)
    for name, value, _command, _read in ROWS:
        section, key = name.split(".")
        assert getattr(getattr(defaults, section), key) != value, f"{name}: {value!r} is the default"


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("name, value, command, read", ROWS,
                         ids=[f"{name}@{command}#{i}" for i, (name, _v, command, _r) in enumerate(ROWS)])
def test_a_setting_reaches_the_code_that_uses_it(ws, monkeypatch, capsys, name, value, command, read, way):
    got: dict = {}
    argv = ROUTES[command](monkeypatch, ws, got) + ["--db", ws.db] + setting_argv(way, ws.dir, {name: value})
    assert app.main(argv) == 0, capsys.readouterr().err
    if "after" in got:
        got["after"]()
    assert read(got) == value, f"{name} = {value!r} set through {way} did not reach {command}"


PRECEDENCE = [
    # (section.key, its flag, the command, what reached the code)
    ("reward.learning_rate", "--rm-lr", "--train-reward", lambda got: got["reward"].learning_rate),
    ("sampling.temperature", "--temperature", "--generate-pairs", lambda got: got["sampling"].temperature),
    ("simulate.votes", "--votes", "--simulate", lambda got: got["n_votes"]),
]
LAYERS = {  # the value each layer sets (distinct, none the default)
    "reward.learning_rate": (0.001, 0.002, 0.003, 0.004),
    "sampling.temperature": (0.1, 0.2, 0.3, 0.4),
    "simulate.votes": (11, 12, 13, 14),
}


@pytest.mark.parametrize("name, flag, command, read", PRECEDENCE, ids=[row[0] for row in PRECEDENCE])
@pytest.mark.parametrize("layers", [4, 3, 2, 1, 0])
def test_precedence_toml_then_config_then_set_then_flag(ws, monkeypatch, capsys, name, flag, command, read, layers):
    toml, config, override, flag_value = LAYERS[name]
    got: dict = {}
    argv = ROUTES[command](monkeypatch, ws, got) + ["--db", ws.db]
    argv += setting_argv("toml", ws.dir, {name: toml}) if layers >= 1 else []
    argv += setting_argv("config", ws.dir, {name: config}) if layers >= 2 else []
    argv += setting_argv("set", ws.dir, {name: override}) if layers >= 3 else []
    argv += [flag, str(flag_value)] if layers >= 4 else []
    assert app.main(argv) == 0, capsys.readouterr().err
    section, key = name.split(".")
    default = getattr(getattr(load_config(None, [], default_file=None), section), key)
    assert read(got) == (default, toml, config, override, flag_value)[layers]


@pytest.mark.parametrize("text, named", [
    ("[ppo]\nkl_clt = 0.1\n", "unknown key ppo.kl_clt"),
    ("[sampling]\ntemperature = 0.5\n[rewards]\nepochs = 2\n", "unknown section [rewards]"),
])
@pytest.mark.parametrize("command", ["--show-config", "--train-round", "--serve"])
def test_an_unknown_key_in_rlhf_loop_toml_is_refused_by_name(ws, monkeypatch, capsys, text, named, command):
    (ws.dir / "rlhf-loop.toml").write_text(text, encoding="utf-8")
    got: dict = {}
    route_train_round(monkeypatch, ws, got)
    route_serve(monkeypatch, ws, got)
    assert app.main([command, "--db", ws.db]) == 2
    error = capsys.readouterr().err
    assert named in error and "rlhf-loop.toml" in error
    assert not got  # nothing ran


def write_head_reward_model(directory: Path) -> Path:
    directory.mkdir()
    (directory / "reward_model.json").write_text("{}", encoding="utf-8")
    (directory / "preference_strategy.json").write_text(json.dumps({"strategy": "head"}), encoding="utf-8")
    return directory


@pytest.mark.parametrize("way", WAYS)
def test_train_ppo_on_a_head_reward_model_runs_the_rounds_ppo_settings(ws, monkeypatch, capsys, way):
    head = str(write_head_reward_model(ws.dir / "head-rm"))
    got: dict = {}
    route_train_ppo(monkeypatch, ws, got)
    settings = setting_argv(way, ws.dir, {"ppo.kl_ctl": 0.07})
    argv = ["--train-ppo", "--reward-model", head, "--prompts", ws.prompts, "--out", ws.out, "--db", ws.db, *settings]
    assert app.main(argv) == 0, capsys.readouterr().err
    config = load_config(settings[1] if way == "config" else None, settings[1::2] if way == "set" else [])
    assert got["ppo"] == replace(ppo_settings(config, head), engine="ddp")  # "auto" on one process: DDP
    assert (got["ppo"].normalize_rewards, got["ppo"].lam, got["ppo"].kl_ctl) == (True, 1.0, 0.07)
    assert got["reward_model"] == head and got["prompts"] == [f"Question {i}?" for i in range(6)]
    assert "Head reward model: scores normalised" in capsys.readouterr().err


def test_the_win_rate_oracle_reaches_ppo_as_the_share_of_the_first_policys_answers_beaten(ws, monkeypatch, capsys):
    got: dict = {}
    argv = route_demo_loop(monkeypatch, ws, got) + ["--db", ws.db, "--annotator", "courteous", "--reward", "oracle",
                                                   "--set", "simulate.oracle=win_rate"]
    assert app.main(argv) == 0, capsys.readouterr().err
    reward = got["round_kwargs"]["reward_function"]
    assert reward.__name__ == "oracle-win-rate:courteous"
    # every first answer is "Thank you, glad to help." (courtesy 2 of 5 words): above it 1, level 0.5, below 0
    assert reward(["Thank you, thanks, glad.", "Thank you, glad to help.", "No."]) == [1.0, 0.5, 0.0]
    assert "PPO rewarded by the annotator's win rate against the first policy's answers" in capsys.readouterr().err


def test_train_ppo_keeps_plain_ppo_when_the_round_would_not_adapt_it(ws, monkeypatch, capsys):
    head = str(write_head_reward_model(ws.dir / "head-rm"))
    got: dict = {}
    route_train_ppo(monkeypatch, ws, got)
    base = ["--train-ppo", "--prompts", ws.prompts, "--out", ws.out, "--db", ws.db]
    assert app.main([*base, "--reward-model", head, "--set", "round.adapt_ppo_to_head=false"]) == 0
    plain = replace(load_config(None, []).ppo, engine="ddp")  # "auto" made concrete: one process runs DDP
    assert got["ppo"] == plain and (got["ppo"].normalize_rewards, got["ppo"].lam) == (False, 0.95)
    assert app.main([*base, "--reward-model", ws.reward_dir]) == 0  # a reward model of --train-reward: no strategy
    assert got["ppo"] == plain


def test_the_configuration_reference_in_docs_is_written_from_the_fields():
    from commands.config_reference import DOC_PATH, MARKER, reference_tables

    text = DOC_PATH.read_text(encoding="utf-8")
    assert MARKER in text, "docs/configuration.md lost its marker: run python -m commands.config_reference"
    assert text.split(MARKER)[1].strip() == reference_tables().strip(), \
        "docs/configuration.md is out of date: run python -m commands.config_reference"
    assert "| `kl_ctl` | `0.1` |" in text and "| `db` | `\"data/rlhf-loop.db\"` | `--db` |" in text
