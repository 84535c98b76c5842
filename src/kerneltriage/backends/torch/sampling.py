"""Sampling on the device: no host sync inside (the token stays a tensor until the caller reads it), the logits
processors of one generation, and speculative acceptance through the same processors."""

from __future__ import annotations

from typing import Sequence

import torch

from kerneltriage.backends.torch.acceptance import greedy_accept, rejection_accept, sample_probs
from kerneltriage.engine.speculative.tree import TokenTree
from kerneltriage.engine.sampling import LogitsProcessor, ProcessedSampler, SamplingParams
from kerneltriage.engine.speculative.draft import Draft

REPETITION_CONTEXT = 20  # tokens the repetition penalty looks back over (mlx-lm's default)


def make_generator(params: SamplingParams, device: torch.device) -> torch.Generator | None:
    if params.seed is None:
        return None
    generator = torch.Generator(device=device)
    generator.manual_seed(params.seed)
    return generator


def filter_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Apply temperature, then top-k, top-p and min-p by setting excluded logits to -inf. (B, V) → (B, V)."""
    logits = logits.float() / params.temperature
    if params.top_k:
        kth = torch.topk(logits, min(params.top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.min_p:
        # keep tokens whose probability is at least min_p × the top probability
        probs = logits.softmax(-1)
        logits = logits.masked_fill(probs < params.min_p * probs.amax(-1, keepdim=True), float("-inf"))
    if params.top_p < 1:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        # drop a token when the mass before it already reaches top_p (the top token always stays)
        drop_sorted = (cumulative - sorted_logits.softmax(-1)) >= params.top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None) -> torch.Tensor:
    """Next token ids (B,) from logits (B, V), on the logits' device."""
    if params.greedy:
        return logits.argmax(dim=-1)
    probs = filter_logits(logits, params).softmax(-1)
    # Gumbel-style trick: argmax(p / Exp(1)) samples from p without torch.multinomial's host sync.
    noise = torch.empty_like(probs).exponential_(1, generator=generator)
    return (probs / noise).argmax(dim=-1)


def repetition_penalty(penalty: float) -> LogitsProcessor:
    """mlx-lm's repetition penalty as a logits processor: the logits of the last REPETITION_CONTEXT tokens are
    divided by `penalty` when positive and multiplied by it when negative (both lower their probability)."""

    def process(tokens: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        seen = tokens[-REPETITION_CONTEXT:]
        picked = logits[:, seen]  # (1, N)
        return logits.index_put((torch.zeros_like(seen), seen),
                                torch.where(picked < 0, picked * penalty, picked / penalty)[0])

    return process


def draft_token(logits: torch.Tensor, sampler: "TorchSampler", probs: list[torch.Tensor]) -> torch.Tensor:
    """A drafted token (1, 1) from a draft's logits (1, V): the argmax when greedy, else drawn from
    q = softmax(filter(logits)), q appended to `probs` for the acceptance test."""
    if sampler.params.greedy:
        return logits.argmax(dim=-1, keepdim=True)
    probs.append(filter_logits(logits, sampler.params).softmax(-1))
    return sample_probs(probs[-1], sampler.generator).view(1, 1)


class TorchSampler(ProcessedSampler):
    """The sampler of one generation: its logits processors over the token history (kept on the device), its
    parameters and random generator; every token it emits joins the history."""

    def __init__(self, params: SamplingParams, prompt: list[int], device: torch.device,
                 processors: Sequence[LogitsProcessor] = ()) -> None:
        super().__init__(params, prompt, processors, repetition_penalty)
        self.device = device
        self.generator = make_generator(params, device)
        self.history = torch.tensor(prompt, dtype=torch.long, device=device)  # (N,)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        if self.processors:
            logits = self.process(self.history, logits)
        token = sample(logits, self.params, self.generator)  # (1,)
        if self.processors:
            self.history = torch.cat([self.history, token.view(1)])
        return token

    def accept(self, logits: torch.Tensor, draft: Draft) -> list[int]:
        """Exact acceptance of `draft` over verify logits (k+1, V): row i is processed with the history and the
        first i drafts, as plain decoding would have processed it had it emitted them."""
        if self.argmax_only:  # the common case: the drafts compared on the host, one sync
            return greedy_accept(logits, draft.tokens)
        drafts = torch.as_tensor(draft.tokens, dtype=torch.long, device=logits.device)  # (k,)
        if self.processors:
            logits = torch.cat([self.process(torch.cat([self.history, drafts[:i]]), logits[i:i + 1])
                                for i in range(len(logits))])
        emitted = greedy_accept(logits, drafts) if self.params.greedy else self._sampled(logits, drafts, draft)
        if self.processors:
            self.history = torch.cat([self.history, torch.tensor(emitted, device=self.history.device)])
            for token in emitted:
                self.follow(token)
        return emitted

    def accept_tree(self, logits: torch.Tensor, tree: TokenTree) -> tuple[list[int], list[int]]:
        """Greedy acceptance over a tree verify's logits (N+1, V): (tokens to emit, accepted nodes). Row r is
        processed with the history and the tokens on node r's path, as plain decoding would have seen them."""
        if not self.params.greedy:
            raise RuntimeError("a token tree is verified greedily only (temperature 0)")
        if self.processors:
            logits = torch.cat([self.process(torch.cat([self.history, self._path_tokens(tree, row)]),
                                             logits[row:row + 1]) for row in range(len(logits))])
        best = logits.argmax(dim=-1).tolist()  # one host sync
        path = tree.walk(best)
        emitted = [tree.tokens[node - 1] for node in path] + [best[path[-1] if path else 0]]
        if self.processors:
            self.history = torch.cat([self.history, torch.tensor(emitted, device=self.history.device)])
            for token in emitted:
                self.follow(token)
        return emitted, path

    def _path_tokens(self, tree: TokenTree, row: int) -> torch.Tensor:
        nodes = tree.lineage(row)[1:]  # the root is the last emitted token: in the history already
        return torch.tensor([tree.tokens[node - 1] for node in nodes], dtype=torch.long, device=self.device)

    def _sampled(self, logits: torch.Tensor, drafts: torch.Tensor, draft: Draft) -> list[int]:
        p = filter_logits(logits, self.params).softmax(-1)  # (k+1, V)
        q = draft.probs
        if q is None:  # a deterministic draft (ngram): q is one-hot on the drafted token
            q = torch.zeros_like(p[:-1]).scatter_(-1, drafts.unsqueeze(-1), 1.0)
        n, token = rejection_accept(p[None], q[None], drafts[None], self.generator)
        packed = torch.cat([n, drafts, token]).tolist()  # one host sync
        return packed[1:packed[0] + 1] + packed[-1:]
