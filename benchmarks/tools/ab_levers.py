"""Each lever alone (B) against stock (A) or a base set, under the one verdict rule: one `kerneltriage ab` each.

Usage: python benchmarks/tools/ab_levers.py --model default --out DIR [-p 512 -n 32 -r 5]
           [--candidates "levers=last_logits|levers=graphs|levers=graphs;spec=selfdraft:15;depth=4@levers=graphs"]
       python benchmarks/tools/ab_levers.py --table DIR ...   (only print the markdown table of results already in DIRs)
A candidate is an ab spec for B, optionally followed by '@' and the spec of its A (default: stock).
Each ab run writes DIR/ab-<model>-<n>.json (the full JSON of `kerneltriage ab --output json`, all samples, the
environment) into one ledger; the markdown table of every run is printed at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import sys
from pathlib import Path

from kerneltriage.core.ledger import default_ledger_path

import torch

from kerneltriage.cli.main import main as kerneltriage
from kerneltriage.engine.levers import parse_setting

CANDIDATES = "|".join(f"levers={name}" for name in (
    "last_logits", "one_sync", "packed_qkv", "packed_gate_up", "fused_norm", "sdpa_backend=flash",
    "sdpa_backend=efficient", "sdpa_backend=cudnn", "sdpa_backend=math", "graphs", "compile=default"))


def run(model: str, candidate: str, args: argparse.Namespace, path: Path) -> None:
    b, _, a = candidate.partition("@")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        kerneltriage(["ab", "--model", model, "--a", a or "levers=", "--b", b, "-p", str(args.prompt),
                      "-n", str(args.gen), "-r", str(args.pairs), "--output", "json", "--ledger", str(args.ledger)])
    path.write_text(out.getvalue())
    gc.collect()  # the levers' closures hold cycles back to their runners: free three models before the next
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def row(result: dict) -> str:
    """| B (vs A) | question | prefill B/A [CI] (band) | decode B/A [CI] (band) | verdict |"""
    config = result["config"]
    b, a = config["b"], config["a"]
    name = " + ".join(filter(None, [",".join(lv for lv in b["levers"] if lv not in a["levers"]),
                                    f"spec {b['spec']}" if b.get("spec") else ""]))
    base = f" (A: {','.join(a['levers'])})" if a["levers"] else ""
    questions = sorted({parse_setting(lv).lever.question for lv in b["levers"] if lv not in a["levers"]}
                       | ({"dispatch"} if b.get("spec") else set()))
    cells = {p["phase"]: f"{p['ratio']['estimate']:.2f} [{p['ratio']['low']:.2f}, {p['ratio']['high']:.2f}] "
                         f"(±{p['band']:.2f})" for p in result["phases"]}
    return (f"| `{name}`{base} | {', '.join(questions)} | {cells.get('prefill', '—')} | {cells.get('decode', '—')} "
            f"| {result['verdict']} |")


def table(directories: list[Path]) -> str:
    lines = ["| model | lever (B vs A) | question | prefill B/A [CI] (A/A band) | decode B/A [CI] (band) "
             "| verdict |", "|---|---|---|---|---|---|"]
    for directory in directories:
        for path in sorted(directory.glob("ab-*.json"), key=lambda p: (len(p.stem), p.stem)):
            try:
                result = json.loads(path.read_text())
            except ValueError:
                lines.append(f"| {path.name} | (no result: the run failed or was cut off) | | | | |")
                continue
            lines.append(f"| {result['config']['model']} " + row(result))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default")
    parser.add_argument("--candidates", default=CANDIDATES, help="B specs split on '|' (default: every lever)")
    parser.add_argument("-p", dest="prompt", type=int, default=512)
    parser.add_argument("-n", dest="gen", type=int, default=32)
    parser.add_argument("-r", dest="pairs", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--ledger", type=Path, default=default_ledger_path(),
                        help="ledger file (default: the user's, %(default)s)")
    parser.add_argument("--table", type=Path, nargs="+", help="print the table of these result folders and stop")
    args = parser.parse_args()
    if args.table:
        print(table(args.table))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    for n, candidate in enumerate(args.candidates.split("|")):
        print(f"ab {args.model}: {candidate}", file=sys.stderr, flush=True)
        path = args.out / f"ab-{n}.json"
        try:
            run(args.model, candidate, args, path)
            print(row(json.loads(path.read_text())), file=sys.stderr, flush=True)
        except Exception as exc:  # noqa: BLE001 - one failing candidate must not cost the rest their device time
            print(f"  failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    print(table([args.out]))


if __name__ == "__main__":
    main()
