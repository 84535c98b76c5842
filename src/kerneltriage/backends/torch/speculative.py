"""Speculative decoding for a torch Runner: drafters, the one-forward verify, both acceptance rules, the loop.

Each step drafts k tokens, runs the target once over [last, d1..dk] (M = k+1 rows, a causal block after the
filled cache), keeps the accepted prefix plus one token of the target's own, and trims the cache past the rest.
`install_speculation` puts the loop on `Runner.decode_loop`, so generate and bench run it unchanged.
"""

from __future__ import annotations

from typing import Iterator, Protocol

import torch
from torch import nn

from kerneltriage.backends.torch.cache import KVCache, StaticKVCache
from kerneltriage.backends.torch.models.llama import Model
from kerneltriage.backends.torch.runner import Runner, StepFn, build_runner
from kerneltriage.backends.torch.sampling import filter_logits, sample
from kerneltriage.backends.torch.timing import synced_clock
from kerneltriage.core.errors import InputError
from kerneltriage.engine.sampling import SamplingParams
from kerneltriage.engine.sources import load_checkpoint
from kerneltriage.engine.speculative import DepthController, NgramIndex, SpecConfig, SpecStats, check_same_vocabulary

Generator = torch.Generator | None
SPEC_COUNTER = "spec"  # runner.counters key: verify steps run (proof that speculation happened)
# (draft tokens (k,) long, draft probabilities (k, V) float32 — None when drafting is deterministic)
Draft = tuple[torch.Tensor, torch.Tensor | None]


def sample_probs(probs: torch.Tensor, generator: Generator) -> torch.Tensor:
    """Token ids (...,) drawn from unnormalized probabilities (..., V): argmax(p / Exp(1)), no host sync."""
    noise = torch.empty_like(probs).exponential_(1, generator=generator)
    return (probs / noise).argmax(dim=-1)


def greedy_accept(logits: torch.Tensor, drafts: torch.Tensor) -> list[int]:
    """Exact greedy: keep drafts while they equal the target's argmax, then emit the target's own argmax.

    logits (k+1, V): row i is the target's prediction after [last, d1..di]. The kept drafts equal the
    argmaxes, so the emitted tokens are argmax rows 0..n: token for token what plain greedy decode emits."""
    best = logits.argmax(dim=-1)  # (k+1,)
    kept = (best[:-1] == drafts).int().cumprod(0).sum()  # length of the agreeing prefix
    packed = torch.cat([kept.view(1), best]).tolist()  # one host sync
    return packed[1:packed[0] + 2]


def rejection_accept(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor,
                     generator: Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Leviathan et al. 2023 / Chen et al. 2023 speculative sampling over a batch of independent trials.

    p (B, k+1, V) target probabilities, q (B, k, V) the draft's, drafts (B, k) with d_i ~ q_i. Returns
    (accepted count n (B,), next token (B,)); the emitted tokens are d_1..d_n then `next`, distributed
    exactly as sampling each from p (Leviathan et al., Theorem 1)."""
    rows = torch.arange(p.shape[0], device=p.device)
    # Keep d_i with probability min(1, p_i(d_i) / q_i(d_i)), in float32: u < p/q ⇔ u < min(1, p/q) for u in [0, 1).
    p_draft = p[:, :-1].gather(-1, drafts.unsqueeze(-1)).squeeze(-1).float()  # (B, k)
    q_draft = q.gather(-1, drafts.unsqueeze(-1)).squeeze(-1).float()  # (B, k), > 0: d_i was drawn from q_i
    u = torch.rand(q_draft.shape, generator=generator, device=p.device)
    n = (u < p_draft / q_draft).int().cumprod(-1).sum(-1)  # (B,) the accepted prefix
    # At the first rejection (n < k) draw from the residual (p_n − q_n)+; normalizing is implied (the draw is
    # scale-invariant). Exactness: P(emit x) = q(x)·min(1, p(x)/q(x)) + P(reject)·(p(x) − q(x))+ / Σ(p − q)+
    # = min(p, q)(x) + (p − q)+(x) = p(x), because P(reject) = 1 − Σ min(p, q) = Σ (p − q)+.
    # When all k are kept (n = k), the zero row appended to q makes the residual p_k itself: the bonus token.
    q_padded = torch.cat([q, torch.zeros_like(q[:, :1])], dim=1)  # (B, k+1, V)
    residual = (p - q_padded).clamp_min(0)[rows, n]  # (B, V)
    # Rounding can empty a residual whose exact mass is tiny: fall back to p_n there.
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p[rows, n])
    return n, sample_probs(residual, generator)


def padded_rows(tokens: torch.Tensor, rows: int) -> torch.Tensor:
    """tokens (T,) as a (1, max(T, rows)) batch, the last token repeated as filler: a verify of fixed shape
    (graph capture). Filler rows come after the real ones, so the causal mask hides them from those."""
    return torch.cat([tokens, tokens[-1:].expand(max(rows - len(tokens), 0))]).view(1, -1)


def verify(runner: Runner, last: int, draft: Draft, start: int, params: SamplingParams, generator: Generator,
           rows: int = 0) -> list[int]:
    """One target forward over [last, d1..dk] at positions start…start+k (padded to `rows` rows by repeating
    the last draft: fixed shapes for graph capture; padded rows are computed and ignored); returns the tokens
    to emit."""
    drafts, q = draft
    size = len(drafts)
    tokens = padded_rows(torch.cat([torch.tensor([last], device=drafts.device), drafts]), rows)  # (1, T)
    logits = runner.verify(runner.model, tokens, start)[: size + 1]  # (k+1, V)
    if params.greedy:
        return greedy_accept(logits, drafts)
    p = filter_logits(logits, params).softmax(-1)  # (k+1, V)
    if q is None:  # a deterministic draft (ngram): q is one-hot on the drafted token
        q = torch.zeros_like(p[:-1]).scatter_(-1, drafts.unsqueeze(-1), 1.0)
    n, token = rejection_accept(p[None], q[None], drafts[None], generator)
    packed = torch.cat([n, drafts, token]).tolist()  # one host sync
    return packed[1:packed[0] + 1] + packed[-1:]


def draft_tokens(model: Model, feed: list[int], start: int, k: int, params: SamplingParams,
                 generator: Generator) -> Draft:
    """Run a draft model over `feed` (the context it has not seen) at `start`, then k-1 single steps: k tokens,
    argmax when greedy, else drawn from q = softmax(filter(logits)), q kept for the acceptance test."""
    device = model.embed_tokens.weight.device
    tokens, probs = [], []
    step = torch.tensor([feed], device=device)  # (1, F)
    for _ in range(k):
        logits = model.logits(model.hidden(step, start)[:, -1])  # (1, V)
        start += step.shape[1]
        if params.greedy:
            step = logits.argmax(dim=-1, keepdim=True)  # (1, 1)
        else:
            probs.append(filter_logits(logits, params).softmax(-1))
            step = sample_probs(probs[-1], generator).view(1, 1)
        tokens.append(step.view(1))
    return torch.cat(tokens), torch.cat(probs) if probs else None


class Drafter(Protocol):
    def reset(self, runner: Runner, capacity: int) -> None:
        """Ready for a new sequence of at most `capacity` positions (called after the target's prefill)."""

    def draft(self, context: list[int], k: int, params: SamplingParams, generator: Generator) -> Draft | None:
        """Up to k tokens to follow `context`; None when there is nothing to propose."""


class NgramDrafter:
    """Prompt lookup: propose what followed the latest earlier occurrence of the context's suffix."""

    def __init__(self, max_n: int) -> None:
        self.max_n = max_n
        self.index = NgramIndex(max_n)
        self.device = torch.device("cpu")

    def reset(self, runner: Runner, capacity: int) -> None:
        self.index, self.device = NgramIndex(self.max_n), runner.device

    def draft(self, context: list[int], k: int, params: SamplingParams, generator: Generator) -> Draft | None:
        self.index.extend(context[len(self.index.tokens):])  # the context only grows: rejected drafts never enter
        proposal = self.index.propose(k)
        return (torch.tensor(proposal, device=self.device), None) if proposal else None


class _LayerPrefixCache(KVCache):
    """The first L layers of another cache, sharing its storage: no allocation, no copies."""

    def __init__(self, cache: KVCache, layers: int) -> None:  # no super().__init__: the storage is borrowed
        self.keys, self.values = cache.keys[:layers], cache.values[:layers]  # (L, B, Hkv, S, D) views
        self.max_len, self.length = cache.max_len, 0


class SelfDrafter:
    """The target's first L layers, its final norm and lm_head (layer skip), sharing the target's KV cache.

    Sharing is exact: layers < L see the same inputs in both models, so the target's entries are the ones the
    draft would write. The draft writes positions start…start+k-1; the verify forward then rewrites start…start+k
    in every layer, and the target's trim covers both. So the draft resumes at the target's committed length."""

    def __init__(self, target: Model, layers: int) -> None:
        self.model = Model(target.config.replace(num_layers=layers), device="meta")
        self.model.embed_tokens, self.model.norm, self.model.lm_head = target.embed_tokens, target.norm, target.lm_head
        self.model.layers = nn.ModuleList(target.layers[:layers])
        self.model.inv_freq = target.inv_freq
        self.model.attention = target.attention
        self.layers = layers

    def reset(self, runner: Runner, capacity: int) -> None:
        self.model.cache = _LayerPrefixCache(runner.model.cache, self.layers)

    def draft(self, context: list[int], k: int, params: SamplingParams, generator: Generator) -> Draft:
        committed = len(context) - 1  # the target has cached every token but the last
        self.model.cache.length = committed
        return draft_tokens(self.model, context[committed:], committed, k, params, generator)


class ModelDrafter:
    """A smaller model with the target's tokenizer and its own cache, fed the context it has not seen yet."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self.seen = 0  # context[:seen] is in the draft's cache (the context only grows)
        self.pending: torch.Tensor | None = None  # drafts fed after context[:seen], read after the verify's sync

    def reset(self, runner: Runner, capacity: int) -> None:
        self.runner.reset_cache(capacity)
        self.seen, self.pending = 0, None

    def draft(self, context: list[int], k: int, params: SamplingParams, generator: Generator) -> Draft:
        fed = self.pending.tolist() if self.pending is not None else []
        valid = self.seen + _common_prefix(fed, context[self.seen:-1])  # the accepted drafts stay cached
        self.runner.model.cache.trim(valid)
        drafts, q = draft_tokens(self.runner.model, context[valid:], valid, k, params, generator)
        self.seen, self.pending = len(context), drafts[:-1]  # the last draft was predicted, never fed
        return drafts, q


def _common_prefix(a: list[int], b: list[int]) -> int:
    size = min(len(a), len(b))
    return next((i for i in range(size) if a[i] != b[i]), size)


class SpeculativeDecoder:
    """A drop-in `Runner.decode_loop`. After a run, `stats` and `controller.decisions` describe it."""

    def __init__(self, spec: SpecConfig, drafter: Drafter) -> None:
        self.spec, self.drafter = spec, drafter
        self.prompt: list[int] = []
        self.stats = SpecStats()
        self.controller = DepthController(spec.depth)

    def see_prompt(self, tokens: torch.Tensor, start: int) -> None:
        """Called by the wrapped prefill: prompt lookup and the draft model need the prompt's ids."""
        self.prompt = self.prompt[:start] + tokens[0].tolist()

    def __call__(self, runner: Runner, logits: torch.Tensor, start: int, count: int, params: SamplingParams,
                 generator: Generator) -> Iterator[int]:
        if len(self.prompt) != start:  # positions come from the context: a stale prompt would misplace them
            raise RuntimeError("speculative loop: prompt not recorded; install it after levers that replace prefill")
        # Graph capture needs fixed shapes: every verify then has the deepest step's rows (padded).
        rows = self.controller.deepest + 1 if issubclass(runner.cache_type, StaticKVCache) else 0
        self.stats, self.controller = SpecStats(), DepthController(self.spec.depth, padded=rows > 0)
        self.drafter.reset(runner, start + count)
        context, self.prompt = self.prompt + [int(sample(logits, params, generator).item())], []
        yield context[-1]
        while len(context) < start + count:
            # a step emits at most k+1 tokens and writes positions up to len(context)-1+k: stay inside count,
            # and a padded verify must fit in the cache (its slack) or the step is a plain one
            k = min(self.controller.next_depth(), start + count - len(context) - 1)
            if len(context) - 1 + max(rows - 1, k) >= runner.model.cache.max_len:
                k = 0
            emitted = self.step(runner, context, k, params, generator, rows)
            context += emitted
            yield from emitted

    def step(self, runner: Runner, context: list[int], k: int, params: SamplingParams,
             generator: Generator, rows: int = 0) -> list[int]:
        """Draft up to k tokens after `context`, verify them (or decode plainly); returns the tokens emitted."""
        position = len(context) - 1  # where the last emitted token goes
        began = synced_clock(runner.device)
        draft = self.drafter.draft(context, k, params, generator) if k else None
        if draft is None:
            return self._plain_step(runner, context[-1], position, params, generator, began)
        drafted = synced_clock(runner.device)
        emitted = verify(runner, context[-1], draft, position, params, generator, rows)
        runner.counters[SPEC_COUNTER] += 1
        runner.model.cache.trim(position + len(emitted))  # forget the rejected drafts' entries
        verified = synced_clock(runner.device)
        size = len(draft[0])
        self.stats.record_verify(size, len(emitted) - 1, drafted - began, verified - drafted)
        self.controller.observe_verify(size, len(emitted) - 1, drafted - began, verified - drafted)
        return emitted

    def _plain_step(self, runner: Runner, last: int, position: int, params: SamplingParams,
                    generator: Generator, began: float) -> list[int]:
        """The stock step (with the runner's own decode levers): M = 1, no draft."""
        logits = runner.decode(runner.model, torch.tensor([[last]], device=runner.device), position)
        token = int(sample(logits, params, generator).item())
        seconds = synced_clock(runner.device) - began
        self.stats.record_plain(seconds)
        self.controller.observe_plain(seconds)
        return [token]


def decoder_of(runner: Runner) -> SpeculativeDecoder | None:
    """The runner's speculative decoder, or None when it decodes plainly."""
    loop = runner.decode_loop
    return loop if isinstance(loop, SpeculativeDecoder) else None


def build_drafter(spec: SpecConfig, runner: Runner) -> Drafter:
    """The drafter `spec` names for this target; selfdraft layers beyond the model's are an InputError."""
    if spec.source == "ngram":
        return NgramDrafter(spec.ngram_max)
    if spec.source == "selfdraft":
        total = runner.config.num_layers
        layers = spec.layers or max(total // 2, 1)
        if layers > total:
            raise InputError(f"--spec selfdraft:{layers}: expected at most the model's {total} layers")
        return SelfDrafter(runner.model, layers)
    checkpoint = load_checkpoint(spec.draft_model)
    check_same_vocabulary(runner.checkpoint, checkpoint)
    return ModelDrafter(build_runner(checkpoint, runner.device, runner.dtype))


def install_speculation(runner: Runner, spec: SpecConfig, drafter: Drafter | None = None) -> SpeculativeDecoder:
    """Put speculative decoding on `runner` (its prefill now also records the prompt); returns the decoder."""
    decoder = SpeculativeDecoder(spec, drafter or build_drafter(spec, runner))
    runner.cache_slack = max(runner.cache_slack, decoder.controller.deepest)  # room for a padded verify
    runner.prefill = _recording(runner.prefill, decoder)
    runner.decode_loop = decoder
    return decoder


def _recording(prefill: StepFn, decoder: SpeculativeDecoder) -> StepFn:
    def recording_prefill(model: Model, tokens: torch.Tensor, start: int) -> torch.Tensor:
        decoder.see_prompt(tokens, start)
        return prefill(model, tokens, start)

    return recording_prefill
