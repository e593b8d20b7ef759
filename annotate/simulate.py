"""Simulated annotators: rules or any Python callable that votes through the same store path as people.

A judge is a callable `(prompt, answer_a, answer_b) -> "a" | "b" | "tie" | "both_bad"`. Built-in rules:
`longer`, `shorter`, `contains:WORD`, `polite` (prefers the answer with more warm, polite words, a
preference that is neither length nor one token), `courteous` (the same with ten words of courtesy only), and four
that are not word lists (annotate.annotators): `structured` (lists and headings), `example` (a concrete example),
`formal` (formal register) and `concise` (information per word). TUNING_RULES are for development, HELD_OUT_RULES
only for reporting (docs/annotators.md). Noise flips a share of a/b votes, as disagreeing human labellers would.
Every simulated vote records a careful reader's seconds; teams with careless members beside these rules are
annotate.team.
"""

from __future__ import annotations

import importlib
import math
import random
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from annotate.annotators import (
    concision,
    concreteness,
    formality,
    score_scale,
    structure,
)

Judge = Callable[[str, str, str], str]
VALID_JUDGEMENTS = ("a", "b", "tie", "both_bad")

POLITE_WORDS = frozenset([
    "please", "thank", "thanks", "glad", "happy", "hope", "kind", "kindly", "welcome", "sorry", "appreciate",
    "wonderful", "great", "lovely", "gently", "warm", "warmly", "care", "caring", "friend", "friendly", "enjoy",
    "delighted", "pleasure", "helpful", "support", "certainly", "absolutely", "gladly", "hello", "hi", "dear", "best",
    "wishes", "good", "nice", "sure"
])
"""Forty words, many of them everyday ("good", "sure", "best", "care", "support") that are as often plain as warm
("good for the soil", "make sure"): a lexical rule more than a tone."""

COURTESY_WORDS = frozenset([
    "please", "thank", "thanks", "sorry", "glad", "happy", "welcome", "appreciate", "kindly", "hope"
])
"""Ten words of courtesy formulas ("thank you", "happy to help", "I hope this helps"): closer to what a person means
by a polite answer, and to what the model's own features encode (README, "Learning from few votes")."""


def _prefer(score_a: float, score_b: float) -> str:
    if score_a > score_b:
        return "a"
    if score_b > score_a:
        return "b"
    return "tie"


def graded(score: Callable[[str], float], prompt: str, answer_a: str, answer_b: str,
           scale: float) -> tuple[str, int]:
    """(verdict, strength) of a rule that grades by how much better: ("tie", 0) on equal scores, else the preferred
    side with strength 1 (slightly better: the score difference is under `scale`) or 2 (much better: at least
    `scale`). `scale` is in the score's units, for example annotate.annotators.score_scale over the answers at hand
    (about half the decided pairs are then "much"); `prompt` is unused, as the rules' judges ignore it.
    """
    if scale <= 0:
        raise ValueError(f"scale must be positive, got {scale}")
    difference = score(answer_a) - score(answer_b)
    verdict = _prefer(difference, 0.0)
    if verdict == "tie":
        return verdict, 0
    return verdict, 2 if abs(difference) >= scale else 1


def longer(prompt: str, answer_a: str, answer_b: str) -> str:
    """Prefers the answer with more words."""
    return _prefer(len(answer_a.split()), len(answer_b.split()))


def shorter(prompt: str, answer_a: str, answer_b: str) -> str:
    """Prefers the answer with fewer words."""
    return _prefer(-len(answer_a.split()), -len(answer_b.split()))


def contains(word: str) -> Judge:
    """Prefers the answer that contains `word` (case-insensitive); tie when both or neither do."""
    needle = word.lower()

    def judge(prompt: str, answer_a: str, answer_b: str) -> str:
        return _prefer(float(needle in answer_a.lower()), float(needle in answer_b.lower()))

    judge.__name__ = f"contains:{word}"
    return judge


def word_share(text: str, vocabulary: frozenset[str]) -> float:
    """Share of the text's words that are in `vocabulary` (lower case; 0 for a text without words)."""
    words = re.findall(r"[a-z']+", text.lower())
    if not words:
        return 0.0
    return sum(word in vocabulary for word in words) / len(words)


def politeness(text: str) -> float:
    """Share of words in the text that are warm or polite: a taste of many words (not length, not one token)."""
    return word_share(text, POLITE_WORDS)


def polite(prompt: str, answer_a: str, answer_b: str) -> str:
    """Prefers the warmer, more polite answer (share of words from a small word list)."""
    return _prefer(politeness(answer_a), politeness(answer_b))


def courtesy(text: str) -> float:
    """Share of words in the text that are courtesy words (please, thank you, sorry, glad, hope ...)."""
    return word_share(text, COURTESY_WORDS)


def courteous(prompt: str, answer_a: str, answer_b: str) -> str:
    """Prefers the answer with the larger share of courtesy words (please, thank you, sorry, glad, hope ...)."""
    return _prefer(courtesy(answer_a), courtesy(answer_b))


def structured(prompt: str, answer_a: str, answer_b: str) -> str:
    """Prefers the answer laid out in lists, headings and labelled lines (annotate.annotators.structure)."""
    return _prefer(structure(answer_a), structure(answer_b))


def example(prompt: str, answer_a: str, answer_b: str) -> str:
    """Prefers the answer that gives a concrete example, then the more specific one (annotators.concreteness)."""
    return _prefer(concreteness(answer_a), concreteness(answer_b))


def formal(prompt: str, answer_a: str, answer_b: str) -> str:
    """Prefers the more formal register: no contractions, slang or exclamations; longer words and sentences."""
    return _prefer(formality(answer_a), formality(answer_b))


def concise(prompt: str, answer_a: str, answer_b: str) -> str:
    """Prefers more information per word: distinct content words, no repetition, not empty (annotate.annotators)."""
    return _prefer(concision(answer_a), concision(answer_b))


BUILT_IN_RULES: dict[str, Judge] = {"longer": longer, "shorter": shorter, "polite": polite, "courteous": courteous,
                                    "structured": structured, "example": example, "formal": formal, "concise": concise}

RULE_SCORES: dict[str, Callable[[str], float]] = {
    "longer": lambda text: float(len(text.split())),
    "shorter": lambda text: -float(len(text.split())),
    "polite": politeness,
    "courteous": courtesy,
    "structured": structure,
    "example": concreteness,
    "formal": formality,
    "concise": concision,
}
"""The quantity each built-in rule compares, per answer: its mean over a policy's answers moves by degrees where
the pairwise verdict between two policies is mostly a tie."""

TUNING_RULES = ("courteous", "polite", "structured")
"""Annotators to develop against: choose features, strategies and settings on these."""
HELD_OUT_RULES = ("example", "formal", "concise")
"""Annotators kept out of development, to report what was not tuned for: never choose a setting by them."""


class AnnotatorSpecError(ValueError):
    """An annotator specification that names no rule and no importable callable."""


def resolve_judge(spec: str) -> Judge:
    """A BUILT_IN_RULES name, `contains:WORD` or `package.module:function`."""
    if spec in BUILT_IN_RULES:
        return BUILT_IN_RULES[spec]
    if spec.startswith("contains:"):
        word = spec.split(":", 1)[1]
        if not word:
            raise AnnotatorSpecError("contains:WORD needs a word, for example contains:please")
        return contains(word)
    if ":" in spec:
        module_name, function_name = spec.split(":", 1)
        try:
            function = getattr(importlib.import_module(module_name), function_name)
        except (ImportError, AttributeError) as error:
            raise AnnotatorSpecError(f"cannot import annotator {spec!r}: {error}") from error
        if not callable(function):
            raise AnnotatorSpecError(f"annotator {spec!r} is not callable")
        return function
    names = ", ".join([*BUILT_IN_RULES, "contains:WORD", "module:function"])
    raise AnnotatorSpecError(f"unknown annotator {spec!r}; use one of: {names}")


def resolve_score(spec: str) -> Callable[[str], float] | None:
    """The per-answer score behind a built-in rule (`contains:WORD`: 1 when the answer contains the word); for a
    `module:function` annotator, the module's `score(text) -> float` when it defines one (examples/custom_annotator.py);
    else None (a verdict only, or a module that does not import: resolve_judge reports that)."""
    if spec in RULE_SCORES:
        return RULE_SCORES[spec]
    if spec.startswith("contains:") and spec.split(":", 1)[1]:
        needle = spec.split(":", 1)[1].lower()
        return lambda text: float(needle in text.lower())
    if ":" in spec and not spec.startswith("contains:"):
        try:
            module = importlib.import_module(spec.split(":", 1)[0])
        except ImportError:
            return None
        score = getattr(module, "score", None)
        return score if callable(score) else None
    return None


def noisy(judge: Judge, flip_rate: float, rng: random.Random) -> Judge:
    """The same judge with a share `flip_rate` of its a/b votes flipped (ties and both_bad kept)."""
    if not 0.0 <= flip_rate <= 1.0:
        raise AnnotatorSpecError(f"noise must be between 0 and 1, got {flip_rate}")

    def flipped(prompt: str, answer_a: str, answer_b: str) -> str:
        choice = judge(prompt, answer_a, answer_b)
        if choice in ("a", "b") and rng.random() < flip_rate:
            return "b" if choice == "a" else "a"
        return choice

    return flipped


@dataclass
class SimulationResult:
    """What a simulated annotator did."""

    annotator: str
    votes: int = 0
    choices: Counter = field(default_factory=Counter)
    queue_empty: bool = False
    much_better: int = 0
    """a/b votes graded "much better" (strength 2); the other graded a/b votes are "slightly better"."""

    def add(self, choice: str, strength: int | None) -> None:
        """Count one recorded vote."""
        self.votes += 1
        self.choices[choice] += 1
        self.much_better += strength == 2


SCALE_ANSWERS = 400
"""simulate_votes' default grading scale: score_scale over this many of the store's latest answers."""
CAREFUL_MEDIAN_SECONDS = 12.0
CAREFUL_SECONDS_SPREAD = 0.6
"""A careful reader's seconds on a pair are lognormal: median 12 s, log-spread 0.6 (nine in ten between about 4.5
and 32 s: two answers of a few sentences, read and compared), kept within 2 to 120 s."""


def careful_seconds(rng: random.Random) -> float:
    """Plausible seconds a careful person looks at a pair before voting (CAREFUL_MEDIAN_SECONDS)."""
    seconds = rng.lognormvariate(math.log(CAREFUL_MEDIAN_SECONDS), CAREFUL_SECONDS_SPREAD)
    return round(min(120.0, max(2.0, seconds)), 2)


def cast_vote(store, showing, judge: Judge, annotator: str, seconds: float | None = None,
              score: Callable[[str], float] | None = None, scale: float | None = None) -> tuple[str, int | None]:
    """Judge one showing and record the vote; (choice about gen_a/gen_b, strength).

    The judge sees the answers on the sides the store chose for this showing (`Showing.a_on_left`), as a person would;
    its verdict ("a": the left answer) is translated back to the pair's gen_a/gen_b. With `score` and a positive
    `scale`, an a/b vote is graded as `graded` does, at least slightly better (a score tie under the judge's a/b
    verdict, as after a flip, reads as slightly).
    """
    left, right = showing.left, showing.right
    verdict = judge(showing.prompt, left, right)
    if verdict not in VALID_JUDGEMENTS:
        raise AnnotatorSpecError(f"annotator returned {verdict!r}; expected one of {', '.join(VALID_JUDGEMENTS)}")
    choice = verdict
    if verdict in ("a", "b") and not showing.a_on_left:  # the judge's "a" was the pair's gen_b
        choice = "b" if verdict == "a" else "a"
    strength = None
    if score is not None and scale is not None and scale > 0 and choice in ("a", "b"):
        strength = max(1, graded(score, showing.prompt, left, right, scale)[1])
    store.record_vote(showing.pair_id, annotator, choice, a_on_left=showing.a_on_left, seconds=seconds,
                      strength=strength)
    return choice, strength


def simulate_votes(store, judge: Judge, annotator: str, n_votes: int, overlap: int = 1,
                   seed: int = 0, score: Callable[[str], float] | None = None,
                   scale: float | None = None) -> SimulationResult:
    """Vote on up to `n_votes` waiting pairs as `annotator`, through store.next_pair and store.record_vote.

    Each vote is cast by `cast_vote`: the judge sees the sides the store chose for this showing. With `score` (the
    annotator's own, resolve_score), a/b votes are graded: much better (strength 2) where the two answers' scores
    differ by at least `scale` (default: score_scale over the store's SCALE_ANSWERS latest answers), else slightly
    (1). The side is the judge's, so a vote that noise flipped keeps its strength. Each vote records a careful
    reader's seconds (careful_seconds), drawn from their own seeded stream so the sides shown do not change with them.
    """
    rng, seconds_rng = random.Random(seed), random.Random(f"{seed}:seconds")
    result = SimulationResult(annotator=annotator)
    if score is not None and scale is None:
        scale = score_scale(score, store.latest_answer_texts(SCALE_ANSWERS))
    store.add_annotator(annotator)
    for _ in range(n_votes):
        showing = store.next_pair(annotator, overlap=overlap, rng=rng)
        if showing is None:
            result.queue_empty = True
            break
        result.add(*cast_vote(store, showing, judge, annotator, careful_seconds(seconds_rng), score, scale))
    return result
