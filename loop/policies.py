"""The policies pair making and the demo answer with: a policy's model loaded once, the last round's reward model as
the judge of which pairs to ask about, and a policy's answers to a list of prompts."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from annotate.metrics import ROUND_REWARD_MODEL_PATH
from loop.retention import loadable_path
from rlhf.generate import generate_answers
from rlhf.reward.strategies import HEADS_FILE, VotesConfig
from rlhf.sampling import DEFAULT_BATCH_SIZE, Sampling


class PolicyModel(NamedTuple):
    """A policy loaded to answer: its causal LM and tokenizer."""

    model: Any
    tokenizer: Any


def load_policy_model(path: str) -> PolicyModel:
    """Model and tokenizer of a policy, on the GPU when there is one, in bf16 where the hardware has it."""
    import torch

    from rlhf.models import default_dtype, load_causal_lm, load_tokenizer

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = load_tokenizer(path)
    model = load_causal_lm(path, dtype=default_dtype(device), tokenizer=tokenizer).to(device)
    return PolicyModel(model, tokenizer)


def policy_model(store, policy_id: int, loaded: PolicyModel | None = None) -> PolicyModel:
    """`loaded` when given, else policy `policy_id` loaded from its recorded path; loop.retention.PolicyPruned, with a
    sentence, when its folder was pruned."""
    return loaded if loaded is not None else load_policy_model(loadable_path(store.policy(policy_id)))


def has_heads(path: str | None) -> bool:
    """Whether `path` is a reward model folder with bootstrap heads (what ranks candidate pairs)."""
    return path is not None and (Path(path) / HEADS_FILE).is_file()


def pair_judge_path(store) -> str | None:
    """The last finished round's reward model folder when it holds bootstrap heads; None before any round."""
    last = store.last_done_round()
    path = last.metrics.get(ROUND_REWARD_MODEL_PATH) if last is not None else None
    return path if has_heads(path) else None


def load_pair_judge(path: str | None, votes: VotesConfig):
    """The TrainedPreferenceModel at `path`, whose heads' disagreement ranks candidate pairs; None when there is no
    such model there or when votes.oversample <= 2 turns the choice off."""
    if votes.oversample <= 2 or not has_heads(path):
        return None
    from rlhf.reward.strategies import TrainedPreferenceModel

    return TrainedPreferenceModel.load(path)


def policy_answers(policy_path: str, prompts: list[str], sampling: Sampling, per_prompt: int, seed: int | None = None,
                   batch_size: int = DEFAULT_BATCH_SIZE) -> list[str]:
    """`per_prompt` sampled answers to each prompt, prompt by prompt (each prompt `per_prompt` times in a row); `seed`
    as in rlhf.generate.generate_answers."""
    model, tokenizer = load_policy_model(policy_path)
    generated = generate_answers(model, tokenizer, prompts, n_per_prompt=per_prompt, sampling=sampling, seed=seed,
                                 batch_size=batch_size)
    return [answer.text for answers in generated.answers for answer in answers]
