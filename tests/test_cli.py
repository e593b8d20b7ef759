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
