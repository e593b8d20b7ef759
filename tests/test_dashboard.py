"""The Dashboard's numbers, from a real round of the tiny model: every name it reads was written by the round, the
held-out accuracy and its interval are the store's, the human win rate comes with its interval and counts, each panel
draws what was recorded, and the people table is the admins'. Plots and the per-annotator figures by hand."""

from __future__ import annotations

import ast
import math
import re
from pathlib import Path

import pytest

import app
from annotate import dashboard_panels
from annotate.agreement import agreement_report
from annotate.metrics import HISTORY, PPO_STEP, Metric
from annotate.people import PEOPLE_COLUMNS, people, people_rows
from annotate.plots import HEIGHT, Panel, Series, nice_ticks, panel_svg, tick_text
from annotate.records import Vote
from annotate.simulate import resolve_judge, simulate_votes
from annotate.statistics import binomial_two_sided_p, wilson_interval
from annotate.store import Store
from annotate.ui_dashboard import PEOPLE_COLUMN_WIDTHS, PEOPLE_FOR_ADMINS, DashboardHandlers
from annotate.ui_session import AppConfig, Session
from tests.test_round import tiny_settings

pytestmark = pytest.mark.usefixtures("one_thread")
REPO = Path(__file__).resolve().parents[1]
METRIC_NAME = re.compile(r"^(rm|ppo|gen|time|round|ceiling|active|demo)/[a-z_]*$")


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory, tiny_model_dir) -> Path:
    """A database after one demo round of the tiny model (so its judge's figures exist too), and votes by a second
    annotator on every pair the round queued, its versus pairs among them (the demo's closing votes off: they would
    take them)."""
    folder = tmp_path_factory.mktemp("dashboard")
    db = folder / "demo.db"
    overrides = [*tiny_settings(folder), "simulate.closing_votes=false"]
    settings = [arg for setting in overrides for arg in ("--set", setting)]
    assert app.main(["--demo-loop", "--rounds", "1", "--annotator", "longer", "--votes", "16", "--eval-prompts", "4",
                     "--db", str(db), "--model", str(tiny_model_dir), *settings]) == 0
    with Store(db) as store:
        simulate_votes(store, resolve_judge("longer"), "ann", n_votes=store.pairs_waiting())
        store.set_role("boss", "admin")
    return db


def dashboard_reads() -> list[Metric]:
    """Every metric the Dashboard's panels, headline and tables read."""
    return [value for value in vars(dashboard_panels).values() if isinstance(value, Metric)]


def test_every_name_the_dashboard_reads_was_written_by_a_real_round(demo_db):
    with Store(demo_db) as store:
        (done,) = store.rounds()
    per_step = {key for step in done.metrics[HISTORY] for key in step}
    missing = [metric.name for metric in dashboard_reads()
               if metric.name not in done.metrics and metric.name not in per_step]
    assert not missing, f"the Dashboard reads names no round wrote: {missing}"
    assert PPO_STEP.name in per_step and len(dashboard_reads()) >= 15


def test_no_module_but_the_vocabulary_spells_a_metric_name():
    spelled = []
    for folder in ("annotate", "loop", "commands"):
        for path in sorted((REPO / folder).rglob("*.py")):
            if path.name == "metrics.py" and path.parent.name == "annotate":
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and METRIC_NAME.match(node.value):
                    spelled.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.value!r}")
    assert not spelled, "metric names spelled outside annotate/metrics.py:\n" + "\n".join(spelled)


def test_the_headline_and_tables_say_what_the_store_holds(demo_db):
    with Store(demo_db) as store:
        (done,) = store.rounds()
        view = DashboardHandlers(store, AppConfig()).refresh()
        versus = store.versus_win_rates()
    m = done.metrics
    accuracy, n = m["rm/heldout_accuracy"], int(m["rm/n_heldout_sample"])
    low, high = wilson_interval(accuracy, n)
    shown = f"{accuracy:.1%} ({low:.0%}-{high:.0%}, n={n})"
    assert (m["rm/heldout_low"], m["rm/heldout_high"]) == pytest.approx((low, high), abs=1e-3)
    assert f"**{shown}**" in view.headline and "the bar for PPO is 0%" not in view.headline
    assert f"Training accuracy (on the pairs it trained on; not a measure of what it learned): " \
           f"{m['rm/accuracy']:.1%}" in view.headline
    assert view.rounds["held-out accuracy (95%, n)"].tolist() == [shown]
    assert view.rounds["training accuracy"].tolist() == [f"{m['rm/accuracy']:.1%}"]
    assert view.rounds["votes"].tolist() == [str(m["round/votes"])]
    (win,) = [w for w in versus if w.policy_id == m["round/policy_id"]]  # the new policy against the one before
    w_low, w_high = wilson_interval(win.win_rate, win.wins + win.losses + win.ties)
    assert f"**{win.win_rate:.0%} ({w_low:.0%}-{w_high:.0%})** ({win.wins} wins, {win.losses} losses" in view.headline
    assert view.win_rates["win rate (95%)"].tolist() == [f"{win.win_rate:.0%} ({w_low:.0%}-{w_high:.0%})"]
    assert f"Judge (longer, simulated): win rate against the first policy **{m['demo/win_rate']:.1%}**" \
        in view.headline


def test_each_panel_draws_what_the_rounds_recorded(demo_db):
    with Store(demo_db) as store:
        rounds, versus, policies = store.rounds(), store.versus_win_rates(), store.policies()
    panels = dashboard_panels.across_rounds(rounds, versus, policies)
    by_title = {panel.title: panel for panel in panels}
    accuracy = by_title["Reward model: held-out accuracy (random sample pairs)"]
    m = rounds[0].metrics
    assert accuracy.series[0].points == [(1, m["rm/heldout_accuracy"])]
    assert accuracy.series[0].band == [(1, m["rm/heldout_low"], m["rm/heldout_high"])]
    assert accuracy.series[1].points == [(1, m["rm/accuracy"])] and (0.5, "chance") in accuracy.references
    assert by_title["PPO: KL to the reference (nats an answer)"].series[0].points == [(1, m["ppo/kl"])]
    assert [series.points for series in by_title["Votes and preference pairs"].series] == [
        [(1, m["round/votes"])], [(1, m["round/pairs_used"])]]
    assert any(title.startswith("Judge (longer, simulated)") for title in by_title)
    assert not any(panel.empty for panel in panels)
    title, steps = dashboard_panels.within_round(rounds)
    assert title.startswith("**Within round 1** (done)")
    assert [len(series.points) for series in steps[0].series] == [len(m[HISTORY])] * 2


def test_without_rounds_every_panel_says_so():
    with Store(":memory:") as store:
        view = DashboardHandlers(store, AppConfig()).refresh()
    assert dashboard_panels.NO_ROUNDS in view.across and "<svg" not in view.across
    assert dashboard_panels.NO_STEPS in view.within and view.headline.startswith("**No rounds yet.**")


def test_the_disk_line_shows_the_checkpoint_folder_by_kind_and_the_database(demo_db):
    root = demo_db.parent / "checkpoints" / "demo"  # <round.checkpoints_dir>/<db name>, as the app passes it
    with Store(demo_db) as store:
        view = DashboardHandlers(store, AppConfig(checkpoints_dir=root)).refresh()
        without = DashboardHandlers(store, AppConfig()).refresh()
    size = r"\d+(\.\d)? [kMGT]?B"
    assert re.fullmatch(rf"Disk: checkpoints {size} \(1 policy, 1 reward model\) in {re.escape(str(root))}, "
                        rf"database {size}", view.disk), view.disk
    assert re.fullmatch(rf"Disk: database {size}", without.disk)


def test_the_people_table_is_for_admins(demo_db):
    with Store(demo_db) as store:
        dashboard = DashboardHandlers(store, AppConfig(sessions=None))
        anyone = dashboard.refresh(Session(name="ann"))
        boss = dashboard.refresh(Session(name="boss"))
    assert anyone.people_note == PEOPLE_FOR_ADMINS and anyone.people.empty
    assert set(boss.people["annotator"]) == {"sim:longer", "ann"}


def test_panels_map_values_to_the_plot_area_and_escape_their_labels():
    panel = Panel("<b>KL</b>", [Series("a", [(1, 0.0), (2, 1.0)])], references=[(0.5, "half")])
    svg = panel_svg(panel)
    assert "&lt;b&gt;KL&lt;/b&gt;" in svg and "<b>" not in svg
    # y ticks 0, 0.25 ... 1 span the plot area: 0 at its bottom (HEIGHT - 34), 1 at its top (12), 0.5 midway
    assert 'points="52.0,156.0 328.0,12.0"' in svg and 'y1="84.0"' in svg
    assert "http" not in svg and "<script" not in svg
    empty = panel_svg(Panel("x", [Series("a", [])], empty_note="No rounds yet."))
    assert "No rounds yet." in empty and "<svg" not in empty
    assert nice_ticks(0, 1) == [0, 0.25, 0.5, 0.75, 1.0] and nice_ticks(3, 57) == [0, 20, 40, 60]
    assert (tick_text(0.25, True), tick_text(0.125, True), tick_text(1500, False)) == ("25%", "12.5%", "1.5k")
    assert HEIGHT == 190


def test_people_figures_worked_out_by_hand():
    votes = [Vote(i, pair, name, choice, a_on_left, seconds, "") for i, (pair, name, choice, a_on_left, seconds) in
             enumerate([(1, "ann", "a", True, 4.0), (2, "ann", "b", True, 6.0), (3, "ann", "tie", True, 9.0),
                        (1, "bob", "a", True, 1.0), (2, "bob", "b", False, 1.0), (3, "bob", "b", False, None)])]
    # ann: a/b votes on pairs 1 (a, a on the left: left) and 2 (b, a on the left: right); bob: a on the left, then b
    # on the left twice: three left picks
    labels = {1: {"ann": "a", "bob": "a"}, 2: {"ann": "b", "bob": "b"}, 3: {"ann": "tie", "bob": "b"}}
    ann, bob = sorted(people(votes, agreement_report(labels)), key=lambda person: person.name)
    assert (ann.votes, ann.ab_votes, ann.left_picks, ann.median_seconds) == (3, 2, 1, 6.0)
    assert (bob.ab_votes, bob.left_picks, bob.median_seconds) == (3, 3, 1.0)
    assert bob.left_p == pytest.approx(0.25)  # 3 of 3 at a fair 50%: (1 + 1) / 8, both tails
    assert ann.agreement == pytest.approx(2 / 3) and ann.shared_pairs == 3  # agreed on pairs 1 and 2, not on 3
    assert people_rows([bob])[0][3] == f"100% ({wilson_interval(1.0, 3)[0]:.0%}-100%)"
    # Dawid-Skene (annotate.reliability) on pairs 1 and 2, the only ones with two a/b votes: they agreed on both, and
    # with two votes each the Beta(2, 2) prior outweighs it (the fixed point solves (2p - 1)^3 = 0: p = 1/2, reached
    # slowly); the table says so with n
    assert (ann.reliability.n, bob.reliability.n) == (2, 2) and abs(ann.reliability.accuracy - 0.5) < 0.05
    assert people_rows([ann])[0][7] == f"{ann.reliability.accuracy:.0%} ({ann.reliability.low:.0%}-" \
                                       f"{ann.reliability.high:.0%}, n=2)"
    assert binomial_two_sided_p(9, 10) == pytest.approx(22 / 1024) and binomial_two_sided_p(0, 0) == 1.0
    assert math.isclose(binomial_two_sided_p(5, 10), 1.0)


def test_the_round_report_shows_in_a_sandboxed_frame_with_its_answers(demo_db):
    import html

    from annotate.round_report import RoundReport

    with Store(demo_db) as store:
        view = DashboardHandlers(store, AppConfig()).refresh()
        kept = RoundReport.from_dict(store.round_report(1))
    assert view.report_round["choices"] == [1]
    assert view.report_round["value"] == 1
    assert view.report.startswith('<iframe title="Round 1 report" sandbox srcdoc="')
    assert len(kept.answers) == 4  # the demo's 4 evaluation prompts, before and after
    page = html.unescape(view.report.split('srcdoc="', 1)[1].rsplit('"', 1)[0])
    assert all(html.escape(answer.prompt, quote=False) in page for answer in kept.answers)
    with Store(":memory:") as empty:
        assert "No round report yet" in DashboardHandlers(empty, AppConfig()).refresh().report


def test_the_people_table_has_one_width_a_column_summing_to_the_whole_table():
    assert len(PEOPLE_COLUMN_WIDTHS) == len(PEOPLE_COLUMNS)
    assert sum(int(width.rstrip("%")) for width in PEOPLE_COLUMN_WIDTHS) == 100
