"""How the annotate page looks on any screen: its CSS, the script that brings a new pair into view, and long prompts
folded behind "show all".

The layout keeps voting one tap away: answers (and the prompt) scroll inside boxes of bounded height, so a page
with 3,000-word answers or a 100 KB prompt stays about a screen tall, and the vote buttons sit in a bar that sticks
to the bottom of the screen while the pair is taller than it.
"""

from __future__ import annotations

import html
import json

from annotate.ui_session import render_untrusted

FOLD_PROMPT_CHARS = 1500
"""Prompts longer than this (or than FOLD_PROMPT_LINES lines) show their start and a "show all" fold."""
FOLD_PROMPT_LINES = 25
PREVIEW_CHARS = 600

CSS = """
.untrusted { white-space: normal; overflow-wrap: anywhere; }
.untrusted pre { white-space: pre-wrap; background: var(--background-fill-secondary);
  border: 1px solid var(--border-color-primary); border-radius: 6px; padding: 0.6em 0.8em; }
.untrusted code { background: var(--background-fill-secondary); border-radius: 4px; padding: 0.1em 0.3em;
  font-family: var(--font-mono); font-size: 0.92em; }
.untrusted pre code { background: none; padding: 0; }
.untrusted table { border-collapse: collapse; margin: 0.5em 0; display: block; width: max-content; max-width: 100%;
  overflow-x: auto; border: 0; }
.untrusted th, .untrusted td { border: 1px solid var(--border-color-primary); padding: 0.25em 0.6em; text-align: left; }
.untrusted th { background: var(--background-fill-secondary); }
/* Gradio styles its blocks inline (overflow: visible) and clips its container (overflow: hidden, which makes it the
   scroll box that a sticky element sticks in, though it never scrolls): both are overridden here. */
.gradio-container { overflow: clip !important; }
#answer-left, #answer-right, #prompt { border: 1px solid var(--border-color-primary); border-radius: 8px;
  padding: 0.75em; min-height: 4em; overflow: auto !important; }
#answer-left, #answer-right { max-height: 45vh; }
#prompt { max-height: 30vh; }
#prompt:has(details[open]) { max-height: 60vh; }
.long-prompt summary { cursor: pointer; list-style: none; }
.long-prompt summary::-webkit-details-marker { display: none; }
.long-prompt .prompt-preview { white-space: pre-wrap; overflow-wrap: anywhere; }
.long-prompt .show-all { display: inline-block; margin-bottom: 0.4em; font-weight: 600;
  color: var(--color-accent, #2563eb); }
.long-prompt .show-less, .long-prompt[open] .prompt-preview, .long-prompt[open] .show-all { display: none; }
.long-prompt[open] .show-less { display: inline-block; margin: 0 0 0.4em; font-weight: 600;
  color: var(--color-accent, #2563eb); }
#vote-bar { position: sticky; bottom: 0; z-index: 20; gap: 6px; padding: 6px 0;
  background: var(--background-fill-primary); border-top: 1px solid var(--border-color-primary); }
#vote-bar button { min-width: 0; }
@media (max-width: 640px) {
  #answer-left, #answer-right { max-height: 30vh; }
  #prompt { max-height: 22vh; }
  /* the A/B scale on one row of five, both-bad and skip on a second row */
  #vote-bar { gap: 4px; }
  #vote-bar button { flex: 1 1 17%; padding: 4px 2px; font-size: 0.8em; line-height: 1.2; }
  #vote-bar #vote-both_bad, #vote-bar #vote-skip { flex: 1 1 40%; }
}
"""



def keyboard_js(button_ids: dict[str, str]) -> str:
    """Keys click buttons ({key: element id}); typing in a text box (the better-answer box, the sign-in name) is left
    alone, and so are hidden or disabled buttons."""
    return """
() => {
  if (window.__rlhfLoopKeys) return;
  window.__rlhfLoopKeys = true;
  const buttons = %s;
  document.addEventListener('keydown', (event) => {
    if (event.ctrlKey || event.metaKey || event.altKey || event.repeat) return;
    const target = event.target;
    const tag = target && target.tagName ? target.tagName.toLowerCase() : '';
    if (tag === 'input' || tag === 'textarea' || tag === 'select' || (target && target.isContentEditable)) return;
    const id = buttons[event.key];
    if (!id) return;
    const button = document.getElementById(id);
    if (!button || button.offsetParent === null || button.disabled) return;
    event.preventDefault();
    button.click();
  });
}
""" % json.dumps(button_ids)


# After a vote (mouse, tap or key) the new pair is read from its top: the page and every scrolled box go back up.
SHOW_NEW_PAIR_JS = """
() => {
  requestAnimationFrame(() => {
    window.scrollTo({top: 0, left: 0, behavior: 'instant'});
    for (const id of ['prompt', 'answer-left', 'answer-right']) {
      const box = document.getElementById(id);
      if (box) box.scrollTop = 0;
    }
  });
}
"""


def render_prompt(text: str) -> str:
    """The prompt as safe HTML (render_untrusted); a very long one shows its start as plain text and the whole
    prompt behind "show all"."""
    if len(text) <= FOLD_PROMPT_CHARS and text.count("\n") < FOLD_PROMPT_LINES:
        return render_untrusted(text)
    preview = "\n".join(text[:PREVIEW_CHARS].splitlines()[:FOLD_PROMPT_LINES // 2]).rstrip()
    # The toggle comes first: opening from the top leaves the box showing the prompt's start.
    return (f'<details class="long-prompt"><summary><span class="show-all">Show all ({len(text):,} characters)</span>'
            f'<span class="show-less">Show less</span><div class="prompt-preview">{html.escape(preview)}…</div>'
            f"</summary>{render_untrusted(text)}</details>")
