import json

import app
from annotate.records import NewGeneration, NewPair
from annotate.store import Store


def test_help_lists_every_command_with_one_line(capsys):
    try:
        app.main(["--help"])
    except SystemExit as exit_:
        assert exit_.code == 0
    out = capsys.readouterr().out
    for flag, *_ in app.COMMANDS:
        assert flag in out


def test_import_prompts_command_reports_counts_and_refuses_bad_files(tmp_path, capsys):
    db = tmp_path / "x.db"
    good = tmp_path / "p.txt"
    good.write_text("one\ntwo\none\n")
    assert app.main(["--import-prompts", str(good), "--db", str(db)]) == 0
    assert "Imported 2 prompts" in capsys.readouterr().out
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "fine"}\n{not json}\n')
    assert app.main(["--import-prompts", str(bad), "--db", str(db)]) == 2
    assert "line 2" in capsys.readouterr().err
    assert Store(db).count_prompts() == 2


def test_export_command_writes_trl_columns(tmp_path):
    db = tmp_path / "x.db"
    store = Store(db)
    store.add_prompts(["say hi"], source="t")
    policy = store.add_policy(0, "base")
    prompt = store.prompts()[0]
    [pair_id] = store.add_pairs_bulk([NewPair(prompt.id, NewGeneration(policy, "hi", 1, "stop"),
                                              NewGeneration(policy, "go away", 2, "stop"), "sample")])
    store.record_vote(pair_id, "ann", "a", a_on_left=True)
    store.close()
    out = tmp_path / "prefs.jsonl"
    assert app.main(["--export", str(out), "--db", str(db)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [{k: row[k] for k in ("prompt", "chosen", "rejected")} for row in rows] == [
        {"prompt": "say hi", "chosen": "hi", "rejected": "go away"}
    ]
    assert app.main(["--export", str(tmp_path / "prefs.csv"), "--db", str(db)]) == 2


def test_show_config_prints_defaults_under_the_file_the_overrides_and_the_flags(tmp_path, monkeypatch, capsys):
    from loop.config import LoopConfig
    from loop.config_files import load_config

    monkeypatch.chdir(tmp_path)
    (tmp_path / "rlhf-loop.toml").write_text('[app]\ndb = "from-file.db"\n[ppo]\nkl_ctl = 0.2\n')
    assert app.main(["--show-config", "--set", "ppo.kl_ctl=0.05", "--seed", "3", "--ppo-batch-size", "4"]) == 0
    shown = capsys.readouterr().out
    assert '[app]\ndb = "from-file.db"' in shown and "kl_ctl = 0.05" in shown
    shown_file = tmp_path / "shown.toml"
    shown_file.write_text(shown)
    config = load_config(shown_file, default_file=None)
    assert (config.simulate.seed, config.ppo.batch_size, config.ppo.mini_batch_size) == (3, 4, 4)
    assert config.ppo.seed == LoopConfig().ppo.seed  # --seed is the simulated annotators' seed, not PPO's
