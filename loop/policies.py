"""The policies pair making and the demo answer with: a policy's model loaded once, the last round's reward model as
the judge of which pairs to ask about, and a policy's answers to a list of prompts."""

from __future__ import annotations

from pathlib import Path

from rlhf.generate import AnswerSampling, generate_answers
from rlhf.reward.strategies import HEADS_FILE, VotesConfig


def load_policy_model(path: str):
    """Model and tokenizer of a policy, on the GPU when there is one, in bf16 where the hardware has it."""
    import torch

    from rlhf.models import default_dtype, load_causal_lm, load_tokenizer

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = load_tokenizer(path)
    model = load_causal_lm(path, dtype=default_dtype(device), tokenizer=tokenizer).to(device)
    return model, tokenizer


def model_and_tokenizer(model_path_or_model, tokenizer):
    """A loaded model as given, or the policy at a path loaded once (its tokenizer unless one is given)."""
    if isinstance(model_path_or_model, str) or hasattr(model_path_or_model, "__fspath__"):
        model, loaded_tokenizer = load_policy_model(str(model_path_or_model))
        return model, tokenizer or loaded_tokenizer
    return model_path_or_model, tokenizer


def has_heads(path: str | None) -> bool:
    """Whether `path` is a reward model folder with bootstrap heads (what ranks candidate pairs)."""
    return path is not None and (Path(path) / HEADS_FILE).is_file()


def pair_judge_path(store) -> str | None:
    """The last finished round's reward model folder when it holds bootstrap heads; None before any round."""
    last = store.last_done_round()
    path = last.metrics.get("round/reward_model_path") if last is not None else None
    return path if has_heads(path) else None


def load_pair_judge(path: str | None, votes: VotesConfig):
    """The TrainedPreferenceModel at `path`, whose heads' disagreement ranks candidate pairs; None when there is no
    such model there or when votes.oversample <= 2 turns the choice off."""
    if votes.oversample <= 2 or not has_heads(path):
        return None
    from rlhf.reward.strategies import TrainedPreferenceModel

    return TrainedPreferenceModel.load(path)


def policy_answers(policy_path: str, prompts: list[str], sampling: AnswerSampling, per_prompt: int) -> list[str]:
    """`per_prompt` sampled answers to each prompt, prompt by prompt (each prompt `per_prompt` times in a row)."""
    model, tokenizer = load_policy_model(policy_path)
    generated = generate_answers(model, tokenizer, prompts, n_per_prompt=per_prompt, sampling=sampling)
    return [answer.text for answers in generated.answers for answer in answers]
