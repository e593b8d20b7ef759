"""Making the pairs people vote on from a policy's answers.

One path makes the pairs people vote on, for the round, the app's pair-making process and `--generate-pairs`:
`queue_pairs`. Once a round has trained a reward model with bootstrap heads (every strategy saves them) and
`votes.oversample` is above 2, sample pairs come from over-sampled answers: the candidate pairs the heads disagree on
most, plus a random share that keeps the held-out estimate honest (rlhf.reward.active). Versus pairs are made as
always. Before the first round, or with `votes.oversample = 2`, `make_pairs` writes two answers a prompt.
Pairs are written batch by batch, so annotation can start while later batches are still being generated.
Everything goes through the Store; this module writes no SQL.
"""

from __future__ import annotations

import math
import random
import sys
from dataclasses import replace
from typing import Callable

from tqdm.auto import tqdm

from loop.pair_report import (PairChooser, PairsProgress, PairsReport, add_report, earlier_policy,
                            merge_generation_stats, select_prompts, usable)
from annotate.records import NewGeneration, NewPair, Prompt
from loop.policies import load_policy_model, model_and_tokenizer
from rlhf.generate import Answer, AnswerSampling, generate_answers
from rlhf.reward.strategies import VotesConfig

FIRST_CHUNK_PROMPTS = 2
"""Prompts in the first chunk of a batch of pairs (see `chunk_sizes`): on a 2-core CPU the first start's first pair
took 5 minutes when it waited for a whole batch of 16 answers of up to 512 tokens (issue 17)."""

OPPONENT_SEED_OFFSET = 1_000_003
"""Added to the seed for the earlier policy's answers: the same draws for both would make similar policies write
the same text, and identical pairs are dropped."""


def make_pairs(
    store,
    model_path_or_model,
    tokenizer,
    n_pairs: int,
    policy_id: int,
    versus_share: float = 0.0,
    versus_policy_id: int | None = None,
    versus_model=None,
    prompt_selection: str = "least_used",
    sampling: AnswerSampling | None = None,
    seed: int | None = None,
    progress: PairsProgress | None = None,
    show_bar: bool = False,
    answers: PairsProgress | None = None,
    first_chunk: int = FIRST_CHUNK_PROMPTS,
    steps: PairsProgress | None = None,
    exclude_prompts: frozenset[str] = frozenset(),
) -> PairsReport:
    """Generate and store up to `n_pairs` pairs from policy `policy_id`, a share of them `versus` pairs.

    `model_path_or_model`: the current policy's model, or a path to load it from once (tokenizer None: loaded
    from that path). Versus pairs pit it against `versus_policy_id` (default: see `earlier_policy`), loaded
    from its recorded path unless `versus_model` is given; without an earlier policy every pair is a sample pair.
    Pairs whose answers are identical or empty are skipped, so fewer than `n_pairs` may be written; fewer are
    also written when the store holds fewer prompts than asked for (one pair per prompt per call).
    `seed` fixes the choice of prompts and versus pairs, the order of sample answers and, unless
    `sampling.seed` is set, the sampling too. No pair is made for a prompt whose text is in `exclude_prompts` (prompts
    kept for evaluation). Both policies must share one tokenizer (they descend from one base).

    Prompts are answered in chunks of `first_chunk` prompts, then twice as many each chunk up to a full generation
    batch (`chunk_sizes`), and each pair is stored the moment its second answer ends: the first pairs can be voted on
    after about two answers' time rather than a whole batch's. `progress(prompts_done, prompts)` is called as each
    prompt's pair is stored or skipped, `answers(answers_done, answers_planned)` as each answer ends, and
    `steps(step, max_new_tokens)` after each decoding step (rlhf.generate.generate_answers).
    """
    if n_pairs < 0:
        raise ValueError(f"n_pairs must not be negative, got {n_pairs}")
    if not 0.0 <= versus_share <= 1.0:
        raise ValueError(f"versus_share must lie between 0 and 1, got {versus_share}")
    rng = random.Random(seed)
    sampling = _seeded(sampling, seed)
    policy = store.policy(policy_id)
    report = PairsReport(policy_id=policy.id)

    prompts = select_prompts(store, n_pairs, prompt_selection, rng, exclude_prompts)
    n_versus = round(len(prompts) * versus_share)
    opponent = None
    if n_versus:
        opponent = store.policy(versus_policy_id) if versus_policy_id is not None else earlier_policy(store, policy)
        if opponent is None:
            print(f"No policy earlier than policy {policy.id} (round {policy.round}): making sample pairs only.",
                  file=sys.stderr)
            n_versus = 0
    if not prompts:
        return report

    model, tokenizer = model_and_tokenizer(model_path_or_model, tokenizer)
    if n_versus and versus_model is None:
        versus_model, _ = load_policy_model(opponent.path)
    report.versus_policy_id = opponent.id if n_versus else None

    versus_ids = set(rng.sample([p.id for p in prompts], n_versus))
    counter = _AnswerCounter(answers, 2 * len(prompts))  # a pair takes two answers of either kind
    bar = tqdm(total=len(prompts), desc="making pairs", unit="prompt", disable=not show_bar)
    prompts_done = 0

    def prompt_done() -> None:
        nonlocal prompts_done
        prompts_done += 1
        bar.update(1)
        bar.set_postfix(written=report.written)
        if progress is not None:
            progress(prompts_done, len(prompts))

    start = 0
    largest = max(1, sampling.batch_size // 2)  # a sample pair takes two sequences of a batch
    for chunk_index, size in enumerate(chunk_sizes(len(prompts), largest, first_chunk)):
        chunk, start = prompts[start:start + size], start + size
        sink = _PairSink(store, report, prompt_done)
        sample_prompts = [p for p in chunk if p.id not in versus_ids]
        first_is_a = [rng.random() < 0.5 for _ in sample_prompts]  # in prompt order, whatever order answers end in
        _sample_pairs(model, tokenizer, sample_prompts, first_is_a, policy.id, _chunk_sampling(sampling, chunk_index),
                      sink, counter, report, steps)
        versus_prompts = [p for p in chunk if p.id in versus_ids]
        if versus_prompts:
            _versus_pairs(model, versus_model, tokenizer, versus_prompts, policy.id, opponent.id,
                          _chunk_sampling(sampling, chunk_index),
                          _chunk_sampling(sampling, chunk_index, OPPONENT_SEED_OFFSET), sink, counter, report, steps)
    bar.close()
    return report


def make_active_pairs(store, model_path_or_model, tokenizer, n_pairs: int, policy_id: int, chooser: PairChooser,
                      per_prompt: int = 4, prompts_per_pair: float = 1.5, sampling: AnswerSampling | None = None,
                      seed: int | None = None, progress: PairsProgress | None = None,
                      show_bar: bool = False, answers: PairsProgress | None = None,
                      steps: PairsProgress | None = None, exclude_prompts: frozenset[str] = frozenset()) -> PairsReport:
    """Over-sample `per_prompt` answers for ceil(n_pairs * prompts_per_pair) least-used prompts; store as `sample`
    pairs the ones `chooser` picks (the reward model's most uncertain, plus a random share).

    Only the chosen pairs' answers are stored. report.stats["active/uncertain"] counts the pairs chosen for
    uncertainty (before any were dropped as identical or empty). `seed` fixes the prompts, the choice, the sides and,
    unless `sampling.seed` is set, the sampling too, as in `make_pairs`.
    """
    rng = random.Random(seed)
    sampling = _seeded(sampling, seed)
    policy = store.policy(policy_id)
    report = PairsReport(policy_id=policy.id)
    n_prompts = math.ceil(n_pairs * prompts_per_pair)
    prompts = select_prompts(store, n_prompts, "least_used", rng, exclude_prompts) if n_pairs > 0 else []
    if not prompts:
        return report
    model, tokenizer = model_and_tokenizer(model_path_or_model, tokenizer)
    def answered(done: int, total: int) -> None:
        if progress is not None:
            progress(done // per_prompt, len(prompts))
        if answers is not None:
            answers(done, total)

    result = generate_answers(model, tokenizer, [p.text for p in prompts], n_per_prompt=per_prompt,
                              sampling=sampling, progress=answered, show_bar=show_bar, steps=steps)
    merge_generation_stats(report.stats, result.stats)
    texts = [[answer.text for answer in answers] for answers in result.answers]
    picked, n_uncertain = chooser([p.text for p in prompts], texts, n_pairs, rng.randrange(2**31))
    new_pairs = []
    for rank, (prompt_index, i, j) in enumerate(picked):
        first, second = result.answers[prompt_index][i], result.answers[prompt_index][j]
        if not usable(first, second, report):
            continue
        a, b = (first, second) if rng.random() < 0.5 else (second, first)
        new_pairs.append(NewPair(prompts[prompt_index].id, _stored(a, policy.id), _stored(b, policy.id), kind="sample",
                                 chosen_by="uncertain" if rank < n_uncertain else "random"))
    store.add_pairs_bulk(new_pairs)
    report.written = report.sample = len(new_pairs)
    report.stats["active/uncertain"] = float(n_uncertain)
    return report


def _seeded(sampling: AnswerSampling | None, seed: int | None) -> AnswerSampling:
    """The settings, with `seed` as the sampling seed when they have none: one seed fixes prompts, sides and draws."""
    sampling = sampling or AnswerSampling()
    return replace(sampling, seed=seed) if sampling.seed is None and seed is not None else sampling


def chunk_sizes(n_prompts: int, largest: int, first: int = FIRST_CHUNK_PROMPTS) -> list[int]:
    """How many prompts each chunk of a batch answers: `first`, then twice as many each time, then full chunks of
    `largest`; what does not fill a full chunk joins the last growing one (never the first), so that no small chunk
    trails at the end (a chunk lasts as long as its longest answer, whatever its size). E.g. 2, 6, 8, 8, 8 for 32
    prompts in batches of 16 sequences. The sizes add up to n_prompts."""
    size = max(1, min(first, largest))
    growing: list[int] = []
    while size < largest and sum(growing) + size < n_prompts:
        growing.append(size)
        size *= 2
    full, left = divmod(n_prompts - sum(growing), largest)
    if left and len(growing) > 1 and growing[-1] + left <= largest:
        growing[-1], left = growing[-1] + left, 0
    return growing + [largest] * full + ([left] if left else [])


def _chunk_sampling(sampling: AnswerSampling, chunk_index: int, offset: int = 0) -> AnswerSampling:
    """The same settings with a seed of its own per chunk (a fixed seed would repeat draws across chunks)."""
    return replace(sampling, seed=None if sampling.seed is None else sampling.seed + chunk_index + offset)


class _AnswerCounter:
    """Counts finished answers for an `answers(done, planned)` callback."""

    def __init__(self, callback: PairsProgress | None, planned: int):
        self.callback, self.planned, self.done = callback, planned, 0

    def __call__(self) -> None:
        self.done += 1
        if self.callback is not None:
            self.callback(self.done, self.planned)


class _PairSink:
    """Collects answers as they end and stores each pair as soon as its two sides exist (one write per pair)."""

    def __init__(self, store, report: PairsReport, on_prompt_done: Callable[[], None]):
        self.store, self.report, self.on_prompt_done = store, report, on_prompt_done
        self.sides: dict[int, dict[str, NewGeneration]] = {}
        self.answers: dict[int, dict[str, Answer]] = {}

    def add(self, prompt_id: int, side: str, answer: Answer, policy_id: int, kind: str) -> None:
        """Side "a" or "b" of the pair for `prompt_id`; the pair is written (or skipped, see `usable`) with the second."""
        answers = self.answers.setdefault(prompt_id, {})
        answers[side] = answer
        self.sides.setdefault(prompt_id, {})[side] = _stored(answer, policy_id)
        if len(answers) < 2:
            return
        if usable(answers["a"], answers["b"], self.report):
            pair = NewPair(prompt_id, self.sides[prompt_id]["a"], self.sides[prompt_id]["b"], kind=kind,
                           chosen_by="random" if kind == "sample" else None)
            self.store.add_pairs_bulk([pair])
            self.report.written += 1
            self.report.sample += kind == "sample"
            self.report.versus += kind == "versus"
        self.on_prompt_done()


def _sample_pairs(model, tokenizer, prompts: list[Prompt], first_is_a: list[bool], policy_id: int,
                  sampling: AnswerSampling, sink: _PairSink, counter: _AnswerCounter, report: PairsReport,
                  steps: PairsProgress | None = None) -> None:
    """Two answers of the policy per prompt, the first on side a of prompt i's pair when first_is_a[i]."""
    if not prompts:
        return

    def on_answer(i: int, j: int, answer: Answer) -> None:
        counter()
        sink.add(prompts[i].id, "a" if (j == 0) == first_is_a[i] else "b", answer, policy_id, "sample")

    result = generate_answers(model, tokenizer, [p.text for p in prompts], n_per_prompt=2, sampling=sampling,
                              on_answer=on_answer, steps=steps)
    merge_generation_stats(report.stats, result.stats)


def _versus_pairs(model, versus_model, tokenizer, prompts: list[Prompt], policy_id: int, opponent_id: int,
                  sampling: AnswerSampling, opponent_sampling: AnswerSampling, sink: _PairSink,
                  counter: _AnswerCounter, report: PairsReport, steps: PairsProgress | None = None) -> None:
    """The newer policy's answer (side a) and the earlier one's (side b) per prompt."""
    texts = [p.text for p in prompts]
    for side, policy_model, policy, settings in (("a", model, policy_id, sampling),
                                                 ("b", versus_model, opponent_id, opponent_sampling)):
        def on_answer(i: int, j: int, answer: Answer, side=side, policy=policy) -> None:
            counter()
            sink.add(prompts[i].id, side, answer, policy, "versus")

        result = generate_answers(policy_model, tokenizer, texts, n_per_prompt=1, sampling=settings,
                                  on_answer=on_answer, steps=steps)
        merge_generation_stats(report.stats, result.stats)


def _stored(answer: Answer, policy_id: int) -> NewGeneration:
    return NewGeneration(policy_id=policy_id, text=answer.text, n_tokens=answer.n_tokens,
                        finish_reason=answer.finish_reason)


def queue_pairs(store, model, tokenizer, n_pairs: int, policy_id: int, votes: VotesConfig, judge=None,
                versus_share: float = 0.0, versus_policy_id: int | None = None, versus_model=None,
                sampling: AnswerSampling | None = None, seed: int | None = None,
                progress: PairsProgress | None = None, show_bar: bool = False,
                answers: PairsProgress | None = None, steps: PairsProgress | None = None,
                exclude_prompts: frozenset[str] = frozenset()) -> PairsReport:
    """Store up to `n_pairs` pairs from policy `policy_id` (a share `versus_share` against an earlier policy) and
    report them; the sample pairs are chosen by `judge` (a TrainedPreferenceModel) when there is one and
    votes.oversample > 2, else drawn at random. report.stats["active/uncertain"] counts the pairs chosen for the
    judge's disagreement. `model` is the policy's model, or a path to load it from once (tokenizer None).
    progress(pairs_done, n_pairs), answers(answers_done, answers_planned) and steps(step, max_new_tokens) as in
    `make_pairs`; no pair for a prompt in `exclude_prompts`."""
    model, tokenizer = model_and_tokenizer(model, tokenizer)
    if judge is None or votes.oversample <= 2:
        return make_pairs(store, model, tokenizer, n_pairs, policy_id, versus_share=versus_share,
                          versus_policy_id=versus_policy_id, versus_model=versus_model, sampling=sampling, seed=seed,
                          progress=progress, show_bar=show_bar, answers=answers, steps=steps,
                          exclude_prompts=exclude_prompts)
    from rlhf.reward.active import choose_pairs

    n_versus = round(n_pairs * versus_share)
    report = PairsReport(policy_id=policy_id)
    planned = 2 * n_versus + votes.oversample * math.ceil((n_pairs - n_versus) * votes.prompts_per_pair)

    def answers_from(offset: int) -> PairsProgress | None:
        return None if answers is None else (lambda done, total: answers(offset + done, planned))

    if n_versus:
        def versus_progress(done: int, total: int) -> None:
            progress(round(done / max(total, 1) * n_versus), n_pairs)

        versus = make_pairs(store, model, tokenizer, n_versus, policy_id, versus_share=1.0,
                            versus_policy_id=versus_policy_id, versus_model=versus_model, sampling=sampling, seed=seed,
                            progress=versus_progress if progress else None, show_bar=show_bar,
                            answers=answers_from(0), steps=steps, exclude_prompts=exclude_prompts)
        add_report(report, versus)
        report.versus_policy_id = versus.versus_policy_id

    def chooser(prompts, answers, n, choice_seed):
        candidates, selection = choose_pairs(judge, prompts, answers, n, votes.random_share, choice_seed)
        return [(candidates[i].prompt_index, candidates[i].a, candidates[i].b) for i in selection.all], \
            len(selection.uncertain)

    def active_progress(done: int, total: int) -> None:
        progress(n_versus + round(done / max(total, 1) * (n_pairs - n_versus)), n_pairs)

    active = make_active_pairs(store, model, tokenizer, n_pairs - n_versus, policy_id, chooser,
                               per_prompt=votes.oversample, prompts_per_pair=votes.prompts_per_pair, sampling=sampling,
                               seed=seed, progress=active_progress if progress else None, show_bar=show_bar,
                               answers=answers_from(2 * n_versus), steps=steps, exclude_prompts=exclude_prompts)
    add_report(report, active)
    report.stats["active/uncertain"] = active.stats.get("active/uncertain", 0.0)
    report.stats["active/candidate_answers"] = active.stats.get("gen/answers", 0.0)
    return report


