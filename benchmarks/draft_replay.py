"""Lookup drafters replayed over the target's own greedy text, on the host: how often each drafts, what a verify
would accept (by position) and tokens per verify, and the speed-up those give at a verify step's measured cost — a
drafter's policy judged without a device (the text is the model's, the costs are the H200's).

Why: speculation's speed is drafts × verify cost; the second is the device's (spec_profile.py), the first is
the text's and the drafter's, the same on any device for the same tokens. Replaying the decoder's policy (auto depth
always on: a lookup drafts after every token of a plain run and the run ends one token after it finds a draft; each
verify drafts k and emits the accepted prefix + one token) over one greedy text per prompt shows a drafter change
in seconds.

    python3 benchmarks/draft_replay.py --texts ~/.cache/kerneltriage/replay-texts.json   # greedy texts, once
    python3 benchmarks/draft_replay.py --texts FILE --sources suffix,ngram -k 15 --verify-cost 1.9 --out r.json

The texts come from the CPU in float32 (greedy; an H200 in bf16 writes mostly the same text). --verify-cost: a
verify step's cost in plain steps as the loop sees it (1.9–2.0 on the H200, spec-profile-repetitive-h200.json's
verify_ms_mean / plain_ms_mean at 16 graphed rows: every verify costs the same whatever k).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace

from kerneltriage.core.environment import capture_environment
from kerneltriage.core.errors import InputError
from kerneltriage.engine.speculative.config import AUTO_MAX_DEPTH, PADDED_MAX_DEPTH, parse_speculation
from kerneltriage.engine.speculative.lookup import lookup_drafter

PROMPTS = Path(__file__).parent / "prompts"
SETS = ("copy_heavy", "repetitive", "summarize", "open_ended")


def greedy_texts(model: str, sets: list[str], count: int) -> dict[str, object]:
    """{"model", "n", "sets": {set: [[prompt tokens, greedy continuation], …]}} from the CPU in float32."""
    from kerneltriage.bench.harness import prompts_sample
    from kerneltriage.bench.workloads import load_prompt_set
    from kerneltriage.engine.backend import get_backend
    from kerneltriage.engine.configuration import RunConfig
    from kerneltriage.engine.sources import load_checkpoint

    checkpoint = load_checkpoint(model)
    runner = get_backend("torch").build(checkpoint, RunConfig.parse("levers=last_logits", "--config"), "cpu",
                                        "float32")
    texts: dict[str, list[list[list[int]]]] = {}
    for name in sets:
        prompts = load_prompt_set(PROMPTS / f"{name}.jsonl", checkpoint.tokenizer).prompts
        texts[name] = [[list(p), list(prompts_sample(runner, [p], count).tokens)] for p in prompts]
        print(f"{name}: {len(prompts)} greedy texts", flush=True)
    return {"model": model, "n": count, "sets": texts}


def replay(source: str, prompt: list[int], text: list[int], k: int, padded: bool = True) -> dict[str, object]:
    """The decoder's steps over `text` (the first token is the prefill's): plain steps, verifies and what each
    verify accepted by position, had the drafter `source` drafted up to k at every verify (`padded`: on a runner
    whose verifies have the deepest k's rows, as graphs capture them)."""
    drafter = lookup_drafter(parse_speculation(source))
    drafter.reset(SimpleNamespace(pads_verify=padded), len(prompt) + len(text) + k)
    plain = verifies = 0
    reached, accepted = [0] * k, [0] * k
    t = 1
    while t < len(text):
        depth = min(k, len(text) - t - 1)
        draft = drafter.draft(prompt + text[:t], depth, None) if depth else None
        if draft is None:  # a plain run: until a draft exists after some token, and the step in flight after it
            plain, t = plain + 1, t + 1
            while t < len(text):
                found = drafter.draft(prompt + text[:t], k, None) is not None
                plain, t = plain + 1, t + 1
                if found:
                    break
            continue
        tokens = list(draft.tokens)
        hits = next((i for i, token in enumerate(tokens) if token != text[t + i]), len(tokens))
        for i in range(min(hits + 1, len(tokens))):
            reached[i] += 1
            accepted[i] += i < hits
        verifies, t = verifies + 1, t + hits + 1
    return {"plain": plain, "verifies": verifies, "tokens": len(text) - 1, "reached": reached, "accepted": accepted}


def summary(runs: list[dict[str, object]], verify_cost: float) -> dict[str, object]:
    plain, verifies, tokens = (sum(r[key] for r in runs) for key in ("plain", "verifies", "tokens"))
    reached = [sum(col) for col in zip(*(r["reached"] for r in runs))]
    accepted = [sum(col) for col in zip(*(r["accepted"] for r in runs))]
    return {"plain_steps": plain, "verify_steps": verifies, "tokens": tokens,
            "tokens_per_verify": (tokens - plain) / verifies if verifies else 0.0,
            "acceptance_by_position": [round(a / r, 3) if r else None for a, r in zip(accepted, reached)],
            "modelled_speedup": tokens / (plain + verify_cost * verifies)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default")
    parser.add_argument("--sets", default=",".join(SETS))
    parser.add_argument("-n", type=int, default=64, help="greedy tokens per prompt (default 64, as the H200 runs)")
    parser.add_argument("--texts", required=True, help="the greedy texts' JSON: written when missing, else read")
    parser.add_argument("--sources", default="suffix,ngram", help="lookup sources, as --spec takes them")
    parser.add_argument("-k", type=int, default=None, help="tokens drafted per verify at most (default: auto "
                        "depth's limit, 15 graphed, 8 with --eager)")
    parser.add_argument("--verify-cost", type=float, default=1.9, help="a verify step in plain steps (default 1.9)")
    parser.add_argument("--eager", action="store_true", help="verifies of k + 1 rows (no graphs): a draft's length "
                        "costs rows (the drafters' length rules apply; the model still charges --verify-cost)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    args.k = args.k or (AUTO_MAX_DEPTH if args.eager else PADDED_MAX_DEPTH)
    sets = args.sets.split(",")
    unknown = [name for name in sets if not (PROMPTS / f"{name}.jsonl").is_file()]
    if unknown:
        parser.error(f"--sets {args.sets}: no prompt set {','.join(unknown)}; expected names of "
                     f"benchmarks/prompts/*.jsonl ({','.join(SETS)}, …)")
    for source in args.sources.split(","):
        try:
            lookup = lookup_drafter(parse_speculation(source))
        except InputError as exc:
            parser.error(f"--sources {source}: {exc}")
        if lookup is None:
            parser.error(f"--sources {source}: not a lookup source; expected ngram[:N] or suffix[:N]")
    path = Path(args.texts).expanduser()
    if path.exists():
        stored = json.loads(path.read_text())
        missing = [name for name in sets if name not in stored.get("sets", {})]
        if missing or (stored.get("model"), stored.get("n")) != (args.model, args.n):
            parser.error(f"--texts {path}: holds {stored.get('model')}'s {stored.get('n')} tokens for "
                         f"{','.join(stored.get('sets', {}))}; expected {args.model}'s {args.n} for {args.sets} "
                         f"(another file, or remove it to write it again)")
    else:
        stored = greedy_texts(args.model, sets, args.n)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(stored))
    texts = stored["sets"]
    result = {"benchmark": "draft-replay", "model": args.model, "k": args.k, "verify_cost": args.verify_cost,
              "padded": not args.eager, "texts": {name: len(texts[name]) for name in sets}, "sets": {},
              "environment": capture_environment()}
    for name in sets:
        for source in args.sources.split(","):
            found = summary([replay(source, p, t, args.k, not args.eager) for p, t in texts[name]], args.verify_cost)
            result["sets"].setdefault(name, {})[source] = found
            print(f"{name:11s} {source:14s} plain {found['plain_steps']:4d} verify {found['verify_steps']:4d} "
                  f"tok/verify {found['tokens_per_verify']:.2f} modelled {found['modelled_speedup']:.2f}x  "
                  f"{found['acceptance_by_position'][:4]}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
