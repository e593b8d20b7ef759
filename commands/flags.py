"""Command-line flags that set configuration fields, generated from the fields: one default, written once.

A flag's help is its field's docstring (the first sentence) and the field's default; its type is the default's.
Flags left out stay None, so only what the user typed overrides rlhf-loop.toml, --config and --set.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import textwrap
from typing import Any

from loop.config import LoopConfig

from loop.config_files import load_config

CONFIG_FLAGS: dict[str, list[tuple[str, tuple[str, ...], dict]]] = {
    "common options": [
        ("--db", ("app.db",), {"metavar": "PATH"}),
        ("--model", ("app.model",), {"metavar": "NAME_OR_PATH"}),
        ("--overlap", ("app.overlap",), {"metavar": "K"}),
    ],
    "annotation app": [
        ("--host", ("serve.host",), {}),
        ("--port", ("serve.port",), {}),
        ("--share", ("serve.share",), {}),
        ("--auth", ("serve.auth",), {"metavar": "FILE"}),
        ("--admin", ("serve.admins",), {"metavar": "NAME"}),
        ("--first-batch", ("serve.first_batch",), {"metavar": "N"}),
        ("--auto-round-every", ("serve.auto_round_every",), {"metavar": "N"}),
    ],
    "simulated annotators (--simulate, --demo-loop)": [
        ("--rounds", ("simulate.rounds",), {"metavar": "R"}),
        ("--annotator", ("simulate.annotator",), {"metavar": "ANNOTATOR"}),
        ("--eval-prompts", ("simulate.eval_prompts",), {"metavar": "N"}),
        ("--eval-answers", ("simulate.eval_answers",), {"metavar": "K"}),
        ("--reward", ("simulate.reward",), {"choices": ["model", "oracle"]}),
        ("--oracle-ceiling", ("simulate.oracle_ceiling",), {}),
        ("--votes", ("simulate.votes",), {"metavar": "N"}),
        ("--noise", ("simulate.noise",), {"metavar": "RATE"}),
        ("--annotator-name", ("simulate.annotator_name",), {"metavar": "NAME"}),
        ("--team", ("simulate.team",), {"metavar": "SPEC"}),
        ("--seed", ("simulate.seed",), {}),
    ],
    "reward model (--train-reward)": [
        ("--rm-warm-start", ("reward.warm_start",), {"metavar": "DIR"}),
        ("--rm-epochs", ("reward.epochs",), {"metavar": "N"}),
        ("--rm-lr", ("reward.learning_rate",), {"metavar": "LR"}),
        ("--rm-batch-size", ("reward.batch_size",), {"metavar": "N"}),
        ("--rm-grad-accum", ("reward.grad_accum",), {"metavar": "N"}),
        ("--rm-max-length", ("reward.max_length",), {"metavar": "N"}),
        ("--rm-loss", ("reward.loss_form",), {"choices": ["divergence", "last_token"]}),
        ("--rm-margin", ("reward.margin",), {"metavar": "M"}),
        ("--rm-center-coef", ("reward.center_coef",), {"metavar": "C"}),
        ("--rm-heldout-fraction", ("reward.heldout_fraction",), {"metavar": "F"}),
        ("--rm-seed", ("reward.seed",), {"metavar": "N"}),
    ],
    "PPO (--train-ppo; the actor and reference are --model)": [
        ("--steps", ("ppo.steps",), {"metavar": "N"}),
        ("--lora", ("ppo.use_lora",), {}),
        ("--ppo-batch-size", ("ppo.batch_size", "ppo.mini_batch_size"), {"metavar": "N"}),
        ("--ppo-max-new-tokens", ("ppo.sampling.max_new_tokens",), {"metavar": "N"}),
    ],
    "generating pairs (--generate-pairs, the app, a round's next pairs)": [
        ("--max-new-tokens", ("sampling.max_new_tokens",), {"metavar": "N"}),
        ("--temperature", ("sampling.temperature",), {"metavar": "T"}),
    ],
    "supervised fine-tuning (--sft)": [
        ("--sft-epochs", ("sft.epochs",), {"metavar": "N"}),
        ("--sft-lr", ("sft.learning_rate",), {"metavar": "LR"}),
        ("--sft-batch-size", ("sft.batch_size",), {"metavar": "N"}),
    ],
}
"""Group title -> (flag, the configuration keys it sets, extra argparse settings)."""


@functools.lru_cache(maxsize=None)
def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of a dataclass (the string literal that follows its annotation)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    docs = {}
    for node, following in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and \
                isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant) and \
                isinstance(following.value.value, str):
            docs[node.target.id] = " ".join(following.value.value.split())
    return docs


def _field(section: str, key: str) -> tuple[Any, str]:
    """(default, docstring) of `section.key` in a fresh LoopConfig (`key` dotted within a table: sampling.top_k)."""
    stage = getattr(LoopConfig(), section)
    *tables, key = key.split(".")
    for table in tables:
        stage = getattr(stage, table)
    for cls in type(stage).__mro__:
        if dataclasses.is_dataclass(cls) and key in field_docs(cls):
            return getattr(stage, key), field_docs(cls)[key]
    return getattr(stage, key), ""


def _first_sentence(text: str) -> str:
    sentence, dot, _rest = text.partition(". ")
    return sentence.rstrip(".") if dot else text.rstrip(".")


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """One argument group per CONFIG_FLAGS entry; each flag's type, help and shown default come from its field."""
    for title, flags in CONFIG_FLAGS.items():
        group = parser.add_argument_group(title)
        for flag, keys, extra in flags:
            section, key = keys[0].split(".", 1)
            default, doc = _field(section, key)
            shown = "" if default is None or default in ([], "") else f" (default {default})"
            settings = {"dest": _dest(flag), "default": None,
                        "help": f"{_first_sentence(doc)}{shown}; sets {', '.join(keys)}", **extra}
            if isinstance(default, bool):
                settings["action"] = "store_const"
                settings["const"] = True
            elif isinstance(default, list):
                settings["action"] = "append"
            elif default is not None and "choices" not in extra:
                settings["type"] = type(default)
            group.add_argument(flag, **settings)


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def flag_values(args: argparse.Namespace) -> list[tuple[str, str, Any, str]]:
    """(section, key, value, flag) for every configuration flag given on the command line."""
    values = []
    for flags in CONFIG_FLAGS.values():
        for flag, keys, _extra in flags:
            value = getattr(args, _dest(flag), None)
            if value is not None:
                values.extend((*key.split(".", 1), value, flag) for key in keys)
    return values


def config_from_args(args: argparse.Namespace) -> LoopConfig:
    """The one configuration: defaults < rlhf-loop.toml < --config < --set < the configuration flags typed."""
    return load_config(args.config, args.set, flag_values(args))
