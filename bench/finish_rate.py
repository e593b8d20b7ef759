"""How many answers of the default model end with EOS (rather than at the token limit) at given sampling settings.

Pairs shown to people must be whole answers; this measures the share of "stop" answers on everyday prompts like
the shipped ones. One run per temperature at the largest limit gives the whole curve: a sampled answer does not
depend on the limit, so it ends under a limit L exactly when it ended in fewer than L tokens. Ends with one JSON
line per temperature.

    python bench/finish_rate.py --prompts data/prompts.jsonl --n-prompts 16 --max-new-tokens 512 --threads 1
    python bench/finish_rate.py --prompts everyday ...   # the 16 short everyday questions below

On a shared CPU, --threads 1 can be many times faster than torch's default (threads fighting for cores).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from annotate.importers import read_prompts
from bench.machine import describe_machine, machine_line
from rlhf.generate import generate_answers
from rlhf.sampling import Sampling
from rlhf.models import load_causal_lm, load_tokenizer

EVERYDAY_PROMPTS = [
    "What is the capital of France?",
    "Give me three tips for sleeping better.",
    "Explain photosynthesis to a ten-year-old.",
    "Write a haiku about autumn rain.",
    "How do I boil an egg so the yolk stays soft?",
    "What is the difference between weather and climate?",
    "Suggest a name for a small bakery.",
    "Why is the sky blue?",
    "Translate 'good morning' into Spanish and French.",
    "Write a short thank-you note to a colleague who helped me move.",
    "What are the health benefits of walking every day?",
    "Summarise the plot of Romeo and Juliet in two sentences.",
    "How many legs does a spider have?",
    "Give me a simple recipe for tomato soup.",
    "What should I pack for a weekend hiking trip?",
    "Explain what a computer virus is.",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default")
    parser.add_argument("--prompts", default="data/prompts.jsonl", help="a prompt file, or 'everyday' (built in)")
    parser.add_argument("--n-prompts", type=int, default=16, help="the first N prompts of the file")
    parser.add_argument("--temperature", type=float, nargs="+", default=[0.7])
    parser.add_argument("--top-p", type=float, default=0.95)
    parser.add_argument("--repetition-penalty", type=float, default=1.0)
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--max-new-tokens", type=int, default=512, help="the largest limit of the curve")
    parser.add_argument("--limits", type=int, nargs="+", default=[96, 128, 160, 192, 256, 320, 384, 512])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--texts", help="write every answer (prompt, text, n_tokens, finish_reason) to this JSON file")
    parser.add_argument("--samples", type=int, default=2, help="answers per prompt")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    if args.threads:
        torch.set_num_threads(args.threads)
    machine = describe_machine()
    print(machine_line(machine), flush=True)
    prompts = EVERYDAY_PROMPTS if args.prompts == "everyday" else read_prompts(args.prompts)[:args.n_prompts]
    tokenizer = load_tokenizer(args.model)
    model = load_causal_lm(args.model)
    all_answers = []
    for temperature in args.temperature:
        sampling = Sampling(max_new_tokens=args.max_new_tokens, temperature=temperature, top_p=args.top_p,
                            repetition_penalty=args.repetition_penalty)
        result = generate_answers(model, tokenizer, prompts, n_per_prompt=args.samples, sampling=sampling,
                                  seed=args.seed, batch_size=args.batch_size)
        answers = [a for row in result.answers for a in row]
        ended = sorted(a.n_tokens for a in answers if a.finish_reason == "stop")
        curve = {limit: round(sum(n < limit for n in ended) / len(answers), 3)
                 for limit in args.limits if limit <= args.max_new_tokens}
        all_answers += [{"temperature": temperature, "prompt": prompt, **vars(a)}
                        for prompt, row in zip(prompts, result.answers) for a in row]
        print(json.dumps({
            "prompts": args.prompts, "temperature": temperature, "top_p": args.top_p,
            "repetition_penalty": args.repetition_penalty,
            "answers": len(answers),
            "finished_share_by_limit": curve,
            "finished_len_median": ended[len(ended) // 2] if ended else None,
            "tokens_per_s": round(result.stats["gen/tokens_per_s"], 1),
            "generate_s": round(result.stats["time/generate_s"], 1),
            "machine": machine,
        }), flush=True)
    if args.texts:
        Path(args.texts).write_text(json.dumps(all_answers, indent=1, default=str))

if __name__ == "__main__":
    main()
