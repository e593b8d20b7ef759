"""The round report: made from a tiny round (the same prompts before and after, none PPO trained on, each answer
scored), kept in the store, written by `--report` as one self-contained page that escapes what the models wrote and
reads on a laptop and a phone with the network cut."""

import json
import math
import sqlite3
from pathlib import Path
from types import SimpleNamespace

import pytest

import app
from annotate.metrics import ROUND_ACTOR_POLICY_ID, ROUND_POLICY_ID, ROUND_PPO_PROMPTS, ROUND_REWARD_MODEL_PATH
from annotate.round_report import RoundReport, VersusVotes, headline_figures, report_html
from annotate.simulate import resolve_judge, simulate_votes
from annotate.statistics import wilson_interval
from annotate.store import Store
from loop.config_files import load_config
from loop.report import make_round_report, write_report_html
from loop.round import run_round
from tests.test_browser import browser  # noqa: F401 (browser: fixture)
from tests.test_round import PROMPTS, seed_votes, tiny_settings

HOSTILE = "<script>alert(1)</script>"


def quiet(message: str) -> None:
    """The report's log, silenced."""


def copy_database(source: Path, target: Path) -> Path:
    """A copy of a WAL database with what its WAL holds (SQLite's backup)."""
    with sqlite3.connect(source) as src, sqlite3.connect(target) as dst:
        src.backup(dst)
    src.close()
    dst.close()
    return target


def set_flags(settings: list[str]) -> list[str]:
    return [arg for setting in settings for arg in ("--set", setting)]


@pytest.fixture(scope="module")
def reported(tmp_path_factory, tiny_model_dir, one_thread):
    """A finished tiny round, people's votes on the pairs it queued (its versus pairs among them), a copy of the
    database at that point (no report yet), then the round's report made and kept with the default 16 prompts."""
    tmp = tmp_path_factory.mktemp("report")
    db = tmp / "loop.db"
    seed_votes(db, tiny_model_dir)  # 24 prompts; PPO trains on 8 of them, which leaves 16 for the report
    settings = tiny_settings(tmp)
    config = load_config(None, settings)
    result = run_round(db, str(tiny_model_dir), config, log=quiet)
    with Store(db) as store:
        simulate_votes(store, resolve_judge("longer"), "sim2", n_votes=6)
        unreported = copy_database(db, tmp / "unreported.db")
        report = make_round_report(store, result.round_id, config, log=quiet)
        metrics = store.round(result.round_id).metrics
    return SimpleNamespace(db=db, unreported=unreported, settings=settings, config=config, report=report,
                           round_id=result.round_id, metrics=metrics, tmp=tmp)


def test_the_report_answers_the_same_prompts_before_and_after_none_of_them_trained_on(reported):
    report, metrics = reported.report, reported.metrics
    assert (report.before_policy_id, report.after_policy_id) == (metrics[ROUND_ACTOR_POLICY_ID],
                                                                 metrics[ROUND_POLICY_ID.name])
    prompts = [answer.prompt for answer in report.answers]
    assert len(prompts) == len(set(prompts)) == 16
    assert set(prompts) <= set(PROMPTS) and not set(prompts) & set(metrics[ROUND_PPO_PROMPTS])
    for answer in report.answers:
        assert isinstance(answer.before, str) and isinstance(answer.after, str)
        assert all(isinstance(score, float) and math.isfinite(score) for score in (answer.before_score,
                                                                                  answer.after_score))
    assert report.unscored == "" and None not in report.mean_scores()
    labels = [figure.label for figure in report.figures]
    assert labels[:2] == ["held-out accuracy (random sample pairs)", "training accuracy (the pairs it trained on)"]
    accuracy = report.figures[0]
    assert accuracy.n == metrics["rm/n_heldout_sample"] and accuracy.low <= accuracy.value <= accuracy.high
    assert dict(report.settings)["reward-model strategy"] == "head"
    # the round made its own report too (its seconds among the stages): this one replaced it
    assert [figure.name for figure in report.seconds] == ["round/reward_seconds", "round/ppo_seconds",
                                                          "round/pairs_seconds", "round/report_seconds",
                                                          "round/seconds"]
    with Store(reported.db) as store:  # kept as it was made, and read back the same
        assert store.round_report(reported.round_id) == report.to_dict()
        assert RoundReport.from_dict(json.loads(json.dumps(store.round_report(reported.round_id)))) == report


def test_the_reports_versus_votes_are_the_stores(reported):
    votes = reported.report.versus
    with Store(reported.db) as store:
        [entry] = [rate for rate in store.versus_win_rates()
                   if (rate.policy_id, rate.opponent_id) == (votes.policy_id, votes.opponent_id)]
    assert (votes.wins, votes.losses, votes.ties, votes.both_bad) == (entry.wins, entry.losses, entry.ties,
                                                                      entry.both_bad)
    assert votes.win_rate == entry.win_rate
    if entry.win_rate is not None:
        assert votes.interval() == wilson_interval(entry.win_rate, entry.wins + entry.losses + entry.ties)
    # the round-end promotion decision (promotion.rule = "always" in tiny_settings), said on the page, escaped
    assert reported.report.promotion.startswith("At the round's end the new policy was promoted: it is the current "
                                                "policy (always: promotion.rule = ")
    assert "promotion.rule = &quot;always&quot;" in report_html(reported.report)


def test_the_win_rate_and_held_out_interval_worked_by_hand():
    votes = VersusVotes(policy_id=3, opponent_id=2, wins=5, losses=2, ties=2, both_bad=4)
    assert (votes.judged, votes.win_rate) == (9, 6 / 9)  # (5 + 2 / 2) / 9; both bad judges neither side
    assert VersusVotes(3, 2).win_rate is None and VersusVotes(3, 2).interval() is None
    # statistics.wilson_interval's hand check: 15 of 20 -> (0.531, 0.889), taken when the round recorded none
    accuracy, train, reward, kl = headline_figures({"rm/heldout_accuracy": 0.75, "rm/n_heldout_sample": 20,
                                                    "rm/accuracy": 0.9, "rm/n_train": 60, "ppo/kl": 0.02,
                                                    "history": [{}, {}, {}]})
    assert (accuracy.low, accuracy.high) == pytest.approx((0.531, 0.889), abs=1e-3) and accuracy.n_text() == "20 pairs"
    assert (accuracy.text(), accuracy.interval_text()) == ("75.0%", "53.1% to 88.8%")
    assert (train.text(), train.n_text(), train.interval_text()) == ("90.0%", "60 pairs", "")
    assert (reward.value, reward.text(), kl.text(), kl.n_text()) == (None, "", "0.0200", "3 steps")


def test_the_page_is_self_contained_and_shows_what_the_models_wrote_as_text(reported, tmp_path):
    db = copy_database(reported.db, tmp_path / "copy.db")
    given = [("Say <b>hi</b> & bye", HOSTILE, "Fine\n  indented"), ("Second prompt", "", "after")]
    with Store(db) as store:
        report = make_round_report(store, reported.round_id, reported.config, answers=given, log=quiet)
        page = report_html(report)
        assert [(a.prompt, a.before, a.after) for a in report.answers] == given
        assert all(isinstance(a.before_score, float) and isinstance(a.after_score, float) for a in report.answers)
        lowered = page.lower()
        for outside in ("<script", "http://", "https://", "<link", "<img", "src=", "url(", "@import", "//"):
            assert outside not in lowered, outside
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "Say &lt;b&gt;hi&lt;/b&gt; &amp; bye" in page
        assert "(empty answer)" in page and "white-space:pre-wrap" in page and "@media (min-width:" in page

        gone = tmp_path / "reward-model-gone"  # a pruned reward model: the answers are kept, not scored
        store.update_round_metrics(reported.round_id, {ROUND_REWARD_MODEL_PATH: str(gone)})
        unscored = make_round_report(store, reported.round_id, reported.config, answers=given, log=quiet)
    assert [(a.before_score, a.after_score) for a in unscored.answers] == [(None, None)] * 2
    assert f"Not scored: the round&#x27;s reward model folder {gone} is gone" in report_html(unscored)

    with Store(db) as store:  # round.report_prompts = 0: the figures, votes and settings, no answers
        none = make_round_report(store, reported.round_id, load_config(None, reported.settings +
                                                                      ["round.report_prompts=0"]), log=quiet)
    assert none.answers == () and "No prompts answered: round.report_prompts is 0." in report_html(none)


def test_report_command_makes_keeps_and_writes_the_page(reported, capsys):
    argv = ["--report", str(reported.round_id), "--db", str(reported.unreported), *set_flags(reported.settings)]
    assert app.main(argv) == 0, capsys.readouterr().err
    written = Path(capsys.readouterr().out.strip())
    assert written == reported.tmp / "checkpoints" / "unreported" / f"round-{reported.round_id}" / "report.html"
    page = written.read_text(encoding="utf-8")
    assert page.count("<article class=\"answer\"") == 16 and "<script" not in page
    with Store(reported.unreported) as store:
        kept = RoundReport.from_dict(store.round_report(reported.round_id))
    assert len(kept.answers) == 16 and kept.versus.policy_id == reported.report.after_policy_id

    out = reported.tmp / "mail" / "round.html"  # the kept report, to a file of one's choice
    assert app.main(argv + ["--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert out.read_text(encoding="utf-8").count("<article class=\"answer\"") == 16


def test_report_command_refuses_an_unknown_or_unfinished_round_and_a_missing_database(tmp_path, capsys):
    db = tmp_path / "rounds.db"
    with Store(db) as store:
        store.start_round(pid=1)  # running, no policy saved yet
    for argv, says in ((["--report", "1"], "round 1 did not finish: it saved no new policy"),
                       (["--report", "7"], "there is no round 7"),
                       (["--report", "last"], "--report takes a round number, not 'last'")):
        assert app.main(argv + ["--db", str(db)]) == 2
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1, err
    missing = tmp_path / "nowhere.db"
    assert app.main(["--report", "1", "--db", str(missing)]) == 2
    assert f"there is no database at {missing}" in capsys.readouterr().err and not missing.exists()


@pytest.mark.browser
def test_the_page_reads_on_a_laptop_and_a_phone_with_the_network_cut(reported, browser, tmp_path):  # noqa: F811
    url = write_report_html(reported.report, tmp_path / "report.html").as_uri()
    for name, width, height in (("laptop", 1366, 900), ("phone", 390, 844)):
        context = browser.new_context(viewport={"width": width, "height": height})
        requested = []
        context.on("request", lambda request: requested.append(request.url))
        context.route("**/*", lambda route: route.abort() if not route.request.url.startswith("file:")
                      else route.continue_())
        page = context.new_page()
        page.goto(url)
        answers = page.locator("article.answer")
        assert answers.count() >= 16
        assert page.locator("article.answer .side.before").count() == answers.count()
        assert page.locator("article.answer .side.after").count() == answers.count()
        before = answers.first.locator(".side.before").bounding_box()
        after = answers.first.locator(".side.after").bounding_box()
        if width > 760:  # side by side
            assert abs(before["y"] - after["y"]) < 1 and after["x"] >= before["x"] + before["width"]
        else:  # stacked
            assert after["y"] >= before["y"] + before["height"]
        assert page.evaluate("document.documentElement.scrollWidth") <= width  # nothing to scroll sideways
        page.screenshot(path=str(tmp_path / f"{name}-top.png"))
        page.locator("#settings").scroll_into_view_if_needed()
        page.screenshot(path=str(tmp_path / f"{name}-settings.png"))
        answers.nth(1).scroll_into_view_if_needed()
        page.screenshot(path=str(tmp_path / f"{name}-answers.png"))
        context.close()
        assert set(requested) <= {url}, requested
