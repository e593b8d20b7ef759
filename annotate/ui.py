"""The annotation app: `build_app(store, job, runner, config) -> gr.Blocks`, its three tabs side by side.

Handlers are plain methods of `AnnotateHandlers` (annotate/ui_annotate.py; `AdminHandlers`, `DashboardHandlers`
likewise) taking the session and the request, so tests call them without a browser; the tabs' builders only lay out
components and wire events. Every handler goes through the store: no SQL, no files here. No module-level state:
everything lives in the objects `build_app` creates, so two apps (tests) never share anything.
"""

from __future__ import annotations

from dataclasses import replace

import gradio as gr

from annotate.background import PairJob, RoundStarter
from annotate.identity import SessionTokens
from annotate.store import Store
from annotate.ui_admin import AdminHandlers, build_admin_tab
from annotate.ui_annotate import AnnotateHandlers, build_annotate_tab
from annotate.ui_dashboard import DashboardHandlers, DashboardTab, build_dashboard_tab
from annotate.ui_session import PRIVATE_EVENT, SET_COOKIE_JS, AppConfig, Session
from annotate.ui_style import CSS, keyboard_js
from annotate.ui_votes import KEYS

# Keys 1-7 click the vote buttons (annotate/ui_votes.py: graded choices, screen sides, strengths).
KEYBOARD_JS = keyboard_js(KEYS)


def build_app(store: Store, job: PairJob, runner: RoundStarter, config: AppConfig | None = None) -> gr.Blocks:
    """The whole app. `job` makes pairs in the background (a child process in the app, loop.children; a fake
    generator in tests), `runner` starts training rounds as child processes; on a first start with prompts and no
    pairs the job makes config.first_batch_pairs."""
    config = config or AppConfig()
    if config.sessions is None and not config.require_auth:
        config = replace(config, sessions=SessionTokens.beside(store.path))
    for admin in config.admins:
        store.set_role(admin, "admin")
    if config.first_batch_pairs > 0 and store.count_pairs() == 0 and store.count_prompts() > 0:
        job.start(config.first_batch_pairs, versus_share=0.0, started_by="first start")
    annotate = AnnotateHandlers(store, config, job, runner)
    admin = AdminHandlers(store, config, job, runner)
    dashboard = DashboardHandlers(store, config)

    with gr.Blocks(title="rlhf-loop", analytics_enabled=False) as demo:
        session = gr.State(Session())
        gr.HTML(f"<style>{CSS}</style>", container=False, js_on_load=None)
        with gr.Tabs():
            with gr.Tab("Annotate", id="annotate") as annotate_tab_block:
                annotate_tab = build_annotate_tab(annotate, config, session)
            with gr.Tab("Dashboard", id="dashboard") as dashboard_tab_block:
                dashboard_tab = build_dashboard_tab(dashboard, session, config)
            with gr.Tab("Admin", id="admin", visible=False) as admin_tab_block:  # shown to admins on sign-in
                admin_timer, admin_outputs = build_admin_tab(admin, session, config)

        _switch_timers_with_tabs((annotate_tab_block, dashboard_tab_block, admin_tab_block), session, dashboard,
                                 dashboard_tab, admin, (admin_timer, admin_outputs))
        demo.load(None, js=KEYBOARD_JS)
        # With an auth file the login already named this person; without one the session cookie may: sign them in.
        loaded = demo.load(annotate_tab.on_load, [session], annotate_tab.sign_in_outputs, **PRIVATE_EVENT)
        loaded.then(None, [annotate_tab.cookie], None, js=SET_COOKIE_JS)

        def show_admin_tab(state: Session, request: gr.Request):
            return gr.Tab(visible=admin.tab_visible(state, request))

        for signed_in in (loaded, *annotate_tab.sign_in_events):
            signed_in.then(show_admin_tab, [session], [admin_tab_block], **PRIVATE_EVENT)
        # filled on page load, before anyone opens the tab (and by its timer while it is open)
        def fill_dashboard(state: Session, request: gr.Request):
            return dashboard_tab.render(dashboard.refresh(state, request))

        loaded.then(fill_dashboard, [session], dashboard_tab.outputs, show_progress="hidden", **PRIVATE_EVENT)
    return demo


def _switch_timers_with_tabs(tab_blocks: tuple[gr.Tab, gr.Tab, gr.Tab], session: gr.State,
                             dashboard: DashboardHandlers, dashboard_tab: DashboardTab, admin: AdminHandlers,
                             admin_page: tuple[gr.Timer, list]) -> None:
    """The Dashboard and Admin pages refresh on a timer only while they are open (tab_blocks: Annotate, Dashboard,
    Admin), so twenty annotators on the Annotate tab cost no polling; opening one fills it at once."""
    annotate_tab_block, dashboard_tab_block, admin_tab_block = tab_blocks
    dashboard_timer, (admin_timer, admin_outputs) = dashboard_tab.timer, admin_page

    def open_dashboard(state: Session, report_round, request: gr.Request):
        return {dashboard_timer: gr.Timer(active=True), admin_timer: gr.Timer(active=False),
                **dashboard_tab.render(dashboard.refresh(state, request, report_round))}

    def open_admin(state: Session, request: gr.Request):
        return gr.Timer(active=False), gr.Timer(active=True), *admin.overview(state, request)

    annotate_tab_block.select(lambda: (gr.Timer(active=False), gr.Timer(active=False)), None,
                              [dashboard_timer, admin_timer], **PRIVATE_EVENT)
    dashboard_tab_block.select(open_dashboard, [session, dashboard_tab.components["report_round"]],
                               [dashboard_timer, admin_timer, *dashboard_tab.outputs], **PRIVATE_EVENT)
    admin_tab_block.select(open_admin, [session], [dashboard_timer, admin_timer, *admin_outputs], **PRIVATE_EVENT)
