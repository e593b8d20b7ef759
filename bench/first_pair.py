"""How soon a first start is votable: the real `python app.py` on a fresh database, timed from its start.

    python bench/first_pair.py                   # the default model, converted already under data/models
    python bench/first_pair.py --cold-model      # run from an empty folder: the first start converts the GGUF too
    python bench/first_pair.py --all             # also wait for the whole first batch (32 pairs)
    python bench/first_pair.py --watch-s 120 -- --set pairs.batch_size=8    # app flags after --

The app seeds the shipped prompts and starts its first batch of pairs in a child process (`--generate-pairs`); the
bench polls the page until it answers and the database until pairs appear. Times are from the app's start; the goal
is a first pair within 30 s of the page answering, on a 2-core CPU. The machine's CPU, cores and load are
printed first: on a shared machine the load says how much of it the app had. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT_ROOT))

from annotate.store import Store
from bench.annotate_load import free_port, wait_until_up
from bench.machine import describe_machine, machine_line

CONVERTED_MODEL = Path("data") / "models" / "SmolLM2-135M-Instruct" / "config.json"
"""Where the app finds the converted default model, relative to its working folder (rlhf.models.DEFAULT_CACHE_DIR;
not imported, so that this process never loads torch beside the app it measures)."""


def cpu_line(machine: dict) -> str:
    """The CPU (bench/machine.py) and the load averages, for the record."""
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    return f"{machine_line(machine)}; load average (1, 5, 15 min): {load}"


def count_pairs(db: Path) -> int:
    if not db.exists():
        return 0
    try:
        with Store(db) as store:
            return store.count_pairs()
    except Exception:  # noqa: BLE001 - the app may be creating or migrating the database right now
        return 0


def has_children(pid: int) -> bool:
    """Whether process `pid` has a child process now (the app's pair maker)."""
    try:
        return any(path.read_text().strip() for path in Path(f"/proc/{pid}/task").glob("*/children"))
    except OSError:
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--watch-s", type=float, default=60.0,
                        help="keep counting pairs this long after the page answers (default 60)")
    parser.add_argument("--timeout-s", type=float, default=600.0,
                        help="give up on a first pair after this long from the start (default 600)")
    parser.add_argument("--cold-model", action="store_true",
                        help="start the app in an empty folder, so that it converts the default model first")
    parser.add_argument("--all", action="store_true",
                        help="also wait until the app's pair maker is done with the whole first batch")
    parser.add_argument("app_args", nargs="*", help="more flags for app.py (after --)")
    args = parser.parse_args(argv)

    machine = describe_machine(with_torch=False)  # no torch in this process beside the app it measures
    print(cpu_line(machine), file=sys.stderr)
    load_before = os.getloadavg()
    workdir = tempfile.TemporaryDirectory(prefix="first-pair-")
    cwd = Path(workdir.name) if args.cold_model else PROJECT_ROOT
    model_cache = "cold" if not (cwd / CONVERTED_MODEL).is_file() else "converted"
    db, port = Path(workdir.name) / "first.db", free_port()
    url = f"http://127.0.0.1:{port}/"
    log_path = Path(workdir.name) / "app.log"
    command = [sys.executable, str(PROJECT_ROOT / "app.py"), "--db", str(db), "--port", str(port), *args.app_args]
    timeline: list[tuple[float, int]] = []  # (seconds, pairs) each time the count changed
    with open(log_path, "w") as log:
        began = time.monotonic()
        # A session of its own: the app's pair-making child is stopped with it.
        process = subprocess.Popen(command, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_until_up(url, process, timeout_s=args.timeout_s)
            page_s = time.monotonic() - began
            first_s = pairs_at_watch = all_s = None
            maker_seen = False
            while True:
                now = time.monotonic() - began
                maker = has_children(process.pid)
                pairs = count_pairs(db)
                if not timeline or pairs != timeline[-1][1]:
                    timeline.append((round(now, 1), pairs))
                if first_s is None and pairs > 0:
                    first_s = now
                if pairs_at_watch is None and now >= page_s + args.watch_s:
                    pairs_at_watch = pairs
                if maker_seen and not maker and all_s is None:
                    all_s = now
                maker_seen = maker_seen or maker
                done = pairs_at_watch is not None and first_s is not None and (all_s is not None or not args.all)
                maker_done = all_s is not None and pairs_at_watch is not None  # no more pairs are coming
                if done or maker_done or now > args.timeout_s or process.poll() is not None:
                    break
                time.sleep(0.25)
        finally:
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            process.wait(30)
    load_after = os.getloadavg()
    app_log = log_path.read_text(errors="replace")
    workdir.cleanup()
    if first_s is None:
        print(f"No pair within {args.timeout_s:.0f} s; the app's last output:\n{app_log[-3000:]}", file=sys.stderr)
    summary = {
        "seconds_to_page": round(page_s, 1),
        "seconds_to_first_pair": round(first_s, 1) if first_s is not None else None,
        f"pairs_after_{args.watch_s:.0f}_s": pairs_at_watch,
        "first_pair_after_page_s": round(first_s - page_s, 1) if first_s is not None else None,
        "seconds_to_all_pairs": round(all_s, 1) if all_s is not None else None,
        "pairs_at_end": timeline[-1][1] if timeline else 0,
        "pairs_timeline": timeline,
        "model_cache": model_cache,
        "cores": os.cpu_count(),
        "load_before": [round(value, 2) for value in load_before],
        "load_after": [round(value, 2) for value in load_after],
        "app_args": args.app_args,
        "machine": machine,
    }
    print(f"page after {page_s:.1f} s, first pair after {summary['seconds_to_first_pair']} s "
          f"({summary['first_pair_after_page_s']} s after the page), {pairs_at_watch} pairs {args.watch_s:.0f} s "
          f"after the page; model {model_cache}.", file=sys.stderr)
    print(json.dumps(summary))
    return 0 if first_s is not None else 1


if __name__ == "__main__":
    sys.exit(main())
