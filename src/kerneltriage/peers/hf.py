"""The Hugging Face transformers peers, on the same weights, prompt tokens and lengths as kerneltriage.

- `hf`: transformers eager. A GGUF is loaded by transformers itself (`gguf_file=`), a HF folder with
  `from_pretrained`, a preset (random weights) with `from_config` and OUR weights copied in.
  pp: one forward of N tokens over a cache holding the d-token prefix, with `logits_to_keep=1` (what
  `generate` passes); tg: `generate` for N + 1 tokens after the prefix, a streamer stamping each token.
- `hf-static`: the same `generate` with `cache_implementation="static"`, which compiles the decode step
  by itself (CUDA only; the first call compiles for about a minute). Its prefill is not compiled, so
  pp tests are left to `hf`.

EOS is ignored, as in every token loop under test. Torch-only: the runner's weights are copied for presets. It
asks the runner only what the engine's protocol declares (`engine/backend.py`: its checkpoint, device, dtype,
weights by name, synchronized clock and peak memory): transformers shares the runner's device and clock.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import inspect
import io
import time
from pathlib import Path
from typing import Any, Callable

import torch

from kerneltriage.bench.compare import NOT_INSTALLED, PeerRun
from kerneltriage.bench.harness import Sample
from kerneltriage.bench.workloads import Test, Tokens
from kerneltriage.engine.backend import Runner

# config.json keys a built config is not given: what it is (its class says) and the special tokens (EOS is ignored)
_NOT_PASSED = ("model_type", "architectures", "bos_token_id", "eos_token_id")

# ---- Hugging Face transformers ----------------------------------------------------------------------

def _hf_config(runner: Runner) -> Any:
    """transformers' config of the runner's model: ours as config.json spells it (ModelConfig.to_hf)."""
    import transformers

    config = runner.config
    hf = {key: value for key, value in config.to_hf().items() if key not in _NOT_PASSED}
    if config.architecture.attention_bias:
        hf.pop("attention_bias")  # biased always: its config has no switch for it
    return getattr(transformers, config.architecture.hf_config)(**hf)


def load_hf(runner: Runner) -> torch.nn.Module:
    """The same model in transformers, on the runner's device and dtype."""
    import transformers
    from transformers import AutoModelForCausalLM

    transformers.logging.set_verbosity_error()  # its notices and tqdm bars would break our progress bar
    transformers.logging.disable_progress_bar()
    source, device, dtype = Path(runner.checkpoint.source), torch.device(runner.device), getattr(torch, runner.dtype)
    if runner.config.random_weights:
        with device:
            model = AutoModelForCausalLM.from_config(_hf_config(runner), dtype=dtype)
        _copy_our_weights(model, runner)
    elif source.suffix == ".gguf":
        with contextlib.redirect_stderr(io.StringIO()):  # its GGUF converter's own tqdm bar ignores the above
            model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
    model = model.to(device).eval()
    model.generation_config.eos_token_id = None  # EOS ignored: always N tokens
    model.generation_config.pad_token_id = 0
    return model


def _copy_our_weights(model: torch.nn.Module, runner: Runner) -> None:
    """HF names are ours under `model.` (lm_head stays top-level); every HF tensor must find its twin."""
    ours = runner.named_weights()
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            source = ours.get(name.removeprefix("model."))
            if source is None or source.shape != tensor.shape:
                raise RuntimeError(f"hf peer: no weight of shape {tuple(tensor.shape)} for {name}")
            tensor.copy_(source)


def _cache_kwarg(model: torch.nn.Module) -> str:
    """transformers 5.2x calls the cache argument `cache`; earlier releases `past_key_values`."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _output_cache(out: Any) -> Any:
    cache = getattr(out, "cache", None)
    return cache if cache is not None else getattr(out, "past_key_values", None)


@torch.no_grad()
def _hf_prefill_sample(model: torch.nn.Module, tokens: Tokens, runner: Runner) -> Sample:
    """Forward of the prompt over a fresh cache holding the prefix (filled untimed)."""
    cache, device = None, torch.device(runner.device)
    if tokens.prefix:
        prefix = torch.tensor([tokens.prefix], device=device)
        cache = _output_cache(model(prefix, use_cache=True, logits_to_keep=1))
    prompt = torch.tensor([tokens.prompt], device=device)
    start = runner.clock()
    out = model(prompt, use_cache=True, logits_to_keep=1, **{_cache_kwarg(model): cache})
    prefilled = runner.clock()
    int(out.logits[0, -1].argmax())
    return Sample(prefilled - start, time.perf_counter() - start)


class StreamStamps:
    """A `generate` streamer noting when each put arrives: the prompt first, then every new token (a CPU
    tensor, so the device work behind it is done)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.tokens: list[int] = []

    def put(self, value: torch.Tensor) -> None:
        self.times.append(time.perf_counter())
        if len(self.times) > 1:
            self.tokens += value.reshape(-1).tolist()

    def end(self) -> None:
        pass


def _hf_decode_sample(model: torch.nn.Module, tokens: Tokens, count: int, runner: Runner, static: bool) -> Sample:
    ids = torch.tensor([tokens.prefix], device=torch.device(runner.device))
    stamps = StreamStamps()
    extra = {"cache_implementation": "static"} if static else {}
    start = runner.clock()
    model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=count + 1, do_sample=False,
                   streamer=stamps, **extra)
    if len(stamps.times) != count + 2:
        raise RuntimeError(f"hf generate streamed {len(stamps.times) - 1} tokens, expected {count + 1}")
    first, last = stamps.times[1], stamps.times[-1]
    return Sample(last - first, first - start, tuple(stamps.tokens))


def open_hf(name: str, runner: Runner) -> PeerRun:
    """`hf` or `hf-static` loaded beside the runner, or why it cannot run."""
    if importlib.util.find_spec("transformers") is None:
        return PeerRun(name, unavailable=NOT_INSTALLED)
    if name == "hf-static" and runner.device_type != "cuda":
        return PeerRun(name, unavailable="needs CUDA", note="its compiled decode step replays CUDA graphs")
    engine = HFEngine(name, load_hf(runner), runner)
    return PeerRun(name, engine=engine, note=f"attention {engine.params['attention']}")


class HFEngine:
    """transformers eager (`hf`) or its static-cache generate, compiled on the first call (`hf-static`)."""

    def __init__(self, name: str, model: torch.nn.Module, runner: Runner) -> None:
        self.name, self.model, self.runner = name, model, runner  # the runner: its device, clock and memory
        self.static = name == "hf-static"
        self.params = {"attention": model.config._attn_implementation}
        self.before = 0

    def supports(self, test: Test) -> str | None:
        # generate compiles the decode step only: a static-cache prefill is hf's eager prefill
        return "n/a: prefill is hf's" if self.static and test.kind == "pp" else None

    def prepare(self, test: Test, tokens: Tokens) -> Callable[[], Sample]:
        if test.kind == "pp":
            return lambda: _hf_prefill_sample(self.model, tokens, self.runner)
        return lambda: _hf_decode_sample(self.model, tokens, test.n, self.runner, self.static)

    def start_memory(self) -> None:
        if self.runner.device_type == "cuda":
            self.runner.synchronize()
            self.runner.reset_peak_memory()
            self.before = torch.cuda.memory_allocated(torch.device(self.runner.device))

    def peak_memory(self) -> int | None:
        """CUDA: its weights + the warm-ups' transient peak (caches, activations); CPU: not reported."""
        if self.runner.device_type != "cuda":
            return None
        tensors = (*self.model.parameters(), *self.model.buffers())
        resident = sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())
        return resident + self.runner.peak_memory() - self.before

    def close(self) -> None:
        del self.model
        gc.collect()
        if self.runner.device_type == "cuda":
            torch.cuda.empty_cache()
