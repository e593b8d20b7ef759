"""Admin tab: prompts, pairs, rounds, export, annotators, exclusion and gold pairs (annotate/ui_people_admin.py).
Every handler checks the role on the server first.

Hiding buttons protects nothing (anyone can call a Gradio endpoint), so each handler starts with `refusal()`,
which looks up the signed-in person's role in the store at the time of the call.
"""

from __future__ import annotations

import html
import tempfile
import time
from pathlib import Path
from typing import Iterator

import gradio as gr
import pandas as pd

from annotate.background import PairJob, RoundStarter
from annotate.importers import ACCEPTED_FILES, PromptImportError
from annotate.records import ROLES
from annotate.store import Store
from annotate.ui_people_admin import PeopleAdmin, build_people_admin
from annotate.ui_session import PRIVATE_EVENT, AppConfig, Session, clean_name, escape, signed_in_name

EXPORT_FORMATS = ("jsonl", "parquet")
MAX_PAIRS_PER_REQUEST = 10_000
ANNOTATOR_COLUMNS = ["name", "role", "votes", "since"]


class AdminHandlers(PeopleAdmin):
    """Plain functions behind the admin tab; each returns what the page shows, refusals included."""

    def __init__(self, store: Store, config: AppConfig, job: PairJob, runner: RoundStarter):
        self.store, self.config, self.job, self.runner = store, config, job, runner

    def refusal(self, session: Session | None, request: gr.Request | None = None) -> str | None:
        """None when the caller is an admin now; otherwise the reason, for the page."""
        name = signed_in_name(session, request, self.config)
        if name is None:
            return "Sign in first (Annotate tab)."
        if not self.store.is_admin(name):
            return f"Only admins can do this: {escape(name)} is an annotator. An admin can change roles below."
        return None

    def _name(self, session: Session | None, request: gr.Request | None = None) -> str:
        return signed_in_name(session, request, self.config) or ""

    def who(self, session: Session | None, request: gr.Request | None = None) -> str:
        name = signed_in_name(session, request, self.config)
        if name is None:
            return "Sign in on the Annotate tab first."
        if self.store.is_admin(name):
            return f"Signed in as **{escape(name)}** (admin)."
        return (f"Signed in as **{escape(name)}** (annotator): the actions on this page are for admins and will be "
                "refused.")

    def tab_visible(self, session: Session | None, request: gr.Request | None = None) -> bool:
        """Whether the page shows this person the Admin tab: to admins only. Hiding it spares annotators buttons that
        would refuse them; it protects nothing, so every handler here still checks the role."""
        return self.refusal(session, request) is None

    def annotators_frame(self, session: Session | None, request: gr.Request | None = None) -> pd.DataFrame:
        if self.refusal(session, request):
            return pd.DataFrame(columns=ANNOTATOR_COLUMNS)
        rows = [(a.name, a.role, a.votes, a.created_at[:16].replace("T", " ")) for a in self.store.annotators()]
        return pd.DataFrame(rows, columns=ANNOTATOR_COLUMNS)

    def import_prompts(self, file_path: str | None, session: Session, request: gr.Request | None = None) -> str:
        if refused := self.refusal(session, request):
            return refused
        if not file_path:
            return f"Choose a file first: {ACCEPTED_FILES}."
        # Gradio keeps the uploaded file under a temporary folder with its original name: messages use that name.
        name = Path(file_path).name
        try:
            result = self.store.import_prompts(file_path, source=name, max_prompt_chars=self.config.max_prompt_chars)
        except PromptImportError as error:
            return f"Nothing imported: {escape(error.naming(name))}"
        except (ValueError, OSError) as error:
            return f"Nothing imported from {escape(name)}: {escape(str(error).replace(str(file_path), name))}"
        return (f"Imported {result.added} new prompts from {escape(name)}"
                f"{f' ({result.skipped} already there)' if result.skipped else ''}; "
                f"{self.store.count_prompts()} prompts in all.")

    def generate_pairs(self, n_pairs: float | None, versus_share: float | None, session: Session,
                       request: gr.Request | None = None) -> tuple[bool, str]:
        """Start a generation batch in the background; (started, message)."""
        if refused := self.refusal(session, request):
            return False, refused
        n = int(n_pairs or 0)
        if not 1 <= n <= MAX_PAIRS_PER_REQUEST:
            return False, f"Ask for between 1 and {MAX_PAIRS_PER_REQUEST} pairs, not {n}."
        if self.store.count_prompts() == 0:
            return False, "There are no prompts yet: import some first."
        return self.job.start(n, float(versus_share or 0.0), started_by=self._name(session, request))

    def generation_progress(self, poll_s: float = 0.5) -> Iterator[str]:
        """HTML progress bar of the running batch, again every poll_s seconds until it ends; then its outcome."""
        while self.job.running():
            job = self.job.progress()
            yield (f'<progress value="{job.done}" max="{max(job.total, 1)}" style="width: 100%"></progress>'
                   f"<div>{html.escape(self.job.status_text())}</div>")
            time.sleep(poll_s)
        yield f"<div>{html.escape(self.job.status_text())}</div>"

    def start_round(self, session: Session, request: gr.Request | None = None) -> str:
        if refused := self.refusal(session, request):
            return refused
        _started, message = self.runner.start(started_by=self._name(session, request))
        return message

    def set_auto_every(self, every: float | None, session: Session, request: gr.Request | None = None) -> str:
        if refused := self.refusal(session, request):
            return refused
        try:
            self.runner.set_auto_every(int(every or 0))
        except ValueError as error:
            return str(error)
        if self.runner.auto_every == 0:
            return "Auto-start is off."
        return f"A round starts automatically after every {self.runner.auto_every} new votes."

    def export(self, file_format: str, session: Session,
               request: gr.Request | None = None) -> tuple[str | None, str]:
        """(path of the file to download or None, message)."""
        if refused := self.refusal(session, request):
            return None, refused
        if file_format not in EXPORT_FORMATS:
            return None, f"Export format must be one of {', '.join(EXPORT_FORMATS)}."
        path = Path(tempfile.mkdtemp(prefix="rlhf-loop-export-")) / f"preferences.{file_format}"
        rows = self.store.export_jsonl(path) if file_format == "jsonl" else self.store.export_parquet(path)
        return str(path), (f"{rows} preferences (prompt, chosen, rejected): pairs with a majority among their "
                           "A/B votes.")

    def set_role(self, raw_name: str, role: str, session: Session,
                 request: gr.Request | None = None) -> tuple[str, pd.DataFrame]:
        if refused := self.refusal(session, request):
            return refused, self.annotators_frame(session, request)
        name, problem = clean_name(raw_name)
        if name is None:
            return problem, self.annotators_frame(session, request)
        if role not in ROLES:
            return f"Role must be one of {', '.join(ROLES)}.", self.annotators_frame(session, request)
        me = self._name(session, request)
        if name == me and role != "admin" and sum(a.role == "admin" for a in self.store.annotators()) <= 1:
            return "You are the only admin: make someone else admin first.", self.annotators_frame(session, request)
        self.store.set_role(name, role)
        return f"{escape(name)} is now {role}.", self.annotators_frame(session, request)

    def overview(self, session: Session,
                 request: gr.Request | None = None) -> tuple[str, str, str, str, pd.DataFrame]:
        """(who, round status, round log, generation status, annotators) for the periodic refresh."""
        who = self.who(session, request)
        if self.refusal(session, request):
            return who, "", "", "", self.annotators_frame(session, request)
        return (who, self.runner.status_text(), self.runner.log_text(), self.job.status_text(),
                self.annotators_frame(session, request))


def build_admin_tab(handlers: AdminHandlers, session: gr.State, config: AppConfig) -> tuple[gr.Timer, list]:
    """Lay out the admin tab inside the current gr.Tab; returns (its refresh timer, the overview outputs)."""
    who = gr.Markdown(elem_id="admin-who")
    with gr.Accordion("Prompts", open=True):
        upload = gr.File(label=f"Prompt file: {ACCEPTED_FILES}", type="filepath")
        import_button = gr.Button("Import prompts")
        import_message = gr.Markdown()
    with gr.Accordion("Pairs", open=True):
        gr.Markdown("Once a round has trained a reward model, the sample pairs are the ones it is least sure about "
                    "(four answers a prompt, the pair its heads disagree on most; a quarter at random), so each vote "
                    "teaches it the most.")
        with gr.Row():
            n_pairs = gr.Number(32, precision=0, minimum=1, maximum=MAX_PAIRS_PER_REQUEST, label="Pairs to generate")
            versus_share = gr.Slider(0.0, 1.0, value=config.versus_share, step=0.05,
                                     label="Versus share (current policy against an earlier one)")
        generate_button = gr.Button("Generate pairs now")
        generate_message = gr.HTML(elem_id="generate-message", js_on_load=None)
        job_status = gr.Markdown()
    with gr.Accordion("Training rounds", open=True):
        round_status = gr.Markdown(elem_id="round-status")
        with gr.Row():
            start_round = gr.Button("Start a round now", variant="primary", elem_id="start-round")
            auto_every = gr.Number(handlers.runner.auto_every, precision=0, minimum=0,
                                   label="Auto-start a round every N new votes (0 = off)")
            auto_button = gr.Button("Save auto-start")
        round_message = gr.Markdown(elem_id="round-message")
        round_log = gr.Textbox(label="Round log", lines=12, max_lines=20, interactive=False, autoscroll=True,
                               elem_id="round-log")
    with gr.Accordion("Export preferences", open=False):
        export_format = gr.Radio(list(EXPORT_FORMATS), value="jsonl", label="Format")
        export_button = gr.Button("Export")
        export_file = gr.File(label="Download", interactive=False)
        export_message = gr.Markdown()
    with gr.Accordion("Annotators and roles", open=False):
        annotators = gr.Dataframe(pd.DataFrame(columns=ANNOTATOR_COLUMNS), interactive=False, elem_id="annotators")
        with gr.Row():
            role_name = gr.Textbox(label="Name", max_length=64)
            role = gr.Radio(list(ROLES), value="annotator", label="Role")
            role_button = gr.Button("Set role")
        role_message = gr.Markdown()
    build_people_admin(handlers, session)
    timer = gr.Timer(config.refresh_s, active=False)

    def generate_event(n, share, state: Session, request: gr.Request):
        started, message = handlers.generate_pairs(n, share, state, request)
        yield html.escape(message)
        if started:  # follow the batch with a progress bar; the page stays usable meanwhile
            yield from handlers.generation_progress()

    import_button.click(handlers.import_prompts, [upload, session], import_message, **PRIVATE_EVENT)
    generate_button.click(generate_event, [n_pairs, versus_share, session], generate_message, **PRIVATE_EVENT)
    start_round.click(handlers.start_round, [session], round_message, api_name="start_round",
                      concurrency_limit=None)
    auto_button.click(handlers.set_auto_every, [auto_every, session], round_message, **PRIVATE_EVENT)
    export_button.click(handlers.export, [export_format, session], [export_file, export_message], **PRIVATE_EVENT)
    role_button.click(handlers.set_role, [role_name, role, session], [role_message, annotators], **PRIVATE_EVENT)
    overview_outputs = [who, round_status, round_log, job_status, annotators]
    timer.tick(handlers.overview, [session], overview_outputs, show_progress="hidden", **PRIVATE_EVENT)
    return timer, overview_outputs
