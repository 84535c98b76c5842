"""fused_layer's tiles against each other, end to end. For each --set (constants of kernels/fused_layer.py, e.g.
QUANT_BK=1024,BN=8) the model is built afresh with --levers (fused_layer among them: graphs capture the tiles they
were built with), its decode timed by the bench harness (tg N at depth D: warm-ups, then R samples) and printed
beside the first setting's rate; --out writes the rows with the environment (git sha, dirty flag). The first --set
should be the defaults as they stand (an empty --set "" is exactly that). Speed only: the kernels' values are the
tests' business (tests/test_fused_layer.py, with the same constants monkeypatched).

    python benchmarks/tools/fused_tiles.py --model /tmp/llama3-8b-Q4_0.gguf \\
        --levers quantized,packed_qkv,packed_gate_up,fused_norm,fused_layer,pdl,last_logits,graphs,one_sync \\
        --set "" --set QUANT_BK=1024 --set QUANT_BK=1024,BN=8 --set DECODE_STAGES=2 --out FILE.json
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path


def _settings(texts: list[str], module: object) -> list[dict[str, int]]:
    """Each --set as {NAME: value}; a name that is no integer constant of the module, or a value that is no positive
    integer, is a ValueError naming it."""
    found = []
    for text in texts:
        setting = {}
        for item in filter(None, text.split(",")):
            name, _, value = item.partition("=")
            if not isinstance(getattr(module, name, None), int) or not name.isupper():
                raise ValueError(f"--set {text!r}: {name!r} is no integer constant of kernels/fused_layer.py "
                                 "(e.g. BN, QUANT_BK, DECODE_BK, DECODE_STAGES, TILE)")
            if not value.isdigit() or int(value) < 1:
                raise ValueError(f"--set {text!r}: {name}={value!r}: expected a positive integer")
            setting[name] = int(value)
        found.append(setting)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default", help="a --model value: a GGUF, a folder, a preset, default")
    parser.add_argument("--levers", required=True, help="the lever set, fused_layer among them")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="NAME=V[,NAME=V]",
                        help="fused_layer constants for one run (repeatable; \"\": the defaults)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("-n", type=int, default=128, help="tokens decoded a sample (default 128)")
    parser.add_argument("-d", "--depth", type=int, default=0, help="tokens in the cache first (default 0)")
    parser.add_argument("-r", "--repeats", type=int, default=5, help="timed samples a setting (default 5)")
    parser.add_argument("--out", type=Path, help="write the rows as JSON here")
    args = parser.parse_args()
    import torch

    from kerneltriage.bench.harness import Settings, run_test
    from kerneltriage.bench.workloads import Test
    from kerneltriage.core.environment import capture_environment
    from kerneltriage.core.errors import InputError
    from kerneltriage.engine.backend import get_backend
    from kerneltriage.engine.configuration import RunConfig
    from kerneltriage.engine.sources import load_checkpoint
    from kerneltriage.kernels import fused_layer

    try:
        settings = _settings(args.sets or [""], fused_layer)
        if min(args.n, args.repeats) < 1 or args.depth < 0:
            raise ValueError(f"-n {args.n} -r {args.repeats} -d {args.depth}: expected n, r ≥ 1 and d ≥ 0")
        config = RunConfig.from_flags(args.levers)
        if not config.has("fused_layer"):
            raise ValueError(f"--levers {args.levers!r}: expected fused_layer among them (its tiles are what varies)")
        backend = get_backend("torch")
        device = backend.resolve_device(args.device)
        dtype = backend.resolve_dtype(args.dtype, device)
        checkpoint = load_checkpoint(args.model)
    except (InputError, ValueError) as exc:
        print(f"fused_tiles: {exc}", file=sys.stderr)
        return 2
    defaults = {name: getattr(fused_layer, name) for setting in settings for name in setting}
    rows = []
    for setting in settings:
        for name, value in defaults.items():
            setattr(fused_layer, name, setting.get(name, value))
        try:
            runner = backend.build(checkpoint, config, device, dtype)
        except InputError as exc:
            print(f"fused_tiles: {exc}", file=sys.stderr)
            return 2
        timed = run_test(runner, Test("tg", args.n, args.depth), Settings(args.repeats)).timed
        row = {"set": setting, "tok_s": timed.rate, "iqr_s": timed.iqr, "samples_s": list(timed.samples)}
        rows.append(row)
        label = ",".join(f"{k}={v}" for k, v in setting.items()) or "(defaults)"
        print(f"{label:>40}  {row['tok_s']:9.1f} tok/s  {row['tok_s'] / rows[0]['tok_s']:6.3f}× the first")
        del runner
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # the next build's weights where these were
    for name, value in defaults.items():
        setattr(fused_layer, name, value)
    report = {"model": args.model, "levers": args.levers, "device": device, "dtype": dtype, "test": f"tg{args.n}"
              f" @ d{args.depth}", "repeats": args.repeats, "rows": rows, "environment": capture_environment()}
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
