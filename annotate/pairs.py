"""Making pairs for annotation: pick prompts, let the policies answer, store generations and pairs.

Two kinds of pair (DESIGN "Data model"): `sample`, two answers of the current policy to one prompt (what the reward
model learns from), and `versus`, the current policy against an earlier one on the same prompt (gen_a is always the
newer policy's answer, the store's convention), whose votes measure progress by human judgement.
Pairs are written batch by batch, so annotation can start while later batches are still being generated.
Everything goes through the Store; this module writes no SQL.
"""

from __future__ import annotations

import math
import random
import sys
from dataclasses import dataclass, field, replace
from typing import Callable

from tqdm.auto import tqdm

from annotate.records import Answer as StoredAnswer
from annotate.records import NewPair, Policy, Prompt
from rlhf.generate import Answer, AnswerSampling, generate_answers

PairsProgress = Callable[[int, int], None]
"""Called as progress(prompts_done, prompts_total) after each batch; each prompt gives at most one pair."""

PairChooser = Callable[[list[str], list[list[str]], int, int], tuple[list[tuple[int, int, int]], int]]
"""chooser(prompts, answers_per_prompt, n, seed) -> ([(prompt_index, answer_i, answer_j), ...] in queue order,
how many of them were chosen for uncertainty rather than at random); see rlhf.active.choose_pairs."""

OPPONENT_SEED_OFFSET = 1_000_003
"""Added to the seed for the earlier policy's answers: the same draws for both would make similar policies write
the same text, and identical pairs are dropped."""

PROMPT_SELECTIONS = ("least_used", "random")


@dataclass
class PairsReport:
    """What make_pairs wrote and skipped."""

    written: int = 0
    """Pairs stored."""
    sample: int = 0
    """Of which `sample` pairs (two answers of the current policy)."""
    versus: int = 0
    """Of which `versus` pairs (current policy against an earlier one)."""
    skipped_identical: int = 0
    """Pairs dropped because both answers were the same text (a vote on them teaches nothing)."""
    skipped_empty: int = 0
    """Pairs dropped because an answer was empty."""
    policy_id: int | None = None
    """The current policy that wrote the answers."""
    versus_policy_id: int | None = None
    """The earlier policy of the versus pairs (None when there were none)."""
    stats: dict[str, float] = field(default_factory=dict)
    """Generation figures: gen/tokens_per_s, time/generate_s, gen/answers, gen/finished_share, gen/mean_tokens."""


def ensure_base_policy(store, model_name: str) -> Policy:
    """The current policy, recording `model_name` as the round-0 (base) policy when the store has none yet.

    The name is stored as given ("default", a hub id or a folder): rlhf.models resolves it when loading.
    """
    latest = store.latest_policy()
    if latest is not None:
        return latest
    return store.policy(store.add_policy(round=0, path=str(model_name), parent_id=None))


def earlier_policy(store, policy: Policy) -> Policy | None:
    """The policy a `versus` pair compares `policy` with: its parent, else the latest policy of an earlier round."""
    if policy.parent_id is not None:
        return store.policy(policy.parent_id)
    earlier = [p for p in store.policies() if p.round < policy.round]
    return max(earlier, key=lambda p: (p.round, p.id)) if earlier else None


def load_policy_model(path: str):
    """Model and tokenizer of a policy, on the GPU when there is one, in bf16 where the hardware has it."""
    import torch

    from rlhf.models import default_dtype, load_causal_lm, load_tokenizer

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = load_causal_lm(path, dtype=default_dtype(device)).to(device)
    return model, load_tokenizer(path)


def _model_and_tokenizer(model_path_or_model, tokenizer):
    """A loaded model as given, or the policy at a path loaded once (its tokenizer unless one is given)."""
    if isinstance(model_path_or_model, str) or hasattr(model_path_or_model, "__fspath__"):
        model, loaded_tokenizer = load_policy_model(str(model_path_or_model))
        return model, tokenizer or loaded_tokenizer
    return model_path_or_model, tokenizer


def select_prompts(store, n: int, how: str, rng: random.Random) -> list[Prompt]:
    """n prompts: those with the fewest pairs first (oldest among equals), or a seeded random draw."""
    if how == "least_used":
        return store.prompts_needing_pairs(n)
    if how == "random":
        prompts = store.prompts()
        return rng.sample(prompts, min(n, len(prompts)))
    raise ValueError(f"prompt_selection must be one of {', '.join(PROMPT_SELECTIONS)}, not {how!r}")


def usable(a: Answer, b: Answer, report: PairsReport) -> bool:
    """Whether two answers make a pair worth a vote; counts the reason when they do not."""
    if not a.text or not b.text:
        report.skipped_empty += 1
        return False
    if a.text == b.text:
        report.skipped_identical += 1
        return False
    return True


def _stored(answer: Answer, policy_id: int) -> StoredAnswer:
    return StoredAnswer(policy_id=policy_id, text=answer.text, n_tokens=answer.n_tokens,
                        finish_reason=answer.finish_reason)


def _merge_stats(total: dict[str, float], part: dict[str, float]) -> None:
    answers = total.get("gen/answers", 0.0) + part["gen/answers"]
    for key in ("gen/finished_share", "gen/mean_tokens"):  # answer-weighted means
        total[key] = (total.get(key, 0.0) * total.get("gen/answers", 0.0) + part[key] * part["gen/answers"]) / answers
    tokens = total.get("gen/tokens_per_s", 0.0) * total.get("time/generate_s", 0.0)
    tokens += part["gen/tokens_per_s"] * part["time/generate_s"]
    total["time/generate_s"] = total.get("time/generate_s", 0.0) + part["time/generate_s"]
    total["gen/tokens_per_s"] = tokens / total["time/generate_s"] if total["time/generate_s"] > 0 else 0.0
    total["gen/answers"] = answers


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
) -> PairsReport:
    """Generate and store up to `n_pairs` pairs from policy `policy_id`, a share of them `versus` pairs.

    `model_path_or_model`: the current policy's model, or a path to load it from once (tokenizer None: loaded
    from that path). Versus pairs pit it against `versus_policy_id` (default: see `earlier_policy`), loaded
    from its recorded path unless `versus_model` is given; without an earlier policy every pair is a sample pair.
    Pairs whose answers are identical or empty are skipped, so fewer than `n_pairs` may be written; fewer are
    also written when the store holds fewer prompts than asked for (one pair per prompt per call).
    `seed` fixes the choice of prompts and versus pairs, the order of sample answers and, unless
    `sampling.seed` is set, the sampling too. Both policies must share one tokenizer (they descend from one base).
    """
    if n_pairs < 0:
        raise ValueError(f"n_pairs must not be negative, got {n_pairs}")
    if not 0.0 <= versus_share <= 1.0:
        raise ValueError(f"versus_share must lie between 0 and 1, got {versus_share}")
    rng = random.Random(seed)
    sampling = _seeded(sampling, seed)
    policy = store.policy(policy_id)
    report = PairsReport(policy_id=policy.id)

    prompts = select_prompts(store, n_pairs, prompt_selection, rng)
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

    model, tokenizer = _model_and_tokenizer(model_path_or_model, tokenizer)
    if n_versus and versus_model is None:
        versus_model, _ = load_policy_model(opponent.path)
    report.versus_policy_id = opponent.id if n_versus else None

    versus_ids = set(rng.sample([p.id for p in prompts], n_versus))
    chunk_size = max(1, sampling.batch_size // 2)  # a sample pair takes two sequences of a batch
    bar = tqdm(total=len(prompts), desc="making pairs", unit="prompt", disable=not show_bar)
    for chunk_index, start in enumerate(range(0, len(prompts), chunk_size)):
        chunk = prompts[start:start + chunk_size]
        chunk_sampling = _chunk_sampling(sampling, chunk_index)
        opponent_sampling = _chunk_sampling(sampling, chunk_index, OPPONENT_SEED_OFFSET)
        new_pairs = _sample_pairs(model, tokenizer, [p for p in chunk if p.id not in versus_ids], policy.id,
                                  chunk_sampling, report, rng)
        versus_prompts = [p for p in chunk if p.id in versus_ids]
        if versus_prompts:
            new_pairs += _versus_pairs(model, versus_model, tokenizer, versus_prompts, policy.id, opponent.id,
                                       chunk_sampling, opponent_sampling, report)
        store.add_pairs_bulk(new_pairs)
        report.written += len(new_pairs)
        report.sample += sum(pair.kind == "sample" for pair in new_pairs)
        report.versus += sum(pair.kind == "versus" for pair in new_pairs)
        bar.update(len(chunk))
        bar.set_postfix(written=report.written)
        if progress is not None:
            progress(start + len(chunk), len(prompts))
    bar.close()
    return report


def make_active_pairs(store, model_path_or_model, tokenizer, n_pairs: int, policy_id: int, chooser: PairChooser,
                      per_prompt: int = 4, prompts_per_pair: float = 1.5, sampling: AnswerSampling | None = None,
                      seed: int | None = None, progress: PairsProgress | None = None,
                      show_bar: bool = False) -> PairsReport:
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
    prompts = select_prompts(store, math.ceil(n_pairs * prompts_per_pair), "least_used", rng) if n_pairs > 0 else []
    if not prompts:
        return report
    model, tokenizer = _model_and_tokenizer(model_path_or_model, tokenizer)
    answered = None if progress is None else (lambda done, total: progress(done // per_prompt, len(prompts)))
    result = generate_answers(model, tokenizer, [p.text for p in prompts], n_per_prompt=per_prompt,
                              sampling=sampling, progress=answered, show_bar=show_bar)
    _merge_stats(report.stats, result.stats)
    texts = [[answer.text for answer in answers] for answers in result.answers]
    picked, n_uncertain = chooser([p.text for p in prompts], texts, n_pairs, rng.randrange(2**31))
    new_pairs = []
    for prompt_index, i, j in picked:
        first, second = result.answers[prompt_index][i], result.answers[prompt_index][j]
        if not usable(first, second, report):
            continue
        a, b = (first, second) if rng.random() < 0.5 else (second, first)
        new_pairs.append(NewPair(prompts[prompt_index].id, _stored(a, policy.id), _stored(b, policy.id), kind="sample"))
    store.add_pairs_bulk(new_pairs)
    report.written = report.sample = len(new_pairs)
    report.stats["active/uncertain"] = float(n_uncertain)
    return report


def _seeded(sampling: AnswerSampling | None, seed: int | None) -> AnswerSampling:
    """The settings, with `seed` as the sampling seed when they have none: one seed fixes prompts, sides and draws."""
    sampling = sampling or AnswerSampling()
    return replace(sampling, seed=seed) if sampling.seed is None and seed is not None else sampling


def _chunk_sampling(sampling: AnswerSampling, chunk_index: int, offset: int = 0) -> AnswerSampling:
    """The same settings with a seed of its own per chunk (a fixed seed would repeat draws across chunks)."""
    return replace(sampling, seed=None if sampling.seed is None else sampling.seed + chunk_index + offset)


def _sample_pairs(model, tokenizer, prompts: list[Prompt], policy_id: int, sampling: AnswerSampling,
                  report: PairsReport, rng: random.Random) -> list[NewPair]:
    if not prompts:
        return []
    result = generate_answers(model, tokenizer, [p.text for p in prompts], n_per_prompt=2, sampling=sampling)
    _merge_stats(report.stats, result.stats)
    pairs = []
    for prompt, (first, second) in zip(prompts, result.answers):
        if not usable(first, second, report):
            continue
        a, b = (first, second) if rng.random() < 0.5 else (second, first)
        pairs.append(NewPair(prompt.id, _stored(a, policy_id), _stored(b, policy_id), kind="sample"))
    return pairs


def _versus_pairs(model, versus_model, tokenizer, prompts: list[Prompt], policy_id: int, opponent_id: int,
                  sampling: AnswerSampling, opponent_sampling: AnswerSampling, report: PairsReport) -> list[NewPair]:
    texts = [p.text for p in prompts]
    newer = generate_answers(model, tokenizer, texts, n_per_prompt=1, sampling=sampling)
    older = generate_answers(versus_model, tokenizer, texts, n_per_prompt=1, sampling=opponent_sampling)
    _merge_stats(report.stats, newer.stats)
    _merge_stats(report.stats, older.stats)
    pairs = []
    for prompt, (new,), (old,) in zip(prompts, newer.answers, older.answers):
        if usable(new, old, report):
            pairs.append(NewPair(prompt.id, _stored(new, policy_id), _stored(old, opponent_id), kind="versus"))
    return pairs


def command_generate_pairs(args) -> int:
    """`python app.py --generate-pairs N [--versus-share F]`: N pairs from the current policy (the base model, then
    recorded as round 0, when the store has no policy yet)."""
    from annotate.active_pairs import load_pair_judge, pair_judge_path, queue_pairs
    from annotate.store import Store
    from rlhf.config import ConfigError, load_config
    from rlhf.models import ModelNotFoundError

    def fail(message: str) -> int:
        print(f"app.py --generate-pairs: {message}", file=sys.stderr)
        return 2

    try:
        n_pairs = int(args.generate_pairs)
    except ValueError:
        n_pairs = 0
    if n_pairs < 1:
        return fail(f"N must be a positive whole number (pairs to generate), not {args.generate_pairs!r}.")
    versus_share = getattr(args, "versus_share", 0.0) or 0.0
    if not 0.0 <= versus_share <= 1.0:
        return fail(f"--versus-share must lie between 0 and 1 (the share of versus pairs), not {versus_share}.")
    try:
        votes = load_config(getattr(args, "config", None), getattr(args, "set", None) or []).votes
    except ConfigError as error:
        return fail(str(error))
    sampling = AnswerSampling()
    if getattr(args, "max_new_tokens", None):
        sampling = replace(sampling, max_new_tokens=args.max_new_tokens)
    if getattr(args, "temperature", None) is not None:
        sampling = replace(sampling, temperature=args.temperature)

    with Store(args.db) as store:
        if store.count_prompts() == 0:
            return fail(f"{args.db} holds no prompts yet. Import some first, for example the shipped ones: "
                        "python app.py --import-prompts data/prompts.jsonl")
        policy = ensure_base_policy(store, args.model)
        print(f"Generating {n_pairs} pairs from policy {policy.id} (round {policy.round}, {policy.path}), "
              f"{versus_share:.0%} versus pairs, up to {sampling.max_new_tokens} tokens an answer at temperature "
              f"{sampling.temperature}.", file=sys.stderr)
        judge_path = pair_judge_path(store)
        judge = load_pair_judge(judge_path, votes)
        if judge is not None:
            print(f"Sample pairs: the {votes.oversample} answers a prompt that the reward model at {judge_path} is "
                  f"least sure about ({votes.random_share:.0%} at random).", file=sys.stderr)
        try:
            report = queue_pairs(store, policy.path, None, n_pairs, policy.id, votes, judge=judge,
                                 versus_share=versus_share, sampling=sampling, show_bar=True)
        except ModelNotFoundError as error:
            return fail(str(error))
        stats = report.stats
        print(f"{report.written} pairs written ({report.sample} sample, {report.versus} versus); skipped "
              f"{report.skipped_identical} with identical and {report.skipped_empty} with empty answers. "
              f"{stats.get('gen/finished_share', 0.0):.0%} of answers finished, "
              f"{stats.get('gen/mean_tokens', 0.0):.0f} tokens on average, "
              f"{stats.get('gen/tokens_per_s', 0.0):.1f} tokens/s, {stats.get('time/generate_s', 0.0):.0f} s. "
              f"{store.pairs_waiting()} pairs wait for votes.")
    return 0
