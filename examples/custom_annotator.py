"""A custom simulated annotator with its score: plain language (short sentences, short words).

    python app.py --simulate examples.custom_annotator:judge --votes 50
    python app.py --demo-loop --annotator examples.custom_annotator:judge

`judge(prompt, answer_a, answer_b)` is what votes: "a", "b", "tie" or "both_bad". `score(text) -> float` (higher is
preferred) is optional: when the judge's module defines it, annotate.simulate.resolve_score returns it, and the demo
loop prints each policy's mean judge score as it does for the built-in rules. Keep the two consistent: here the
judge simply compares the scores.
"""

from __future__ import annotations

import re


def syllables(word: str) -> int:
    """Groups of vowels, a silent final e dropped, at least one: the usual estimate for a reading-ease formula."""
    word = word.lower()
    groups = len(re.findall(r"[aeiouy]+", word))
    if word.endswith("e") and not word.endswith(("le", "ee")) and groups > 1:
        groups -= 1
    return max(1, groups)


def score(text: str) -> float:
    """Flesch reading ease / 100: (206.835 - 1.015 x words a sentence - 84.6 x syllables a word) / 100; about 1 for
    plain short sentences, near 0 or below for long sentences of long words; 0 for a text without words."""
    words = re.findall(r"[A-Za-z]+(?:'[A-Za-z]+)?", text)
    if not words:
        return 0.0
    sentences = max(1, len([part for part in re.split(r"[.!?\n]+", text) if re.search(r"[A-Za-z]", part)]))
    per_word = sum(syllables(word) for word in words) / len(words)
    return (206.835 - 1.015 * len(words) / sentences - 84.6 * per_word) / 100


def judge(prompt: str, answer_a: str, answer_b: str) -> str:
    """Prefers the answer that is easier to read; "both_bad" when neither has a word, "tie" on equal scores."""
    if not re.search(r"[A-Za-z]", answer_a + answer_b):
        return "both_bad"
    score_a, score_b = score(answer_a), score(answer_b)
    if score_a == score_b:
        return "tie"
    return "a" if score_a > score_b else "b"
