"""The model card (README.md) of a saved policy, so its folder can be published as it is (`huggingface-cli upload`).

`model_card` is a pure function of what the caller knows: the base model, the round, the votes and the metrics
(`python app.py --train-ppo` knows no round and no votes, only its reward model). The YAML header follows the Hub's
model card metadata; `base_model` goes there only when it is a Hub id (a local folder would fail the Hub's check).
A LoRA round's policy is a folder of adapters (peft's format): its card says which model they sit on and how to merge
them into a whole model for publishing (`python app.py --merge`).
"""

from __future__ import annotations

import re
from pathlib import Path

from annotate.metrics import (PPO_KL, PPO_PREFIX, PPO_REWARD, RM_HELDOUT_ACCURACY, RM_HELDOUT_HIGH, RM_HELDOUT_LOW,
                              RM_HELDOUT_N, RM_PREFIX, RM_TRAIN_ACCURACY, is_number)
from rlhf.model_names import DEFAULT_MODEL, adapter_base, is_adapter_folder
from rlhf.sampling import Sampling

CARD_FILE = "README.md"
METRIC_PREFIXES = (RM_PREFIX, PPO_PREFIX)
"""Metrics the card lists: the reward model's (held-out accuracy...) and PPO's means over the run's steps."""
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def _value(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:.4g}"


def _sampling_line(sampling: Sampling) -> str:
    parts = [f"temperature {sampling.temperature}"]
    parts.append(f"top-k {sampling.top_k}" if sampling.top_k else "no top-k")
    parts.append(f"top-p {sampling.top_p}" if sampling.top_p < 1.0 else "no top-p")
    if sampling.repetition_penalty != 1.0:
        parts.append(f"repetition penalty {sampling.repetition_penalty} on the answer's tokens")
    return ", ".join(parts)


def model_card(
    base_model: str,
    round_number: int | None = None,
    n_votes: int | None = None,
    metrics: dict | None = None,
    n_pairs: int | None = None,
    sampling: Sampling | None = None,
    reward_model: str | None = None,
    adapters_on: str | None = None,
) -> str:
    """README.md of a policy: Hub metadata, what it was trained from and on, its metrics, and how to load it.

    `metrics`: any dict (a round's whole metrics will do); the numbers under METRIC_PREFIXES are listed.
    `sampling`: what PPO sampled with (what generation_config.json holds).
    `adapters_on`: the model a folder of LoRA adapters sits on (adapter_config.json's), None for a whole model.
    """
    header = ["---"]
    hub_base = adapters_on if adapters_on is not None else base_model
    if _HUB_ID.match(hub_base):
        header.append(f"base_model: {hub_base}")
    header += [f"library_name: {'transformers' if adapters_on is None else 'peft'}", "pipeline_tag: text-generation",
               "tags:", "- rlhf", "- ppo", "- rlhf-loop", *(["- lora"] if adapters_on is not None else []), "---", ""]
    title = f"Policy of round {round_number}" if round_number is not None else "PPO policy"
    lines = [f"# {title}", "",
             "A chat model fine-tuned with PPO (DeepSpeed-Chat's step 3) against a reward model trained on people's "
             "choices between two answers, by rlhf-loop.", "",
             f"- **Base model:** `{base_model}`"]
    if adapters_on is not None:
        lines.append(f"- **LoRA adapters on:** `{adapters_on}`: this folder holds the adapters alone (peft's format), "
                     "not a whole model; loading it loads that model, then the adapters")
    if round_number is not None:
        lines.append(f"- **Round:** {round_number} (each round trains a reward model on all votes so far, then this "
                     "policy from the previous one)")
    if n_pairs is not None or n_votes is not None:
        learned = "preference pairs" if n_pairs is None else f"{n_pairs} preference pair{'s' * (n_pairs != 1)}"
        if n_votes is not None:
            learned += f", from {n_votes} votes (skips not counted; ties and both-bad votes are not trained on)"
        lines.append(f"- **Learned from:** {learned}")
    if reward_model is not None:
        lines.append(f"- **Reward model:** `{reward_model}`")
    if sampling:
        lines.append(f"- **Sampled in training with:** {_sampling_line(sampling)}; generation_config.json holds "
                     "these settings and nothing else (none of the base model's own)")
    lines += headline_lines(metrics or {})
    numbers = {key: value for key, value in (metrics or {}).items() if key.startswith(METRIC_PREFIXES) and
               is_number(value)}
    if numbers:
        lines += ["", "## Metrics", "", "| metric | value |", "| --- | --- |"]
        lines += [f"| `{key}` | {_value(value)} |" for key, value in sorted(numbers.items())]
    lines += ["", "## Use", "", *_use_lines(adapters_on)]
    return "\n".join(header + lines)


_CHAT = ['messages = [{"role": "user", "content": "Hello!"}]',
         "inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors=\"pt\", "
         "return_dict=True)",
         "print(tokenizer.decode(model.generate(**inputs, max_new_tokens=256)[0], skip_special_tokens=True))",
         "```", ""]


def _use_lines(adapters_on: str | None) -> list[str]:
    """How to load the folder; for adapters, also how to merge them into a whole model (to publish, or to load
    without peft)."""
    tokenizer = 'tokenizer = AutoTokenizer.from_pretrained("PATH")'
    if adapters_on is None:
        return ["```python", "from transformers import AutoModelForCausalLM, AutoTokenizer", "", tokenizer,
                'model = AutoModelForCausalLM.from_pretrained("PATH")', *_CHAT]
    embedded = "" if adapters_on != DEFAULT_MODEL else (
        f" (`{DEFAULT_MODEL}` is rlhf-loop's embedded model: merge with rlhf-loop, or write the folder it was "
        "converted to as base_model_name_or_path in adapter_config.json)")
    return ["To publish a whole model, or to load it without peft, merge the adapters into their base model"
            f"{embedded}:", "", "```bash", "python app.py --merge PATH OUT   # OUT: safetensors, tokenizer, "
            "generation_config.json", "```", "", "or load it with peft, the adapters merged into the base's weights:",
            "", "```python", "from peft import AutoPeftModelForCausalLM", "from transformers import AutoTokenizer", "",
            tokenizer, 'model = AutoPeftModelForCausalLM.from_pretrained("PATH").merge_and_unload()', *_CHAT]


def headline_lines(metrics: dict) -> list[str]:
    """The figures a reader looks for first, in words: held-out accuracy with its interval and n (training accuracy
    beside it, labelled as such), PPO's mean reward and KL."""
    lines = []
    accuracy = RM_HELDOUT_ACCURACY.of(metrics)
    if accuracy is not None:
        low, high, n, trained = (metric.of(metrics) for metric in (RM_HELDOUT_LOW, RM_HELDOUT_HIGH, RM_HELDOUT_N,
                                                                   RM_TRAIN_ACCURACY))
        details = [f"95% interval {RM_HELDOUT_LOW.text(low)}-{RM_HELDOUT_HIGH.text(high)}"] if low is not None else []
        details += [f"on {RM_HELDOUT_N.text(n)} pairs it never trained on"] if n is not None else []
        details += [f"{RM_TRAIN_ACCURACY.label}: {RM_TRAIN_ACCURACY.text(trained)}"] if trained is not None else []
        lines.append(f"- **Reward model, {RM_HELDOUT_ACCURACY.label}:** {RM_HELDOUT_ACCURACY.text(accuracy)}"
                     + (f" ({'; '.join(details)})" if details else ""))
    ppo = [f"{metric.label} {metric.text(value)}" for metric in (PPO_REWARD, PPO_KL)
           if (value := metric.of(metrics)) is not None]
    if ppo:
        lines.append(f"- **PPO, over its steps:** {', '.join(ppo)}")
    return lines


def write_model_card(folder: str | Path, base_model: str, **details) -> Path:
    """Write `model_card(base_model, **details)` as the folder's README.md (over the one peft writes beside adapters,
    whose base it names); returns its path."""
    if is_adapter_folder(folder):
        details.setdefault("adapters_on", adapter_base(folder) or "(not recorded in adapter_config.json)")
    path = Path(folder) / CARD_FILE
    path.write_text(model_card(base_model, **details), encoding="utf-8")
    return path
