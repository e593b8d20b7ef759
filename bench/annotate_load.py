"""Load test of the annotation app: N simulated annotators voting at once through its HTTP API.

    python bench/annotate_load.py                        # starts `app.py` on a temporary database seeded with pairs
    python bench/annotate_load.py --annotators 50 --votes 1000
    python bench/annotate_load.py --url http://127.0.0.1:7860/ --db data/rlhf-loop.db   # a running app

Each annotator is a gradio_client.Client (its own session) that signs in and then votes through the same `/vote`
endpoint the page's buttons use, spending --think-s seconds on average on each pair (0: back to back, which finds
the saturation point rather than what people feel); the latency measured is from sending a vote to holding the
next pair. Afterwards the database is checked: every acknowledged vote must be there exactly once, and
no pair may collect more votes than its overlap. The last line of output is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT_ROOT))

from annotate.records import NewGeneration, NewPair
from annotate.store import Store
from bench.machine import describe_machine, machine_line

CHOICES = ("left", "right", "tie", "both_bad", "skip")
ANSWER_WORDS = ["the", "a", "model", "answer", "helps", "people", "when", "it", "is", "clear", "short", "correct", "and", "kind", "to", "them"]


@dataclass
class AnnotatorResult:
    """What one simulated annotator saw."""

    name: str
    latencies_ms: list[float] = field(default_factory=list)
    acknowledged: list[int] = field(default_factory=list)
    """Pair ids whose vote the app answered with the next pair."""
    errors: list[str] = field(default_factory=list)


def seed_database(path: Path, n_pairs: int, seed: int) -> None:
    """Prompts with one pair each, answers of ~60 words, like short model outputs."""
    rng = random.Random(seed)
    with Store(path) as store:
        store.add_prompts([f"Load test prompt {i}: explain something useful in a few words." for i in range(n_pairs)])
        policy = store.add_policy(0, "bench")

        def answer() -> NewGeneration:
            return NewGeneration(policy, " ".join(rng.choice(ANSWER_WORDS) for _ in range(60)), 80, "eos")

        store.add_pairs_bulk([NewPair(p.id, answer(), answer()) for p in store.prompts()])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_up(url: str, process: subprocess.Popen | None, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the app exited with code {process.returncode} before answering")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.25)
    raise RuntimeError(f"the app did not answer at {url} within {timeout_s:.0f} s")


def poll_gradio_client_every(seconds: float) -> None:
    """gradio_client waits for each answer by checking its inbox and sleeping 50 ms between checks, so every call
    it makes looks at least ~50 ms slow whatever the app does. Shorten that sleep (in gradio_client only), so the
    figures measure the app and not the client's polling."""
    import gradio_client.utils as client_utils

    class ShortSleeps:
        def __getattr__(self, name):
            return getattr(time, name)

        @staticmethod
        def sleep(duration: float) -> None:
            time.sleep(min(duration, seconds))

    client_utils.time = ShortSleeps()


def run_annotator(url: str, name: str, votes: int, think_s: float, start: threading.Barrier, seed: int,
                  result: AnnotatorResult) -> None:
    from gradio_client import Client

    rng = random.Random(seed)
    try:
        # TLS verification only matters for https; for http it would still cost ~35 ms of CPU per call, because
        # gradio_client opens two new httpx clients per call and each loads the CA bundle.
        client = Client(url, verbose=False, ssl_verify=url.startswith("https:"))
        signed = client.predict(name, api_name="/sign_in")
        pair_id = signed[1]
    except Exception as error:  # noqa: BLE001 - a failed sign-in is reported, not raised: the others go on
        result.errors.append(f"sign in: {error}")
        start.wait()
        return
    start.wait()
    time.sleep(rng.uniform(0, think_s))  # people do not all press at the same instant
    for _ in range(votes):
        if pair_id is None or pair_id < 0:
            result.errors.append("queue empty")
            return
        began = time.perf_counter()
        try:
            outputs = client.predict(rng.choice(CHOICES), pair_id, "", api_name="/vote")
        except Exception as error:  # noqa: BLE001 - reported with the figures, as a failed sign-in
            result.errors.append(f"vote on pair {pair_id}: {error}")
            return
        result.latencies_ms.append((time.perf_counter() - began) * 1000)
        status = outputs[-2]
        if not status.startswith("Recorded"):
            result.errors.append(f"vote on pair {pair_id} answered {status!r}")
            return
        result.acknowledged.append(pair_id)
        pair_id = outputs[1]
        if think_s > 0:  # reading the next pair: uniform around the mean
            time.sleep(rng.uniform(0.5 * think_s, 1.5 * think_s))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def check_database(db: Path, results: list[AnnotatorResult], overlap: int) -> tuple[int, int]:
    """(lost, duplicated): acknowledged votes missing from the database; votes beyond what should exist."""
    names = {r.name for r in results}
    with Store(db) as store:
        rows = [v for v in store.votes() if v.annotator in names]
    stored = Counter((v.annotator, v.pair_id) for v in rows)
    acknowledged = Counter((r.name, pair) for r in results for pair in r.acknowledged)
    lost = sum(1 for key in acknowledged if key not in stored)
    # The same pair twice for one annotator (shown again after a vote), or more votes on a pair than its overlap.
    shown_twice = sum(count - 1 for count in acknowledged.values() if count > 1)
    per_pair = Counter(v.pair_id for v in rows)
    over_overlap = sum(count - overlap for count in per_pair.values() if count > overlap)
    return lost, shown_twice + over_overlap


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--annotators", type=int, default=20, help="concurrent simulated annotators (default 20)")
    parser.add_argument("--votes", type=int, default=400, help="votes in all, shared among them (default 400)")
    parser.add_argument("--think-s", type=float, default=1.0,
                        help="mean seconds each annotator spends on a pair before voting (default 1.0, several times "
                             "faster than people read two answers; 0 votes back to back to find the saturation point)")
    parser.add_argument("--client-poll-ms", type=float, default=2.0,
                        help="how often gradio_client checks for an answer (default 2; the library's own 50 adds up "
                             "to 50 ms to every figure)")
    parser.add_argument("--url", help="a running app to test instead of starting one (needs --db)")
    parser.add_argument("--db", help="the database of the app at --url, checked afterwards")
    parser.add_argument("--overlap", type=int, default=1, help="the app's votes per pair (default 1)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.url and not args.db:
        parser.error("--url needs --db, the app's database, to check that no vote was lost or duplicated")
    machine = describe_machine(with_torch=False)  # the app runs in its own process; this one needs no torch
    print(machine_line(machine), flush=True)
    per_annotator = max(1, args.votes // args.annotators)
    poll_gradio_client_every(args.client_poll_ms / 1000)

    workdir = tempfile.TemporaryDirectory(prefix="annotate-load-")
    process = None
    log = None
    if args.url:
        url, db = args.url, Path(args.db)
    else:
        db = Path(workdir.name) / "load.db"
        seed_database(db, per_annotator * args.annotators * args.overlap + 2 * args.annotators, args.seed)
        port = free_port()
        url = f"http://127.0.0.1:{port}/"
        log = open(Path(workdir.name) / "app.log", "w")  # noqa: SIM115 - open while the app runs, closed below
        process = subprocess.Popen(
            [sys.executable, str(PROJECT_ROOT / "app.py"), "--db", str(db), "--port", str(port), "--first-batch", "0",
             "--overlap", str(args.overlap), "--admin", "bench-admin"],
            cwd=PROJECT_ROOT, stdout=log, stderr=subprocess.STDOUT,
        )
    try:
        wait_until_up(url, process)
        results = [AnnotatorResult(f"load-{i:03d}") for i in range(args.annotators)]
        start = threading.Barrier(args.annotators + 1)
        threads = [
            threading.Thread(target=run_annotator,
                             args=(url, r.name, per_annotator, args.think_s, start, args.seed + i, r))
            for i, r in enumerate(results)
        ]
        for thread in threads:
            thread.start()
        start.wait()
        began = time.perf_counter()
        for thread in threads:
            thread.join()
        seconds = time.perf_counter() - began
    finally:
        if process is not None:
            process.terminate()
            process.wait(10)
            log.close()
    lost, duplicated = check_database(db, results, args.overlap)
    latencies = [ms for r in results for ms in r.latencies_ms]
    votes = sum(len(r.acknowledged) for r in results)
    errors = [f"{r.name}: {e}" for r in results for e in r.errors]
    for error in errors[:10]:
        print(f"error: {error}", file=sys.stderr)
    summary = {
        "annotators": args.annotators,
        "think_s": args.think_s,
        "client_poll_ms": args.client_poll_ms,
        "votes": votes,
        "votes_per_s": round(votes / seconds, 1) if seconds else 0.0,
        "p50_ms": round(statistics.median(latencies), 1) if latencies else None,
        "p95_ms": round(percentile(latencies, 0.95), 1) if latencies else None,
        "max_ms": round(max(latencies), 1) if latencies else None,
        "lost": lost,
        "duplicated": duplicated,
        "errors": len(errors),
        "seconds": round(seconds, 2),
        "machine": machine,
    }
    print(f"{votes} votes from {args.annotators} annotators in {seconds:.1f} s; vote to next pair "
          f"p50 {summary['p50_ms']} ms, p95 {summary['p95_ms']} ms; lost {lost}, duplicated {duplicated}",
          file=sys.stderr)
    print(json.dumps(summary))
    workdir.cleanup()
    return 0 if lost == 0 and duplicated == 0 and not errors else 1


if __name__ == "__main__":
    sys.exit(main())
