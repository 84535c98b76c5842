"""Lookup drafters replayed over the target's own greedy text, on the host: the real speculative decoder (its
controller, shadows, drafters and padding) driven over a recorded text, each step priced on a virtual clock at a
step's measured cost on the device — how often it drafts, what verifies accept (by position), tokens per verify and
the speed-up those give, judged without a device (the text is the model's, the costs are the H200's).

Why: speculation's speed is drafts × verify cost; the second is the device's (spec_profile.py;
docs/journal.md has the verify costs by rows), the first is the text's, the drafter's and the controller's, the
same on any device for the same tokens.
The target here answers every context with the recorded text's next token (one-hot logits: greedy acceptance is the
decoder's own), and its clock advances by a plain step's price (1) at each decode and by the padded shape's price at
each verify; the decoder times its steps with that clock, so auto depth decides from those prices, as on the device.
The prompts of a set run one after another on one target, so the controller carries its costs from one to the next
as it does in an A/B's runs.

    python3 benchmarks/tools/draft_replay.py --texts ~/.cache/kerneltriage/replay-texts.json   # greedy texts, once
    python3 benchmarks/tools/draft_replay.py --texts FILE --sources suffix,ngram --verify-costs 16:1.43,32:1.6 \
        --out r.json

The texts come from the CPU in float32 (greedy; an H200 in bf16 writes mostly the same text; --dtype bfloat16 for bf16
ones: 11 of copy_heavy's 16 continuations and 7 of repetitive's 11 equal the float32 ones). --verify-costs: a verify
step's cost in plain steps as the loop sees it, for each padded shape (rows): the H200's loop saw a 16-row verify
step at 1.43 plain steps (spec-profile-repetitive-h200-split.json's verify_ms_mean / plain_ms_mean); a 32-row one
costs 16% more on the device (verify-rows-smollm2-preset-h200.json), ~1.62 with the host's share.

--passes N replays the set N times in a row on one decoder (as `ab`'s samples of a side run it, the controller's state
carried from pass to pass), each pass's steps and time reported; --step-times TRACE prices each resident step at a
draw from the device's own step times of its rows (a spec_profile.py trace's resident steps, over its plain steps'
median; seeded) instead of a fixed price; --reprobe-steps sets the controller's REPROBE_STEPS (a what-if).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from collections import Counter
from pathlib import Path

import torch

from kerneltriage.backends.torch.acceptance import greedy_accept
from kerneltriage.backends.torch.sampling import TorchSampler
from kerneltriage.core.environment import capture_environment
from kerneltriage.core.errors import InputError
from kerneltriage.engine.sampling import SamplingParams
from kerneltriage.engine.speculative import controller
from kerneltriage.engine.speculative.config import VERIFY_BUCKETS, parse_speculation
from kerneltriage.engine.speculative.decoder import SpeculativeDecoder
from kerneltriage.engine.speculative.lookup import lookup_drafter
from kerneltriage.engine.speculative.ngram import NgramIndex
from kerneltriage.engine.speculative.resident import CHOICES, DONE, device_choice

PROMPTS = Path(__file__).resolve().parents[1] / "prompts"
SETS = ("copy_heavy", "repetitive", "summarize", "open_ended")
DEFAULT_COSTS = "16:1.43,32:1.62"


class _Read:
    def __init__(self, token: torch.Tensor) -> None:
        self.value = int(token)

    def result(self) -> int:
        return self.value


class _Queued:
    """A resident step's tokens; reading them advances the clock by the step's price (steps run back to back)."""

    def __init__(self, target: "ReplayTarget", emitted: list[int], matched: int, rows: int, cost: float) -> None:
        self.target, self.emitted, self.matched, self.rows, self.cost = target, emitted, matched, rows, cost

    def result(self) -> tuple[list[int], int, int]:
        self.target.now, self.cost = self.target.now + self.cost, 0.0
        self.target.in_flight -= 1
        return self.emitted, self.matched, self.rows


class ReplayTarget:
    """The steps a speculative decoder drives, over recorded greedy text: after the true text so far plus any
    tokens, the target's choice is the text's next token when those tokens are the text's too (else token 0), as
    one-hot logits; a decode advances the clock by 1, a verify by its rows' price (`costs`; `flat` for all). With
    `resident` costs, steps run resident (as `one_sync` runs them on a graphed runner): each chooses and drafts as the
    device does (resident.device_choice; the latest longest match of up to `lookback` tokens: NgramIndex's rule) and
    costs its rows' price there (a plain one `resident[1]`, 1 when not given), nothing where the text is complete
    (DONE), or a draw from `draws[rows]` where given; one queued with none in flight first costs `gap` (the device
    waited for the host to queue it)."""

    cache_capacity = 1 << 30

    def __init__(self, costs: dict[int, float], padded: bool, vocab: int, resident: dict[int, float] | None = None,
                 gap: float = 0.0, draws: dict[int, list[float]] | None = None) -> None:
        self.costs, self.pads_verify, self.vocab = costs, padded, vocab
        self.resident_costs, self.resident, self.gap = resident, resident is not None, gap
        self.draws, self.rng = draws, random.Random(0)
        self.counters: Counter = Counter()
        self.now, self.text, self.device, self.lookback, self.in_flight = 0.0, [], [], 0, 0

    def prepare_steps(self, start: int, end: int, rows: list[int], lookback: int = 0) -> None:
        """Nothing to capture: the replay's steps cost their price whenever they run."""

    def begin_resident(self, context: list[int], lookback: int) -> None:
        self.device, self.lookback = list(context), lookback

    def queue_step(self, reach: int, limits: tuple[int, int, int]) -> _Queued:
        choice, matched = device_choice(self.device, self.lookback, limits)
        if choice == DONE:  # queued past the text's end: no body runs (~5 µs on the H200: free here)
            self.in_flight += 1
            return _Queued(self, [], matched, 0, 0.0)
        rows = CHOICES[choice]
        index = NgramIndex(self.lookback)
        index.extend(self.device)
        drafts = (index.propose(rows - 1) or self.device[-1:] * (rows - 1)) if rows > 1 else []
        emitted = greedy_accept(self._rows(len(self.device) - 1, [self.device[-1], *drafts]), drafts)
        self.device += emitted
        self.now += self.gap if not self.in_flight else 0.0
        self.in_flight += 1
        cost = self.rng.choice(self.draws[rows]) if self.draws else self.resident_costs.get(rows, 1.0)
        return _Queued(self, emitted, matched, rows, cost)

    def start(self, prompt: list[int], continuation: list[int]) -> torch.Tensor:
        """A new prompt: the prefill's logits (its token is the continuation's first)."""
        self.text = list(prompt) + list(continuation)
        return self._rows(len(prompt) - 1, [prompt[-1]])[-1:]

    def _rows(self, start: int, tokens: list[int]) -> torch.Tensor:
        """One-hot rows (T, V): row i is the choice after text[:start] + tokens[:i + 1]."""
        rows = torch.zeros(len(tokens), self.vocab)
        for i in range(len(tokens)):
            at = start + i + 1
            if at >= len(self.text) or tokens[i] != self.text[at - 1]:
                break  # the tokens left the text: token 0 from here on
            rows[i, self.text[at]] = 1.0
        rows[(rows.sum(-1) == 0), 0] = 1.0
        return rows

    def decode(self, token: int | torch.Tensor, position: int) -> torch.Tensor:
        self.now += 1.0
        return self._rows(position, [int(token)])

    def verify(self, last: int, drafts: list[int], start: int, rows: int) -> torch.Tensor:
        self.now += self.costs[rows] if rows else self.costs["flat"]
        return self._rows(start, [last, *map(int, drafts)])

    def verify_tree(self, last: int, tree, start: int) -> torch.Tensor:
        """A token tree's rows at the price of the smallest shape that holds them: row r is the choice after node
        r's path (the root's row first)."""
        rows = tree.size + 1
        self.now += self.costs[min(r for r in self.costs if r != "flat" and r >= rows)]
        out = torch.zeros(rows, self.vocab)
        for node in range(rows):
            out[node] = self._rows(start, [last, *(tree.tokens[n - 1] for n in tree.lineage(node)[1:])])[-1]
        return out

    def keep_branch(self, start: int, path: list[int]) -> None:
        pass

    def trim_cache(self, length: int) -> None:
        pass

    def read_later(self, token: torch.Tensor) -> _Read:
        return _Read(token)

    def clock(self) -> float:
        return self.now


def replay(source: str, depth: str | None, texts: list[list[list[int]]], costs: dict, padded: bool,
           resident: dict[int, float] | None = None, gap: float = 0.0, passes: int = 1,
           draws: dict[int, list[float]] | None = None) -> dict[str, object]:
    """The decoder's run over each recorded (prompt, continuation) in turn on one target, `passes` times: its stats
    and the modelled speed-up (tokens after the first / the virtual time, in plain steps); with `resident` costs, its
    verifies resident (queued ahead, drafted and accepted on the device), `gap` the device's wait for one queued
    with none in flight, `draws` the resident steps' prices drawn by rows. Several passes: each one's steps and
    time too (`passes`)."""
    speculation = parse_speculation(source, depth)
    decoder = SpeculativeDecoder(speculation, lookup_drafter(speculation), queue_ahead=resident is not None)
    vocab = 1 + max(max(p + t) for p, t in texts)
    target = ReplayTarget(costs, padded, vocab, resident, gap, draws)
    decoder.host_clock = target.clock
    tokens, elapsed, each = 0, 0.0, []
    for _ in range(passes):
        began, before = target.now, decoder.total.brief()
        for prompt, continuation in texts:
            first = target.start(prompt, continuation)
            out = list(decoder(target, first, len(prompt), len(continuation),
                               TorchSampler(SamplingParams(), prompt, torch.device("cpu"))))
            if out != continuation:
                raise RuntimeError("replay: the decoder's tokens left the recorded text (greedy acceptance broke)")
            tokens += len(continuation) - 1
        elapsed += target.now - began
        after = decoder.total.brief()
        each.append({"time": round(target.now - began, 2),
                     **{key: after[key] - before[key] for key in ("plain_steps", "verify_steps")}})
    stats = decoder.total.brief()
    found = {"plain_steps": stats["plain_steps"], "verify_steps": stats["verify_steps"], "tokens": tokens,
             "tokens_per_verify": stats["tokens_per_verify_step"],
             "acceptance_by_position": [round(a, 3) for a in stats["acceptance_by_position"]],
             "modelled_speedup": tokens / elapsed}
    return found | ({"passes": each} if passes > 1 else {})


def step_draws(path: str, shapes: list[int]) -> dict[int, list[float]]:
    """Each shape's resident step times in a spec_profile.py trace, over its plain steps' median (ValueError naming
    what is missing)."""
    steps = json.loads(Path(path).expanduser().read_text()).get("resident_steps") or []
    by_rows = {rows: [step["us"] for step in steps if step["rows"] == rows] for rows in shapes}
    missing = [rows for rows, times in by_rows.items() if not times]
    if missing:
        raise ValueError(f"no resident steps of {','.join(map(str, missing))} rows")
    plain = statistics.median(by_rows[1])
    return {rows: [us / plain for us in times] for rows, times in by_rows.items()}


def greedy_texts(model: str, sets: list[str], count: int, dtype: str = "float32") -> dict[str, object]:
    """{"model", "n", "dtype", "sets": {set: [[prompt tokens, greedy continuation], …]}} from the CPU in `dtype`."""
    from kerneltriage.bench.harness import prompts_sample
    from kerneltriage.bench.workloads import load_prompt_set
    from kerneltriage.engine.backend import get_backend
    from kerneltriage.engine.configuration import RunConfig
    from kerneltriage.engine.sources import load_checkpoint

    checkpoint = load_checkpoint(model)
    runner = get_backend("torch").build(checkpoint, RunConfig.parse("levers=last_logits", "--config"), "cpu", dtype)
    texts: dict[str, list[list[list[int]]]] = {}
    for name in sets:
        prompts = load_prompt_set(PROMPTS / f"{name}.jsonl", checkpoint.tokenizer).prompts
        texts[name] = [[list(p), list(prompts_sample(runner, [p], count).tokens)] for p in prompts]
        print(f"{name}: {len(prompts)} greedy texts", flush=True)
    return {"model": model, "n": count, "dtype": dtype, "sets": texts}


def parse_costs(text: str, any_shapes: bool = False) -> dict[int, float]:
    """`16:1.43,32:1.62` → {16: 1.43, 32: 1.62}: every padded shape's verify step in plain steps (those of
    config.VERIFY_BUCKETS — and a plain step's, 1:…, optionally — or with `any_shapes` any ascending set ending at 32
    rows at most)."""
    costs = {}
    for item in text.split(","):
        rows, colon, cost = item.partition(":")
        if not (colon and rows.isdigit() and cost.replace(".", "", 1).isdigit()):
            raise ValueError(item)
        costs[int(rows)] = float(cost)
    if set(costs) - {1} != set(VERIFY_BUCKETS) and not (any_shapes and 1 < min(costs) and max(costs) <= 32):
        raise ValueError(f"shapes {sorted(costs)}")
    return costs


def pad_to(shapes: tuple[int, ...]) -> None:
    """What if verifies were padded to `shapes` instead of config.VERIFY_BUCKETS: the decoder's padding and the
    suffix drafter's free tokens read them (this process only)."""
    from kerneltriage.engine.speculative import config, suffix

    config.VERIFY_BUCKETS = suffix.VERIFY_BUCKETS = shapes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default")
    parser.add_argument("--sets", default=",".join(SETS))
    parser.add_argument("-n", type=int, default=64, help="greedy tokens per prompt (default 64, as the H200 runs)")
    parser.add_argument("--texts", required=True, help="the greedy texts' JSON: written when missing, else read")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="the dtype the CPU writes "
                        "missing texts in (default float32; the H200's runs are bf16, whose text differs in places)")
    parser.add_argument("--sources", default="suffix,ngram", help="lookup sources, as --spec takes them")
    parser.add_argument("--depth", default=None, help="as --spec-depth takes it (default auto)")
    parser.add_argument("--verify-costs", default=DEFAULT_COSTS, help="a verify step in plain steps for each padded "
                        f"shape, ROWS:COST,… (default {DEFAULT_COSTS})")
    parser.add_argument("--other-shapes", action="store_true", help="pad verifies to --verify-costs' shapes "
                        f"instead of the decoder's ({','.join(map(str, VERIFY_BUCKETS))}): a what-if")
    parser.add_argument("--resident", default=None, metavar="COSTS", help="steps resident on the device (one_sync "
                        "under graphs: queued ahead, chosen, drafted and accepted there), each padded shape priced at "
                        "ROWS:COST,… plain steps (the device's step alone: e.g. 1:1.02,16:1.27,32:1.64; a plain one "
                        "1 unless given)")
    parser.add_argument("--host-gap", type=float, default=0.0, help="with --resident: plain steps the device waits "
                        "for the host to queue a step when none is in flight (default 0)")
    parser.add_argument("--eager", action="store_true", help="verifies of k + 1 rows (no graphs): a draft's length "
                        "costs rows (the drafters' length rules apply), each verify priced at --verify-cost")
    parser.add_argument("--verify-cost", type=float, default=1.9, help="with --eager: a verify step in plain steps")
    parser.add_argument("--passes", type=int, default=1, help="the set replayed this many times in a row on one "
                        "decoder (ab's samples), each pass reported")
    parser.add_argument("--step-times", default=None, metavar="TRACE", help="with --resident: each resident step "
                        "priced at a draw from the device's own step times of its rows (spec_profile.py's JSON)")
    parser.add_argument("--reprobe-steps", type=int, default=None, help="the controller's REPROBE_STEPS (default "
                        f"{controller.REPROBE_STEPS}): a what-if")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.passes < 1:
        parser.error(f"--passes {args.passes}: expected 1 or more")
    if args.reprobe_steps is not None:
        if args.reprobe_steps < 1:
            parser.error(f"--reprobe-steps {args.reprobe_steps}: expected 1 or more")
        controller.REPROBE_STEPS = args.reprobe_steps
    try:
        costs = {"flat": args.verify_cost} if args.eager else parse_costs(args.verify_costs, args.other_shapes)
    except ValueError as exc:
        shapes = "shapes of 2..32 rows" if args.other_shapes else f"padded shapes {','.join(map(str, VERIFY_BUCKETS))}"
        parser.error(f"--verify-costs {args.verify_costs}: {exc} is not ROWS:COST for each of the {shapes}")
    if args.other_shapes and not args.eager:
        pad_to(tuple(sorted(costs)))
    try:
        resident = parse_costs(args.resident) if args.resident else None
    except ValueError as exc:
        parser.error(f"--resident {args.resident}: {exc} is not ROWS:COST for each of the padded shapes "
                     f"{','.join(map(str, VERIFY_BUCKETS))}")
    if resident and args.eager:
        parser.error("--resident with --eager: resident steps are graphed (padded); drop one")
    draws = None
    if args.step_times:
        if not resident:
            parser.error(f"--step-times {args.step_times}: prices resident steps; add --resident")
        try:
            draws = step_draws(args.step_times, list(CHOICES))
        except (OSError, ValueError) as exc:  # (json's errors are ValueErrors)
            parser.error(f"--step-times {args.step_times}: {exc}; expected a spec_profile.py JSON with one_sync")
    sets = args.sets.split(",")
    unknown = [name for name in sets if not (PROMPTS / f"{name}.jsonl").is_file()]
    if unknown:
        parser.error(f"--sets {args.sets}: no prompt set {','.join(unknown)}; expected names of "
                     f"benchmarks/prompts/*.jsonl ({','.join(SETS)}, …)")
    for source in args.sources.split(","):
        try:
            lookup = lookup_drafter(parse_speculation(source, args.depth))
        except InputError as exc:
            parser.error(f"--sources {source} --depth {args.depth}: {exc}")
        if lookup is None:
            parser.error(f"--sources {source}: not a lookup source; expected ngram[:N] or suffix[:N]")
    texts = load_texts(parser, args, sets)
    result = {"benchmark": "draft-replay", "model": args.model, "depth": args.depth or "auto", "verify_costs": costs,
              "resident_costs": resident, "host_gap": args.host_gap, "other_shapes": args.other_shapes,
              "padded": not args.eager, "texts": {name: len(texts[name]) for name in sets}, "sets": {},
              "passes": args.passes, "step_times": args.step_times, "reprobe_steps": controller.REPROBE_STEPS,
              "environment": capture_environment()}
    for name in sets:
        for source in args.sources.split(","):
            found = result["sets"].setdefault(name, {})[source] = replay(
                source, args.depth, texts[name], costs, not args.eager, resident, args.host_gap, args.passes, draws)
            print(f"{name:11s} {source:14s} plain {found['plain_steps']:4d} verify {found['verify_steps']:4d} "
                  f"tok/verify {found['tokens_per_verify']:.2f} modelled {found['modelled_speedup']:.2f}x  "
                  f"{found['acceptance_by_position'][:4]}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))


def load_texts(parser: argparse.ArgumentParser, args: argparse.Namespace, sets: list[str]) -> dict:
    """The greedy texts of `sets`: read from --texts, or written there first."""
    path = Path(args.texts).expanduser()
    if not path.exists():
        stored = greedy_texts(args.model, sets, args.n, args.dtype)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(stored))
        return stored["sets"]
    stored = json.loads(path.read_text())
    missing = [name for name in sets if name not in stored.get("sets", {})]
    if missing or (stored.get("model"), stored.get("n")) != (args.model, args.n):
        parser.error(f"--texts {path}: holds {stored.get('model')}'s {stored.get('n')} tokens for "
                     f"{','.join(stored.get('sets', {}))}; expected {args.model}'s {args.n} for {args.sets} "
                     f"(another file, or remove it to write it again)")
    return stored["sets"]


if __name__ == "__main__":
    main()
