"""Learning curves of reward-model strategies from few votes, and active against random pair choice.

Data: the default model's answers to the shipped prompts (bench/curve_data.py: 4 samples a prompt, cached under
data/cache/), every pair of distinct answers of a prompt a candidate, labelled by a simulated annotator (default
`polite`). Per seeded split: a quarter of the prompts is held out; their pairs, labelled WITHOUT noise, measure
accuracy; training votes come from the other prompts' pairs with a share `--flip` of votes flipped. Ties (the
rule cannot tell the answers apart) are not votes. Features of every answer are computed once under inference
mode and cached, so each strategy's fit takes seconds.

Active column: the budget counts pairs SHOWN (a tie costs a showing and yields no vote, for both arms). Both arms
start from the same random 32; random then shows further random pairs, active queues the pairs its bootstrap
ensemble disagrees on most, plus a random share. Ends with one JSON line.

`lpft:mean@2` is the round's LP-FT (rlhf/reward/lpft.py): the head, then the feature's top decoder layers fine-tuned
under it on the same votes (--finetune-lr, --finetune-epochs, --finetune-layers; the defaults are the round's),
scored by the tuned model.

A strategy's feature may join layers, `head:mean@2+mean@8`: the head is fitted on both layers' features side by side,
a mix of layers learned with the head (its L2 strength cross-validated as ever).

Graded votes (`--graded off,margin:1,weight:2`): the annotator also says how much better (annotate.simulate.graded
on its score, the scale annotators.score_scale over all cached answers); a flipped vote keeps its strength. Each
variant beside "off" adds a row per strategy, named `strategy variant`, fitted with votes.graded and much_margin or
much_weight set to the variant's number.

    python bench/curve_data.py --max-new-tokens 64        # once (minutes on CPU), resumable
    python bench/curve_data.py --max-new-tokens 64 --seed 1   # a second set: 8 answers a prompt with --answer-seeds 0,1
    python bench/reward_curve.py --answer-seeds 0,1 --annotator courteous   # 10 seeds, 32-384 votes, about a minute
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from annotate.annotators import score_scale
from annotate.simulate import graded, resolve_judge, resolve_score
from bench.curve_data import CACHE_DIR, answers_cache_path, read_answers
from bench.machine import describe_machine, machine_line
from rlhf.reward import bt_head
from rlhf.reward.active import candidate_pairs, select_pairs
from rlhf.reward.data import PreferencePair
from rlhf.reward.model import RewardModel
from rlhf.reward.features import FeatureExtractor
from rlhf.reward.strategies import (
    StrategyConfig,
    VotesConfig,
    finetune_under_head,
    fit_feature_heads,
    score_with_reward_model,
)

FEATURES = ("last@-1", "mean@-1", *(f"mean@{layer}" for layer in range(30)))
"""Cached for every answer (one forward pass gives them all). SmolLM2-135M has 30 layers: hidden_states[0] is the
token embeddings (mean: a bag of words), [15] the middle layer, [-1] the final-normed output."""
STRATEGIES = ("head:last@-1", "head:mean@-1", "head:mean@15", "head:mean@0", "head:mean@2", "ensemble:mean@2",
              "head:mean@3", "head:mean@4")


def load_features(rows: list[dict], model: str, tag: str,
                  features=FEATURES) -> tuple[dict[tuple[str, str], int], dict[str, torch.Tensor]]:
    """(index of each (prompt, answer), {feature: (N, D)}), computing only what the cache file lacks: answers not
    in it yet (every feature) and features not in it yet (every answer)."""
    path = CACHE_DIR / f"curve-features-{tag}.pt"
    saved = torch.load(path) if path.is_file() else {"keys": [], "features": {}}
    keys = [tuple(k) for k in saved["keys"]]
    known = set(keys)
    missing = list(dict.fromkeys((r["prompt"], a) for r in rows for a in r["answers"] if (r["prompt"], a) not in known))
    new_features = [f for f in features if f not in saved["features"]] if keys else []
    if missing or new_features:
        started = time.perf_counter()
        extractor = FeatureExtractor.from_model(model, batch_size=16)
        if new_features:
            print(f"{len(new_features)} new features of {len(keys)} answers ...", file=sys.stderr, flush=True)
            saved["features"].update(extractor.compute([p for p, _ in keys], [a for _, a in keys], new_features))
        if missing:
            print(f"features of {len(missing)} answers ...", file=sys.stderr, flush=True)
            names = list(dict.fromkeys([*saved["features"], *features]))
            new = extractor.compute([p for p, _ in missing], [a for _, a in missing], names)
            saved["features"] = {f: torch.cat([saved["features"][f], new[f]]) if keys else new[f] for f in names}
            keys += missing
        saved["keys"] = keys
        torch.save(saved, path)
        print(f"... {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    return {k: i for i, k in enumerate(keys)}, saved["features"]


class CurveData:
    """Candidates, their noiseless labels and the feature rows of both answers."""

    def __init__(self, rows: list[dict], index: dict, features: dict[str, torch.Tensor], judge, score=None,
                 extractor: FeatureExtractor | None = None, finetune: dict | None = None):
        self.features = features
        self.extractor = extractor
        """The model's backbone for strategies that fine-tune it (lpft)."""
        self.finetune = dict(finetune or {})
        """VotesConfig's finetune_* fields where they are not the round's defaults."""
        self.candidates = candidate_pairs([r["answers"] for r in rows])
        self.prompt_of = [c.prompt_index for c in self.candidates]
        texts = [(rows[c.prompt_index]["prompt"], rows[c.prompt_index]["answers"][c.a],
                  rows[c.prompt_index]["answers"][c.b]) for c in self.candidates]
        self.texts = texts  # (prompt, answer a, answer b) of each candidate
        self.truth = [judge(p, a, b) for p, a, b in texts]  # "a", "b" or "tie"
        # strength of each candidate's vote: 1 slightly, 2 much better (graded by the score; 1 without one)
        self.strength = [1.0] * len(texts)
        if score is not None:
            scale = score_scale(score, [a for r in rows for a in r["answers"]])
            if scale > 0:
                self.strength = [float(max(1, graded(score, p, a, b, scale)[1])) for p, a, b in texts]
        self.row_a = torch.tensor([index[(p, a)] for p, a, _ in texts])  # (C,)
        self.row_b = torch.tensor([index[(p, b)] for p, _, b in texts])  # (C,)
        self.n_prompts = len(rows)

    def diffs(self, feature: str, candidates: list[int], a_wins: list[bool]) -> tuple[torch.Tensor, torch.Tensor]:
        """(chosen (N, D), rejected (N, D)) features of the given votes; "mean@2+mean@8" joins two layers' features
        side by side, so the head learns its own mix of the layers."""
        f = torch.cat([self.features[part] for part in feature.split("+")], dim=-1)  # (answers, D)
        idx = torch.tensor(candidates)
        fa, fb = f[self.row_a[idx]], f[self.row_b[idx]]  # (N, D) each
        wins = torch.tensor(a_wins)[:, None]
        return torch.where(wins, fa, fb), torch.where(wins, fb, fa)


def graded_settings(variant: str) -> dict:
    """VotesConfig fields of a --graded variant: "off", "margin:M" or "weight:W"."""
    use, _, value = variant.partition(":")
    if use == "off":
        return {"graded": "off"}
    if use not in ("margin", "weight") or not value:
        raise ValueError(f"--graded variants are off, margin:M or weight:W, not {variant!r}")
    return {"graded": use, f"much_{use}": float(value)}


def fit(data: CurveData, strategy: str, votes: list[int], labels: dict[int, bool], seed: int,
        with_heads: bool = False, on_epoch=None):
    """(weight (D,), heads (H, D)) of `kind:feature[ variant]` on the votes; for lpft the tuned RewardModel in the
    weight's place (`on_epoch(epoch, loss, model)` after each of its passes)."""
    strategy, _, variant = strategy.partition(" ")
    kind, feature = strategy.split(":")
    chosen, rejected = data.diffs(feature, votes, [labels[i] for i in votes])
    n_heads = 8 if kind == "ensemble" or with_heads else 0
    votes_config = VotesConfig(n_heads=n_heads, cv_folds=3, **graded_settings(variant or "off"),
                               **data.finetune)
    strengths = torch.tensor([data.strength[i] for i in votes], dtype=torch.float64)  # (N,)
    weight, heads, _ = fit_feature_heads(chosen, rejected, kind, StrategyConfig(votes=votes_config, seed=seed),
                                         strengths)
    if kind == "lpft":
        pairs = [PreferencePair(p, a, b) if labels[i] else PreferencePair(p, b, a)
                 for i in votes for p, a, b in [data.texts[i]]]
        weight = finetune_under_head(data.extractor, feature, weight, pairs, strengths,
                                     StrategyConfig(votes=votes_config, seed=seed), on_epoch)
    return weight, heads


def accuracy(data: CurveData, strategy: str, weight: torch.Tensor | RewardModel, evaluation: list[int]) -> float:
    if isinstance(weight, RewardModel):  # lpft: the tuned model scores the held-out answers
        # each distinct answer scored once (an answer is in up to 3 of its prompt's pairs)
        answers = list(dict.fromkeys((data.texts[i][0], text) for i in evaluation for text in data.texts[i][1:]))
        scores = score_with_reward_model(weight, data.extractor.tokenizer, [p for p, _ in answers],
                                         [a for _, a in answers])
        score_of = dict(zip(answers, scores.tolist()))
        right = [(score_of[(p, a)] > score_of[(p, b)]) == (data.truth[i] == "a")
                 for i in evaluation for p, a, b in [data.texts[i]]]
        return sum(right) / len(right)
    feature = strategy.split(" ")[0].split(":")[1]
    chosen, rejected = data.diffs(feature, evaluation, [data.truth[i] == "a" for i in evaluation])
    return bt_head.pair_accuracy(weight, chosen, rejected)


def split(data: CurveData, seed: int, flip: float) -> tuple[list[int], list[int], dict[int, bool], list[int]]:
    """(evaluation, pool, labels, order) of a seed: a quarter of the prompts held out, their decided candidates the
    evaluation; the other prompts' candidates the pool, each decided one with its noisy vote, shown in `order`."""
    rng = random.Random(seed)
    prompts = list(range(data.n_prompts))
    rng.shuffle(prompts)
    heldout = set(prompts[:max(1, data.n_prompts // 4)])
    evaluation = [i for i, p in enumerate(data.prompt_of) if p in heldout and data.truth[i] != "tie"]
    pool = [i for i, p in enumerate(data.prompt_of) if p not in heldout]
    # one noisy label per candidate and seed: a pair shown in both arms gets the same vote
    labels = {i: (data.truth[i] == "a") ^ (rng.random() < flip) for i in pool if data.truth[i] != "tie"}
    order = pool[:]
    rng.shuffle(order)
    return evaluation, pool, labels, order


def run_seed(data: CurveData, seed: int, sizes: list[int], strategies: list[str], flip: float,
             active_strategy: str, active_share: float, active: bool = True) -> dict:
    evaluation, pool, labels, order = split(data, seed, flip)
    votes_order = [i for i in order if i in labels]
    result = {"n_eval": len(evaluation), "n_pool_votes": len(votes_order), "curve": {}, "active": {}, "random": {}}
    for n in sizes:
        if n > len(votes_order):
            continue
        for strategy in strategies:
            weight, _ = fit(data, strategy, votes_order[:n], labels, seed)
            result["curve"].setdefault(strategy, {})[n] = accuracy(data, strategy, weight, evaluation)
    # active against random, budget = pairs shown (ties included)
    shown_random = order
    shown_active = order[:sizes[0]]
    for n in sizes if active else []:
        if n > len(order):
            continue
        if n > len(shown_active):
            votes = [i for i in shown_active if i in labels]
            _, heads = fit(data, active_strategy, votes, labels, seed, with_heads=True)
            remaining = [i for i in pool if i not in set(shown_active)]
            feature = active_strategy.split(":")[1]
            f = data.features[feature]
            idx = torch.tensor(remaining)
            spread = bt_head.ensemble_disagreement(heads, f[data.row_a[idx]], f[data.row_b[idx]])  # (R,)
            picked = select_pairs(spread, [data.prompt_of[i] for i in remaining], n - len(shown_active),
                                  active_share, seed=seed + n, max_per_prompt=2)
            shown_active = shown_active + [remaining[j] for j in picked.all]
        for arm, shown in (("active", shown_active[:n]), ("random", shown_random[:n])):
            votes = [i for i in shown if i in labels]
            weight, _ = fit(data, active_strategy, votes, labels, seed)
            result[arm][n] = {"accuracy": accuracy(data, active_strategy, weight, evaluation), "votes": len(votes)}
    return result


def pooled_answers(per_prompt: int, max_new_tokens: int, seeds: list[int]) -> list[dict]:
    """Rows {prompt, answers} of the prompts every seed's cache holds, each prompt's answers from all seeds."""
    sets = [{r["prompt"]: r["answers"] for r in read_answers(answers_cache_path(per_prompt, max_new_tokens, s))}
            for s in seeds]
    prompts = [p for p in sets[0] if all(p in answers for answers in sets[1:])]
    return [{"prompt": p, "answers": list(dict.fromkeys(a for answers in sets for a in answers[p]))} for p in prompts]


def summarise(values: list[float]) -> dict:
    return {"mean": statistics.fmean(values), "std": statistics.pstdev(values) if len(values) > 1 else 0.0,
            "n": len(values)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--annotator", default="polite", help="built-in rule or module:function")
    parser.add_argument("--flip", type=float, default=0.25, help="share of training votes flipped")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--sizes", default="32,64,128,200,256,384")
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--active-strategy", default="head:mean@2", help="what the round does by default")
    parser.add_argument("--active-share", type=float, default=0.25, help="random share of each active batch")
    parser.add_argument("--per-prompt", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--answer-seeds", default="0",
                        help="cached answer sets to pool per prompt (curve_data.py --seed S for each; 0,1: 8 answers)")
    parser.add_argument("--graded", default="off",
                        help="how graded votes enter the head: off, margin:M, weight:W (comma-separated variants)")
    parser.add_argument("--finetune-lr", type=float, help="lpft: Adam's step (default: the round's)")
    parser.add_argument("--finetune-epochs", type=int, help="lpft: passes over the votes (default: the round's)")
    parser.add_argument("--finetune-layers", type=int, help="lpft: decoder layers fine-tuned (default: the round's)")
    parser.add_argument("--no-active", action="store_true", help="curves only, no active against random arms")
    parser.add_argument("--features-only", action="store_true", help="extract and cache features, then stop")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=1, help="seeds run in parallel processes (one thread each)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    machine = describe_machine()
    print(machine_line(machine), flush=True)
    rows = pooled_answers(args.per_prompt, args.max_new_tokens, [int(s) for s in args.answer_seeds.split(",")])
    if not rows:
        print(f"No cached answers for seeds {args.answer_seeds}: run python bench/curve_data.py --max-new-tokens "
              f"{args.max_new_tokens} --seed S first.", file=sys.stderr)
        return 2
    index, features = load_features(rows, args.model, f"{Path(str(args.model)).name}-t{args.max_new_tokens}")
    if args.features_only:
        return 0
    variants = args.graded.split(",")
    for variant in variants:
        graded_settings(variant)
    graded_score = resolve_score(args.annotator) if variants != ["off"] else None
    if variants != ["off"] and graded_score is None:
        print(f"--graded needs an annotator with a score; {args.annotator} has none.", file=sys.stderr)
        return 2
    uses_lpft = any(s.startswith("lpft:") for s in [*args.strategies.split(","), args.active_strategy])
    finetune = {name: value for name, value in (("finetune_lr", args.finetune_lr),
                                                ("finetune_epochs", args.finetune_epochs),
                                                ("finetune_layers", args.finetune_layers)) if value is not None}
    data = CurveData(rows, index, features, resolve_judge(args.annotator), graded_score,
                     FeatureExtractor.from_model(args.model) if uses_lpft else None, finetune)
    sizes = [int(s) for s in args.sizes.split(",")]
    strategies = [s if v == "off" else f"{s} {v}" for s in args.strategies.split(",") for v in variants]
    started = time.perf_counter()
    jobs = [(data, seed, sizes, strategies, args.flip, args.active_strategy, args.active_share, not args.no_active)
            for seed in range(args.seeds)]
    # one seed a process, each on one thread: a forked child that uses the parent's OpenMP pool hangs
    with multiprocessing.get_context("fork").Pool(min(args.jobs, args.seeds), torch.set_num_threads, (1,)) as pool:
        runs = pool.starmap(run_seed, jobs)
    curve = {s: {n: summarise([r["curve"][s][n] for r in runs if n in r["curve"].get(s, {})])
                 for n in sizes if any(n in r["curve"].get(s, {}) for r in runs)} for s in strategies}
    arms = {arm: {n: {**summarise([r[arm][n]["accuracy"] for r in runs if n in r[arm]]),
                      "votes": statistics.fmean([r[arm][n]["votes"] for r in runs if n in r[arm]])}
                  for n in sizes if any(n in r[arm] for r in runs)} for arm in ("active", "random")}
    ties = sum(t == "tie" for t in data.truth) / len(data.truth)
    print(f"\n{len(rows)} prompts x {statistics.fmean(len(r['answers']) for r in rows):.1f} answers, "
          f"{len(data.candidates)} candidate pairs ({ties:.0%} ties), annotator "
          f"{args.annotator} with {args.flip:.0%} flips for training, noiseless for evaluation; "
          f"{statistics.fmean(r['n_eval'] for r in runs):.0f} held-out pairs; {args.seeds} seeds (mean +- std)")
    if variants != ["off"]:
        decided = [s for s, t in zip(data.strength, data.truth) if t != "tie"]
        print(f"graded votes: {sum(s == 2 for s in decided) / max(1, len(decided)):.0%} of decided pairs much better")
    print(f"{'strategy':<28}" + "".join(f"{n:>14}" for n in sizes))
    for s in strategies:
        print(f"{s:<28}" + "".join(f"{curve[s][n]['mean']:>8.1%} ±{curve[s][n]['std']:>4.1%}" if n in curve[s]
                                    else f"{'-':>14}" for n in sizes))
    print(f"\nshown pairs -> accuracy ({args.active_strategy}; votes = a/b answers among them)")
    for arm in ("random", "active"):
        print(f"{arm:<20}" + "".join(
            f"{arms[arm][n]['mean']:>7.1%} ({arms[arm][n]['votes']:.0f})" if n in arms[arm] else f"{'-':>14}"
            for n in sizes))
    print(json.dumps({"bench": "reward_curve", "annotator": args.annotator, "flip": args.flip, "seeds": args.seeds,
                      "answer_seeds": args.answer_seeds, "graded": variants,
                      "answers_per_prompt": statistics.fmean(len(r["answers"]) for r in rows),
                      "prompts": len(rows), "candidates": len(data.candidates), "tie_share": round(ties, 3),
                      "n_eval": statistics.fmean(r["n_eval"] for r in runs),
                      "curve": {s: {n: round(v["mean"], 4) for n, v in c.items()} for s, c in curve.items()},
                      "curve_std": {s: {n: round(v["std"], 4) for n, v in c.items()} for s, c in curve.items()},
                      "shown_random": {n: round(v["mean"], 4) for n, v in arms["random"].items()},
                      "shown_active": {n: round(v["mean"], 4) for n, v in arms["active"].items()},
                      "seconds": round(time.perf_counter() - started, 1), "machine": machine}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
