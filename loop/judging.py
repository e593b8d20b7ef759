"""How the demo judges a policy: a simulated annotator's verdict on its answers against the first policy's (the win
rate with its interval), the rule's mean score of them, the reward model's, and the rule as PPO's reward (the oracle:
its score, or its expected verdict against the first policy's answers). Pure functions of texts and judges, but
`reward_model_means`, which loads the reward model."""

from __future__ import annotations

from bisect import bisect_left, bisect_right

from annotate.statistics import mean_and_standard_error, win_rate_interval


def comparison_scores(judge, prompts: list[str], new_answers: list[str], first_answers: list[str]) -> list[float]:
    """The judge on each new answer against the first policy's, sides alternated: 1 a win, 0.5 a tie, 0 a loss."""
    scores = []
    for index, (prompt, new, old) in enumerate(zip(prompts, new_answers, first_answers)):
        new_on_a = index % 2 == 0
        verdict = judge(prompt, new, old) if new_on_a else judge(prompt, old, new)
        scores.append(0.5 if verdict == "tie" else 1.0 if verdict == ("a" if new_on_a else "b") else 0.0)
    return scores


def head_to_head(judge, prompts: list[str], new_answers: list[str], first_answers: list[str],
                 per_prompt: int = 1) -> dict[str, float]:
    """The judge on new against first answers, sides alternated: the win rate (ties half), its 95% interval
    (`win_rate_interval`, `per_prompt` answers to each prompt in a row), wins, losses and ties.

    The counts are reported with the rate because 50% alone cannot tell an even match from all ties.
    """
    scores = comparison_scores(judge, prompts, new_answers, first_answers)
    low, high = win_rate_interval(scores, per_prompt)
    return {"win_rate": sum(scores) / len(scores) if scores else 0.0, "win_rate_low": low, "win_rate_high": high,
            "wins": scores.count(1.0), "losses": scores.count(0.0), "ties": scores.count(0.5)}


def mean_score(score, answers: list[str]) -> float | None:
    """The rule's mean score over the answers; None when the annotator has no score (a module:function verdict)."""
    if score is None or not answers:
        return None
    return sum(score(answer) for answer in answers) / len(answers)


def judged(judge, score, prompts: list[str], answers: list[str], first_answers: list[str],
           per_prompt: int) -> dict:
    """A policy's answers against the first policy's: `head_to_head`, and the rule's mean score of them with its
    standard error (None for an annotator without a score)."""
    judge_score, judge_score_se = (None, None) if score is None else \
        mean_and_standard_error([score(answer) for answer in answers], per_prompt)
    return {**head_to_head(judge, prompts, answers, first_answers, per_prompt), "judge_score": judge_score,
            "judge_score_se": judge_score_se}


def oracle_reward(score, annotator: str):
    """PPO's reward function (texts -> scores) from an annotator's own score of an answer."""
    def reward(texts: list[str]) -> list[float]:
        return [float(score(text)) for text in texts]

    reward.__name__ = f"oracle:{annotator}"
    return reward


def win_rate_reward(score, reference_answers: list[str], annotator: str):
    """PPO's reward function (texts -> scores) from an annotator's verdicts rather than its score: the share of
    `reference_answers` (the first policy's) that an answer beats under the rule, ties half. That is the answer's
    expected verdict against one of those answers drawn at random, the quantity the demo's win rate averages (the win
    rate pairs answers to the same prompt; a rule's score does not look at the prompt, so here they are pooled)."""
    if not reference_answers:
        raise ValueError("the win-rate oracle needs the first policy's answers to compare with")
    references = sorted(float(score(answer)) for answer in reference_answers)

    def reward(texts: list[str]) -> list[float]:
        shares = []
        for text in texts:
            value = float(score(text))
            below, up_to = bisect_left(references, value), bisect_right(references, value)
            shares.append((below + 0.5 * (up_to - below)) / len(references))
        return shares

    reward.__name__ = f"oracle-win-rate:{annotator}"
    return reward


def reward_model_means(path: str, prompts: list[str], answer_sets: list[list[str]], max_length: int) -> list[float]:
    """The mean score the reward model at `path` gives each list of answers to `prompts`: beside the judge's score, a
    reward model that rises while the judge does not is being over-optimised (reward hacking)."""
    from rlhf.reward.model import RewardModel, load_reward_tokenizer
    from rlhf.reward.strategies import score_with_reward_model

    model, tokenizer = RewardModel.from_pretrained(path), load_reward_tokenizer(None, path)
    return [float(score_with_reward_model(model, tokenizer, prompts, answers, max_length=max_length).mean())
            for answers in answer_sets]


def repeat_each(prompts: list[str], times: int) -> list[str]:
    """Each prompt `times` times in a row: the prompts of `policy_answers`' answers."""
    return [prompt for prompt in prompts for _ in range(times)]
