"""Dashboard tab: did the last round help? The headline of the last round, one small panel per quantity across rounds
(annotate.dashboard_panels, drawn by annotate.plots), PPO step by step, the rounds and the human win rates, votes and
agreement, the people (admins only) and a round's report.

Handlers read the store and return a `DashboardView`; the tab maps each of its fields to one component, so a field
added is a component added, never a position counted. The page fills on load, and while the tab is open it refreshes
on a timer, so a round that ends shows without pressing anything.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, fields
from datetime import datetime

import gradio as gr
import pandas as pd

from annotate import dashboard_panels as panels
from annotate.disk import disk_line, named_checkpoints
from annotate.people import PEOPLE_COLUMNS, people_rows, store_people
from annotate.promotion import refresh_promotions
from annotate.records import WinRate
from annotate.plots import panels_html
from annotate.round_report import RoundReport, report_html, with_votes_now
from annotate.store import Store
from annotate.store.sql import now
from annotate.ui_session import PRIVATE_EVENT, AppConfig, Session, signed_in_name

AGREEMENT_COLUMNS = ["annotator 1", "annotator 2", "pairs", "agreement", "kappa"]
PEOPLE_COLUMN_WIDTHS = ["9%", "5%", "5%", "9%", "5%", "8%", "5%", "9%", "9%", "9%", "8%", "19%"]
"""The people table's columns (annotate.people.PEOPLE_COLUMNS): wide enough that an empty one keeps its header
readable, the widest for the reason someone looks careless."""
PEOPLE_FOR_ADMINS = "The per-annotator table is shown to admins (sign in as one on the Annotate tab)."
NO_REPORT = "No round report yet: each round ends with one (or `python app.py --report N` makes it)."


@dataclass
class DashboardView:
    """What the tab shows, one field a component."""

    counts: str
    disk: str
    """The disk the loop uses: its checkpoint folder (policies, reward models) and the database."""
    headline: str
    across: str
    """HTML: the panels across rounds."""
    within_title: str
    within: str
    """HTML: the last round's PPO steps."""
    rounds: pd.DataFrame
    win_rates: pd.DataFrame
    by_annotator: pd.DataFrame
    agreement_text: str
    agreement: pd.DataFrame
    people_note: str
    people: pd.DataFrame
    report_round: dict | None
    """The round picker: the rounds with a report, the one shown chosen (None: left as it is)."""
    report: str | None
    """HTML: the chosen round's report, in a sandboxed frame (its page and styles kept apart from the app's); None:
    left as it is, so the timer does not reload a report someone is reading."""


class DashboardHandlers:
    """Reads the store and shapes it for the dashboard; it writes only promotion decisions the votes changed."""

    def __init__(self, store: Store, config: AppConfig):
        self.store, self.config = store, config

    def counts_markdown(self, stats: dict) -> str:
        by_choice = stats["votes_by_choice"]
        choices = " · ".join(f"{name.replace('_', ' ')}: {count}" for name, count in by_choice.items())
        return (f"**Prompts** {stats['prompts']} · **pairs** {stats['pairs']} · **waiting** {stats['pairs_waiting']}"
                f" · **votes** {stats['votes']} · **preferences** (trainable pairs) {stats['preferences']}"
                f" · **better answers written** {stats['demonstrations']}\n\nVotes by choice: {choices}")

    def disk(self, policies, rounds) -> str:
        """The Disk line (annotate.disk.disk_line) of the checkpoint folder the app was given, and the database."""
        root = self.config.checkpoints_dir
        checkpoints = named_checkpoints(policies, rounds, root) if root is not None else []
        return disk_line(root, self.store.path, checkpoints)

    def agreement(self, report) -> tuple[str, pd.DataFrame]:
        rows = [(p.annotator_1, p.annotator_2, p.items, f"{p.percent:.0%}",
                 "" if p.kappa is None else f"{p.kappa:.2f}") for p in report.by_pair]
        frame = pd.DataFrame(rows, columns=AGREEMENT_COLUMNS)
        if report.items == 0:
            return "No pair has two or more votes yet (start the app with overlap above 1 to measure agreement).", frame
        kappa = "undefined (one label only)" if report.kappa is None else f"{report.kappa:.2f}"
        return (f"Agreement over {report.items} pairs with two or more votes: **{report.percent:.0%}**, "
                f"Cohen's kappa **{kappa}**."), frame

    def people(self, agreement, session: Session | None, request) -> tuple[str, pd.DataFrame]:
        """The per-annotator table for an admin; an empty one, and why, for anyone else."""
        name = signed_in_name(session, request, self.config)
        if name is None or not self.store.is_admin(name):
            return PEOPLE_FOR_ADMINS, pd.DataFrame(columns=PEOPLE_COLUMNS)
        rows = people_rows(store_people(self.store, agreement))
        note = "Left picks: a/b votes for the answer shown on the left; p: the chance of so many or so few at a fair " \
               "50%. Agreement: with the others who voted on the same pairs. Dawid-Skene: accuracy on pairs with two " \
               "or more a/b votes. Gold: on pairs an admin marked (--gold). Reward model: the share of their votes " \
               "that a head fitted on everyone else's votes agrees with (a coin's: half), as of the last round. " \
               "Accuracy for weighting: what [votes] weighting = \"reliability\" weighs their votes by (a coin's " \
               "50% weighs nothing), from gold, else Dawid-Skene, else that agreement, at most what a side bias " \
               "allows. Looks careless: a reason to look, not a verdict; python app.py --exclude NAME leaves " \
               "someone's votes out of the next rounds."
        return note, pd.DataFrame(rows, columns=PEOPLE_COLUMNS)

    def report(self, wanted, win_rates: list[WinRate] | None = None) -> tuple[dict, str]:
        """(the picker's update, the report's frame) for round `wanted`, else the newest round with a report; its
        versus votes counted as of now (they arrive after the round), from `win_rates` when the caller has them."""
        ids = self.store.round_report_ids()
        if not ids:
            return gr.update(choices=[], value=None), f"<p>{html.escape(NO_REPORT)}</p>"
        chosen = int(wanted) if wanted is not None and int(wanted) in ids else ids[-1]
        win_rates = self.store.versus_win_rates() if win_rates is None else win_rates
        report = with_votes_now(RoundReport.from_dict(self.store.round_report(chosen)), win_rates, now())
        frame = (f'<iframe title="Round {chosen} report" sandbox srcdoc="{html.escape(report_html(report))}" '
                 'style="width:100%;height:80vh;border:1px solid #e5e7eb;border-radius:6px"></iframe>')
        return gr.update(choices=ids, value=chosen), frame

    def refresh(self, session: Session | None = None, request: gr.Request | None = None,
                report_round=None, with_report: bool = True) -> DashboardView:
        """Everything the tab shows; without `with_report` the report and its picker are left as they are (None)."""
        stats = self.store.stats()
        if self.config.promotion is not None:  # votes since the last round may have promoted or held back its policy
            refresh_promotions(self.store, self.config.promotion, self.config.weighting)
        rounds, win_rates, policies = self.store.rounds(), self.store.versus_win_rates(), self.store.policies()
        by_annotator = pd.DataFrame(sorted(stats["votes_by_annotator"].items(), key=lambda item: -item[1]),
                                    columns=["annotator", "votes"])
        report = self.store.agreement()
        agreement_text, agreement = self.agreement(report)
        people_note, people_frame = self.people(report, session, request)
        within_title, within = panels.within_round(rounds)
        report_round, report = self.report(report_round, win_rates) if with_report else (None, None)
        return DashboardView(
            counts=self.counts_markdown(stats), disk=self.disk(policies, rounds),
            headline=panels.headline(rounds, win_rates, policies),
            across=panels_html(panels.across_rounds(rounds, win_rates, policies)), within_title=within_title,
            within=panels_html(within),
            rounds=pd.DataFrame(panels.rounds_rows(rounds, now=datetime.now().astimezone()),
                                columns=panels.ROUND_COLUMNS),
            win_rates=pd.DataFrame(panels.win_rate_rows(win_rates, policies), columns=panels.WIN_RATE_COLUMNS),
            by_annotator=by_annotator, agreement_text=agreement_text, agreement=agreement, people_note=people_note,
            people=people_frame, report_round=report_round, report=report)


@dataclass
class DashboardTab:
    """The tab's components, one per DashboardView field, and its refresh timer."""

    components: dict[str, gr.components.Component]
    timer: gr.Timer

    @property
    def outputs(self) -> list:
        return list(self.components.values())

    def render(self, view: DashboardView) -> dict:
        """The view as Gradio's {component: value}; a field that is None leaves its component as it is."""
        return {self.components[f.name]: getattr(view, f.name) for f in fields(DashboardView)
                if getattr(view, f.name) is not None}


def _table(columns: list[str], label: str, **extra) -> gr.Dataframe:
    return gr.Dataframe(pd.DataFrame(columns=columns), label=label, interactive=False, wrap=True, **extra)


def _layout() -> dict[str, gr.components.Component]:
    """The components, top to bottom, keyed by the DashboardView field each shows."""
    parts = {"counts": gr.Markdown(elem_id="dashboard-counts"), "disk": gr.Markdown(elem_id="dashboard-disk"),
             "headline": gr.Markdown(elem_id="dashboard-headline"),
             "across": gr.HTML(elem_id="dashboard-across", js_on_load=None)}
    parts["within_title"] = gr.Markdown(elem_id="dashboard-within-title")
    parts["within"] = gr.HTML(elem_id="dashboard-within", js_on_load=None)
    parts["rounds"] = _table(panels.ROUND_COLUMNS, "Rounds (newest first)", elem_id="rounds-table")
    parts["win_rates"] = _table(panels.WIN_RATE_COLUMNS, "People's win rate of each policy against an earlier one "
                                "(versus pairs; ties count half; Wilson 95% interval)", elem_id="win-rates-table")
    with gr.Row():
        parts["by_annotator"] = _table(["annotator", "votes"], "Votes by annotator")
        with gr.Column():
            parts["agreement_text"] = gr.Markdown()
            parts["agreement"] = _table(AGREEMENT_COLUMNS, "Agreement per annotator pair")
    with gr.Accordion("People (admins)", open=False):
        parts["people_note"] = gr.Markdown(elem_id="people-note")
        parts["people"] = _table(PEOPLE_COLUMNS, "Each annotator", elem_id="people-table",
                                 column_widths=PEOPLE_COLUMN_WIDTHS)
    with gr.Accordion("Round report: the same prompts before and after", open=False):
        parts["report_round"] = gr.Dropdown([], label="Round", elem_id="report-round", interactive=True)
        parts["report"] = gr.HTML(elem_id="round-report", js_on_load=None)
    return parts


def build_dashboard_tab(handlers: DashboardHandlers, session: gr.State, config: AppConfig) -> DashboardTab:
    """Lay out the dashboard inside the current gr.Tab; the caller fills it on page load and when the tab opens."""
    refresh_button = gr.Button("Refresh", size="sm")
    tab = DashboardTab(_layout(), gr.Timer(config.refresh_s, active=False))

    picker = tab.components["report_round"]

    def refresh(state: Session, report_round, request: gr.Request):
        return tab.render(handlers.refresh(state, request, report_round))

    def tick(state: Session, request: gr.Request):  # every refresh_s while the tab is open: the figures only
        return tab.render(handlers.refresh(state, request, with_report=False))

    def show_report(report_round):
        choice, frame = handlers.report(report_round)
        return {picker: choice, tab.components["report"]: frame}

    refresh_button.click(refresh, [session, picker], tab.outputs, **PRIVATE_EVENT)
    tab.timer.tick(tick, [session], tab.outputs, show_progress="hidden", **PRIVATE_EVENT)
    picker.input(show_report, [picker], [picker, tab.components["report"]], **PRIVATE_EVENT)
    return tab
