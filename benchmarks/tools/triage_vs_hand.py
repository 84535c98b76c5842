"""Does triage find, by itself and fast, what the best hand-found lever set reaches?

Runs `kerneltriage triage` on a model (its wall time from the start of the process, model load included: what a
user waits), then `kerneltriage ab` of the hand-found set (A) against triage's final configuration (B) in one run:
B/A ≥ 0.95 in a phase means triage's set reaches 95% of the hand set's speed there.

    python benchmarks/tools/triage_vs_hand.py --model default --hand packed_qkv,graphs --out DIR [--tag T]
        [--pairs 10] [-- extra triage flags]

Writes DIR/triage-TAG.json (the report, with `wall_s` and the command added), DIR/triage-TAG.html, its stderr in
DIR/triage-TAG.log and DIR/ab-TAG-hand-vs-triage.json; prints one summary line.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

KT = [sys.executable, "-m", "kerneltriage"]


def run_triage(model: str, out: Path, tag: str, extra: list[str]) -> dict:
    """triage's JSON report with its wall seconds (or exit with its error)."""
    command = [*KT, "triage", "--model", model, "--output", "json", "--html", str(out / f"triage-{tag}.html"), *extra]
    began = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - began
    (out / f"triage-{tag}.log").write_text(done.stderr)
    sys.stderr.write(done.stderr[-4000:])
    if done.returncode != 0:
        sys.exit(f"triage failed ({done.returncode}) after {wall:.0f} s")
    report = json.loads(done.stdout) | {"wall_s": wall, "tool_command": " ".join(command[2:])}
    (out / f"triage-{tag}.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def run_ab(model: str, hand: str, final: str, pairs: int, out: Path, tag: str) -> dict:
    """ab of the hand set (A) against triage's final configuration (B)."""
    command = [*KT, "ab", "--model", model, "--a", f"levers={hand}", "--b", final, "-r", str(pairs),
               "--output", "json"]
    done = subprocess.run(command, capture_output=True, text=True)
    sys.stderr.write(done.stderr[-2000:])
    if done.returncode != 0:
        sys.exit(f"ab failed ({done.returncode})")
    (out / f"ab-{tag}-hand-vs-triage.json").write_text(done.stdout)
    return json.loads(done.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default", help="the model triage and ab run (default: default)")
    parser.add_argument("--hand", required=True, help="the best lever set found by hand, comma-separated")
    parser.add_argument("--out", type=Path, required=True, help="folder for the three files")
    parser.add_argument("--tag", default=None, help="file name part (default: the model)")
    parser.add_argument("--pairs", type=int, default=10, help="ab pairs per block (default: 10)")
    parser.add_argument("extra", nargs=argparse.REMAINDER, help="after --: more triage flags")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    tag = args.tag or args.model
    report = run_triage(args.model, args.out, tag, [a for a in args.extra if a != "--"])
    final = report["ladder"]["final"]
    ab = run_ab(args.model, args.hand, final, args.pairs, args.out, tag)
    ratios = ", ".join(f"{p['phase']} {p['ratio']['estimate']:.3f} [{p['ratio']['low']:.3f}, {p['ratio']['high']:.3f}]"
                       for p in ab["phases"])
    print(f"{tag}: triage {report['wall_s']:.0f} s wall, final {final}; triage/hand {ratios}; ab {ab['verdict']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
