"""An EAGLE-style draft head (issue 14's trained drafter): one decoder layer over the target's own hidden states.

At position j the head takes the target's final-normed hidden state f_j (the input of its lm_head) and the embedding
of the token that followed, t_{j+1}, joins them through `fc` (2H → H), runs one decoder layer of the target's shapes
and a norm, and predicts f_{j+1}; the target's lm_head turns that into the logits of t_{j+2}. A draft of k tokens
feeds the features the target computed since the last draft (one forward over those rows; the head's own KV cache
keeps them) and then its own predictions, one row per token. Its positions are the target's, so RoPE is the target's.

The target shows its hidden states through `Model.observe_hidden`: a `FeatureStore` keeps each position's, by
position, on the device, from every forward (prefill, plain steps, verify rows — padded ones too; graph replays
write it as well). A verify's rows past the accepted tokens hold stale features until the next forward at those
positions rewrites them, and a draft reads only positions before the last emitted token, which every accepted
forward has written.

A head's file is safetensors (fc, the layer, the norm: the embedding and lm_head are the target's), with the
target's shapes in its metadata, checked on load. `distill --eagle` trains one (train/eagle.py).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from kerneltriage.backends.torch.cache import KVCache, Positions
from kerneltriage.backends.torch.models import Model
from kerneltriage.backends.torch.models.llama import RMSNorm, Step, sdpa_attention
from kerneltriage.backends.torch.runner import Runner
from kerneltriage.backends.torch.sampling import TorchSampler, draft_token
from kerneltriage.core.errors import InputError
from kerneltriage.engine.config import ModelConfig
from kerneltriage.engine.paths import cache_dir
from kerneltriage.engine.speculative.config import MAX_DEPTH
from kerneltriage.engine.speculative.draft import Draft

KIND = "kerneltriage-eagle-head"
SHAPE_KEYS = ("arch", "hidden_size", "intermediate_size", "num_heads", "num_kv_heads", "head_dim", "vocab_size")


def default_path(config: ModelConfig) -> Path:
    """Where `distill --eagle` writes the head of a model, and where `--spec eagle` looks for it."""
    return cache_dir() / "eagle" / f"{config.name or config.arch}.safetensors"


class EagleHead(nn.Module):
    """fc → one decoder layer → norm, over (feature, next token's embedding) pairs; the target's embedding, RoPE and
    lm_head are borrowed (held outside the module, so they are neither trained nor saved)."""

    def __init__(self, target: Model, device: torch.device | str | None = None) -> None:
        super().__init__()
        config = target.config.replace(num_layers=1)
        hidden = config.hidden_size
        self.config = config
        self.fc = nn.Linear(2 * hidden, hidden, bias=False, device=device)
        self.layer = type(target).BLOCK(config, device)
        self.norm = RMSNorm(hidden, config.rms_eps, device)
        self.borrowed = (target,)  # a tuple: not a submodule
        self.cache: KVCache | None = None

    @property
    def target(self) -> Model:
        return self.borrowed[0]

    def cache_shape(self, max_len: int) -> tuple[int, int, int, int, int]:
        attention = self.layer.self_attn
        return 1, 1, attention.num_kv_heads, max_len, attention.head_dim

    def forward(self, features: torch.Tensor, tokens: torch.Tensor, start: int) -> torch.Tensor:
        """Predicted features (1, T, H) of positions start+1… from features (1, T, H) of start… and the tokens (1, T)
        that followed each; fills the head's cache at start…"""
        x = self.fc(torch.cat([features, self.target.embed_tokens(tokens).to(features.dtype)], dim=-1))
        pos = self.cache.positions(start, tokens.shape[1])
        cos, sin = self.target.rope(pos.ids, x.dtype)
        x = self.layer(x, 0, Step(pos, cos, sin, self.cache, _uncached_plan_attention))
        return self.norm(x)

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        return self.target.logits(features)


def _uncached_plan_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: Positions) -> torch.Tensor:
    """The stock attention without cuDNN's: cuDNN plans per new shape, and after a run of plain steps each feed of the
    head has a new (rows, keys) shape — on the H200 such drafts took 137 ms (median) with cuDNN in the profile; that
    cuDNN's planning was the cause is likely, not verified (README, the EAGLE head)."""
    if not q.is_cuda:
        return sdpa_attention(q, k, v, pos)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
        return sdpa_attention(q, k, v, pos)


class FeatureStore:
    """`Model.observe_hidden` for a target with a head: each position's final-normed hidden state (S, H) by position,
    for the cache the target runs on (a new cache gets a new store, allocated by the first forward on it — a prefill,
    or a graph's eager warm-up, never inside a capture)."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self.cache: KVCache | None = None
        self.features: torch.Tensor | None = None

    def __call__(self, hidden: torch.Tensor, pos: Positions) -> None:
        cache = self.model.cache
        if cache is not self.cache:
            if hidden.is_cuda and torch.cuda.is_current_stream_capturing():
                raise RuntimeError("FeatureStore: a new cache was first run inside a CUDA graph capture")
            self.cache = cache
            self.features = torch.zeros(cache.max_len, hidden.shape[-1], dtype=hidden.dtype, device=hidden.device)
        self.features.index_copy_(0, pos.ids, hidden[0])


class EagleDrafter:
    """The head as a drafter: features from the target's store, its own cache kept for the true features' rows."""

    shadows = False  # each draft is forwards of the head: nothing to score for free during plain steps

    def __init__(self, runner: Runner, head: EagleHead) -> None:
        self.runner, self.head = runner, head
        self.store = FeatureStore(runner.model)
        runner.model.observe_hidden = self.store
        self.valid = 0  # the head's cache holds true features' rows for positions < valid

    def reset(self, runner: Runner, capacity: int) -> None:
        needed = capacity + MAX_DEPTH  # its drafts run k - 1 positions past the last token
        cache = self.head.cache
        if cache is None or cache.max_len < needed:
            self.head.cache = None
            parameter = self.head.fc.weight
            self.head.cache = KVCache(self.head.cache_shape(needed), parameter.device, parameter.dtype)
        self.head.cache.trim(0)
        self.valid = 0

    @torch.inference_mode()
    def draft(self, context: list[int], k: int, sampler: TorchSampler) -> Draft | None:
        end = len(context) - 1  # the target has run (and shown the features of) every position before the last token
        if end < 1 or self.store.features is None:
            return None
        start = min(self.valid, end - 1)  # at least one row: its output is the first draft's feature
        self.head.cache.trim(start)
        tokens = torch.tensor([context[start + 1:end + 1]], dtype=torch.long, device=self.runner.device)
        feature = self.head(self.store.features[start:end].unsqueeze(0), tokens, start)[:, -1:]  # (1, 1, H)
        self.valid, drafted, probs = end, [], []
        for index in range(k):
            token = draft_token(self.head.logits(feature[:, -1]), sampler, probs)  # (1, 1)
            drafted.append(token.view(1))
            if index + 1 < k:
                feature = self.head(feature, token, end + index)
        return Draft(torch.cat(drafted), torch.cat(probs) if probs else None)


def target_shapes(config: ModelConfig) -> dict[str, str]:
    return {key: str(getattr(config, key)) for key in SHAPE_KEYS}


def save_head(head: EagleHead, path: Path) -> None:
    """The head's weights in bf16 and the target's shapes, written whole or not at all."""
    from safetensors.torch import save_file

    weights = {name: tensor.detach().to("cpu", torch.bfloat16).contiguous()
               for name, tensor in head.state_dict().items()}
    metadata = {"kind": KIND, "target": head.config.name, **target_shapes(head.config)}
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    save_file(weights, str(partial), metadata=metadata)
    partial.replace(path)


def load_head(path: Path, target: Model, dtype: torch.dtype) -> EagleHead:
    """The head in `path` for `target` (on its device, in `dtype`); a missing file, another kind of file, or a head
    trained for other shapes is an InputError."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    if not path.is_file():
        raise InputError(f"--spec eagle:{path}: no such head file; expected one written by `kerneltriage distill "
                         f"--eagle` (it writes {default_path(target.config)} by default)")
    try:
        with safe_open(str(path), "pt") as file:
            metadata = file.metadata() or {}
    except Exception as error:  # noqa: BLE001 - safetensors raises several types for a bad header
        raise InputError(f"--spec eagle:{path}: not a safetensors file ({error}); expected an EAGLE head") from None
    if metadata.get("kind") != KIND:
        raise InputError(f"--spec eagle:{path}: not an EAGLE head (no {KIND!r} metadata); expected a file written "
                         "by `kerneltriage distill --eagle`")
    expected, found = target_shapes(target.config), {key: metadata.get(key) for key in SHAPE_KEYS}
    if found != expected:
        differ = ", ".join(f"{key} {found[key]} (the model: {expected[key]})" for key in SHAPE_KEYS
                           if found[key] != expected[key])
        raise InputError(f"--spec eagle:{path}: trained for {metadata.get('target') or 'another model'} — {differ}; "
                         "expected a head trained for this model")
    device = target.embed_tokens.weight.device
    head = EagleHead(target, device="meta")
    head.load_state_dict({name: tensor.to(device, dtype) for name, tensor in load_file(str(path)).items()},
                         assign=True)
    return head.eval()


def head_drafter(runner: Runner, path: str | None) -> EagleDrafter:
    """The drafter of `--spec eagle[:PATH]` on `runner` (the target's cached head where PATH is not given)."""
    file = Path(path).expanduser() if path else default_path(runner.config)
    if not path and not file.is_file():
        raise InputError(f"--spec eagle: no head for {runner.config.name or 'this model'} in the user cache ({file}); "
                         "expected one trained first: kerneltriage distill --eagle (same --model)")
    return EagleDrafter(runner, load_head(file, runner.model, runner.torch_dtype))
