"""The speculative decode loop, written against the backend protocol's `Steps`.

Each step drafts k tokens, runs the target once over [last, d1..dk] (M = k+1 rows, a causal block after the filled
cache), keeps the accepted prefix plus one token of the target's own (the sampler's exact acceptance), and trims the
cache past the rest. A runner whose steps are captured at fixed shapes pads each verify to the smallest of a few
shapes that holds it (config.VERIFY_BUCKETS). The controller picks k before each step, 0 being a plain step; during
plain steps a lookup drafter's proposals are scored against the emitted tokens (shadow acceptance) for the
controller. Plain steps run pipelined, as `one_sync` runs them: the next one is queued before a token is read, so
the host's work on that token (the controller, shadow drafts, the next draft) overlaps the device's next step — also
while drafting is on and a lookup drafter finds nothing to draft, until it does. A lookup drafter indexes the prompt
while the prefill runs, and the text it drafted past while the verify runs (`catch_up`): its host work stays off the
device's path.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Iterator, TypeGuard

from kerneltriage.core.errors import InputError
from kerneltriage.engine.decoding import ONE_SYNC, first_logits, next_logits
from kerneltriage.engine.speculative.config import (AUTO_MAX_DEPTH, PADDED_MAX_DEPTH, TREE_GREEDY_ONLY, Speculation,
                                                    padded_rows)
from kerneltriage.engine.speculative.controller import DepthController
from kerneltriage.engine.speculative.draft import Drafter, is_lookup
from kerneltriage.engine.speculative.resident import resident_run
from kerneltriage.engine.speculative.shadow import Shadow
from kerneltriage.engine.speculative.stats import SpecStats

if TYPE_CHECKING:
    from kerneltriage.engine.backend import Sampler, Steps, TreeSampler, TreeSteps
    from kerneltriage.engine.speculative.tree import TokenTree

SPEC_COUNTER = "spec"  # runner.counters key: verify steps run (proof that speculation happened)


class SpeculativeDecoder:
    """A drop-in token loop. After a run, `stats` and `controller.decisions` describe it; `total` adds up every
    run since `reset_total` (what an A/B's timed runs did)."""

    def __init__(self, speculation: Speculation, drafter: Drafter, queue_ahead: bool = False) -> None:
        """`queue_ahead` (`one_sync`): steps run resident where the runner and the sampler allow (resident.py)."""
        self.speculation, self.drafter, self.queue_ahead = speculation, drafter, queue_ahead
        self.stats = SpecStats(speculation.source_text)
        self.controller = DepthController(speculation.depth)
        self.shadow = Shadow()
        self.lookup = drafter if is_lookup(drafter) else None  # it drafts from the text alone, or None
        self.shadows = self.lookup is not None  # drafting costs no forward: score it during plain steps
        self.drafted: Any = None  # the draft made after the last plain token (a lookup drafter, auto depth), if any
        self.measured: Any = None  # the runner whose costs the controller holds
        self.host_clock = time.perf_counter  # the host's clock (a replay on recorded text puts its own here)
        self.unsettled: tuple | None = None  # the last verify step, not yet in the stats and the controller
        self.reset_total()

    def reset_total(self) -> None:
        self.total = SpecStats(self.speculation.source_text)

    def deepest(self, runner: "Steps") -> int:
        """The deepest k a run on `runner` drafts: the fixed depth, else auto's limit — deeper for a lookup drafter
        where verifies are captured at one padded shape (config.PADDED_MAX_DEPTH says why)."""
        if self.speculation.depth:
            return self.speculation.depth
        return PADDED_MAX_DEPTH if runner.pads_verify and self.shadows else AUTO_MAX_DEPTH

    def shapes(self, runner: "Steps") -> list[int]:
        """The rows of each verify shape a run on `runner` may compute where verifies are padded (every captured
        shape up to the deepest k + 1); [] where they are not (k + 1 rows, whatever k)."""
        deepest = self.deepest(runner)
        return sorted({padded_rows(k, deepest) for k in range(1, deepest + 1)}) if runner.pads_verify else []

    def rows(self, runner: "Steps", k: int) -> int:
        """Rows a verify of k drafts computes where verifies are captured at fixed shapes (config.padded_rows), else 0
        (k + 1, unpadded)."""
        return padded_rows(k, self.deepest(runner)) if runner.pads_verify else 0

    def __call__(self, runner: "Steps", logits: Any, start: int, count: int, sampler: "Sampler") -> Iterator[int]:
        if len(sampler.prompt) != start:  # positions come from the context: a stale prompt would misplace them
            raise RuntimeError(f"speculative loop: the sampler holds {len(sampler.prompt)} prompt tokens, "
                               f"the cache {start}")
        if self.speculation.tree and not sampler.params.greedy:
            raise InputError(f"--spec {self.speculation.source_text}: {TREE_GREEDY_ONLY}")
        self._settle()  # a run left unfinished (its generator never closed): its last verify is its own
        self.stats = SpecStats(self.speculation.source_text)
        earlier, self.controller = self.controller, DepthController(self.speculation.depth, self.deepest(runner),
                                                                     padded=runner.pads_verify)
        if runner is self.measured:  # its step costs and last verdict are known (controller.carry_over)
            self.controller.carry_over(earlier)
        self.measured = runner
        self.drafter.reset(runner, start + count)
        resident = self.controller.resident = self._resident(runner, sampler)
        if runner.pads_verify:  # every graph this run may replay captured now, not inside the run
            runner.prepare_steps(start, start + count, self.shapes(runner),
                                 self.speculation.lookback if resident else 0)
        if self.lookup is not None:  # a lookup indexes the prompt while the device runs the prefill
            self.lookup.catch_up(list(sampler.prompt))
        self.shadow.clear()
        context = list(sampler.prompt) + [runner.read_later(sampler(logits)).result()]
        if sampler.host_bound:
            sampler.follow(context[-1])
        yield context[-1]
        try:
            while len(context) < start + count:
                if resident:  # while speculation is on, steps queued ahead on the device, each choosing there
                    # between a plain step and a verify; while it is off, plain steps (host-fed, with shadows)
                    if self.depth(runner, context, start + count):
                        yield from resident_run(self, runner, context, start + count)
                    if len(context) < start + count:
                        yield from self._plain_run(runner, context, start + count, sampler)
                    continue
                k = self.depth(runner, context, start + count)
                emitted = self.step(runner, context, k, sampler) if k else None
                if emitted is None:  # drafting off, or nothing to draft: plain steps until there is
                    yield from self._plain_run(runner, context, start + count, sampler)
                    continue
                context += emitted
                self.shadow.clear()  # a verify measured acceptance itself
                yield from emitted
        finally:  # a stop string closes the loop early: what ran still counts
            self._settle()
            self.total.merge(self.stats)

    def _resident(self, runner: "Steps", sampler: "Sampler") -> bool:
        """Steps run resident: asked for (`one_sync`), a runner that can, a lookup drafter (the device drafts as it
        does) drafting one sequence, and greedy sampling of the raw logits (the device accepts by argmax)."""
        return (self.queue_ahead and runner.resident and self.shadows and not self.speculation.tree
                and sampler.argmax_only)

    def record_step(self, runner: "Steps", rows: int, accepted: int, seconds: float, matched: int = 0) -> None:
        """A resident step of `rows` rows — 1: a plain step; else a verify of rows - 1 drafts, drafted on the device
        from a match of `matched` tokens — kept `accepted` drafts in `seconds`."""
        if rows == 1:
            self.stats.record_plain(seconds)
            self.controller.observe_plain(seconds)
            return
        self.stats.record_verify(rows - 1, accepted, 0.0, seconds)
        self.controller.observe_match(matched, accepted + 1, seconds)
        self.controller.observe_verify(rows - 1, accepted, 0.0, seconds, rows)
        runner.counters[SPEC_COUNTER] += 1
        self.shadow.clear()  # a verify measured acceptance itself

    def depth(self, runner: "Steps", context: list[int], end: int) -> int:
        """The next step's k: the controller's, no more than fit before `end`, 0 where a padded verify would pass
        the cache (a step emits at most k+1 tokens and writes positions up to len(context)-1+k)."""
        k = min(self.controller.next_depth(), end - len(context) - 1)
        return 0 if len(context) - 1 + max(self.rows(runner, k) - 1, k) >= runner.cache_capacity else k

    def _plain_run(self, runner: "Steps", context: list[int], end: int, sampler: "Sampler") -> Iterator[int]:
        """Plain steps, pipelined: step n+1 is queued (fed token n on the device) before token n is read, and the
        host's work on token n overlaps it. They go on while the controller keeps drafting off, or while it is on
        (auto depth) and a lookup drafter finds nothing after the last token read (it drafts after every token,
        `_follow`); the step queued when that changes is still read, and the next step drafts after it — a draft
        that missed that token would not have paid its verify. A model drafter, which costs a forward to ask, and a
        fixed depth get one step at a time while drafting is on. A step's cost is the time between two tokens
        arriving: the device's step when the host keeps up. Under `one_sync` each step queued ahead here counts as
        the lever's (it replaced `one_sync`'s own loop; without the count an A/B of speculation on a stack with
        `one_sync`, on a runner with no resident steps — MLX — read the lever as never run: invalid)."""
        position = len(context) - 1  # where the token being fed goes
        token = sampler(first_logits(runner, sampler, context[-1], position))
        self._settle()
        last = self.host_clock()
        self.drafted = None
        while True:
            pending = runner.read_later(token)
            more = len(context) + 1 < end and self._keep_plain()
            if more:  # queue the next step before waiting for this token (a constraint's mask: while it runs)
                token = sampler(next_logits(runner, sampler, token, pending, position + 1))
                if self.queue_ahead:  # what `one_sync` asks of a step, done here where no step runs resident
                    runner.counters[ONE_SYNC] += 1
            elif sampler.host_bound:
                sampler.follow(pending.result())
            context.append(pending.result())
            now = self.host_clock()
            self.stats.record_plain(now - last)
            # the last token's wait is no step's cost where steps run as they are queued (CPU: ~0, its step ran
            # inside the previous token's decode call); so one-step plain runs between verifies add no sample, and
            # the plain cost comes from calibration, runs of plain steps and earlier runs (controller.carry_over)
            self.controller.observe_plain(now - last if more else None)
            last = now
            yield context[-1]
            self._follow(context, sampler)
            position += 1
            if not more:
                return

    def _keep_plain(self) -> bool:
        """Queue another plain step: drafting is off, or on (auto depth) with a lookup drafter that found nothing
        last time. A fixed depth verifies every draft at the token it was found at, so it reads each token first."""
        if self.controller.next_depth() == 0:
            return True
        return self.controller.adaptive and self.shadows and self.drafted is None

    def _follow(self, context: list[int], sampler: "Sampler") -> None:
        """After a plain step, with a lookup drafter (no forward to ask it) and auto depth: score the pending shadow
        drafts against the emitted token and draft from here — a shadow for the controller, and while drafting is on,
        whether the next step verifies (`_keep_plain`). While drafting is on, the draft that ends a plain run is
        scored at its first token too (what a verify of it would have accepted there) before the verify clears it."""
        if not (self.shadows and self.controller.adaptive):  # a fixed depth drafts at its next step anyway
            return
        for position, hit in self.shadow.score(context[-1]):
            self.stats.record_shadow(position, hit)
            self.controller.observe_shadow(position, hit)
        draft = self.drafted = self.drafter.draft(context, self.controller.deepest, sampler)
        if draft is not None:  # a tree is shadowed along its first path (shadows score one sequence)
            self.shadow.start(draft.tree.first_path() if draft.tree else list(draft.tokens))

    def step(self, runner: "Steps", context: list[int], k: int, sampler: "Sampler") -> list[int] | None:
        """Draft up to k tokens after `context` and verify them; returns the tokens emitted, or None when there is
        nothing to verify (no draft, or a tree past the cache's end): the caller decodes plainly. A lookup drafter
        catches up on the text while the device verifies."""
        position = len(context) - 1  # where the last emitted token goes
        began = self._now(runner)
        draft = self.drafter.draft(context, k, sampler)
        if draft is None or (draft.tree is not None and position + draft.size >= runner.cache_capacity):
            return None
        if draft.tree is not None:
            if not (_verifies_trees(runner) and _accepts_trees(sampler)):  # install refuses trees on such backends
                raise InputError(f"--spec {self.speculation.source_text}: this backend verifies no token tree")
            return self._tree_step(runner, context[-1], position, draft.tree, sampler, began)
        drafted, rows = self._now(runner), self.rows(runner, draft.size)
        logits = runner.verify(context[-1], draft.tokens, position, rows)
        if self.lookup is not None:
            self.lookup.catch_up(context)
        self._settle()  # the previous verify's bookkeeping, while the device verifies this one
        emitted = sampler.accept(logits, draft)
        runner.counters[SPEC_COUNTER] += 1
        runner.trim_cache(position + len(emitted))  # forget the rejected drafts' entries
        verified = self._now(runner)
        self.unsettled = (draft.size, len(emitted) - 1, drafted - began, verified - drafted, rows or draft.size + 1)
        return emitted

    def _settle(self) -> None:
        """Record the last verify step in the stats and the controller, if not yet done. Called once the next step
        is queued on the device: between a verify's acceptance and the next step's launch the device waits for the
        host, and the controller's bookkeeping and judgement (~30 µs per verify step on the CPU machine, a judgement
        25–70: spec_host_costs.py) need not be on that path. The controller decides each k from the steps before
        the last one: a judgement every WARMUP_STEPS verifies, one step later than it could."""
        if self.unsettled is None:
            return
        drafted, accepted, draft_s, verify_s, rows = self.unsettled
        self.unsettled = None
        self.stats.record_verify(drafted, accepted, draft_s, verify_s)
        self.controller.observe_verify(drafted, accepted, draft_s, verify_s, rows)

    def _now(self, runner: "Steps") -> float:
        """A timestamp for a verify step's costs. A lookup drafter leaves the device idle while it drafts, and the
        verify's tokens are read before the last stamp: the host's clock is the step's cost, and a synced read
        (~22 µs each on the H200, three per verify step: spec-profile-repetitive-h200-dotpipe.json) only adds to it.
        A model drafter queues its forwards: its stamps wait for the device."""
        return self.host_clock() if self.shadows else runner.clock()

    def _tree_step(self, runner: "TreeSteps", last: int, position: int, tree: "TokenTree", sampler: "TreeSampler",
                   began: float) -> list[int]:
        """Verify a token tree in one forward, keep the accepted branch (engine/speculative/tree.py). The stats
        and the controller see the tree's depth as the drafted length: acceptance by position is by depth."""
        drafted = self._now(runner)
        logits = runner.verify_tree(last, tree, position)
        self._settle()
        emitted, path = sampler.accept_tree(logits, tree)
        runner.counters[SPEC_COUNTER] += 1
        runner.keep_branch(position, path)  # the accepted nodes' entries moved to consecutive positions
        verified = self._now(runner)
        # the controller prices a tree by its depth
        self.unsettled = (tree.depth, len(path), drafted - began, verified - drafted, tree.depth + 1)
        return emitted


def _verifies_trees(runner: "Steps") -> "TypeGuard[TreeSteps]":
    return hasattr(runner, "verify_tree")


def _accepts_trees(sampler: "Sampler") -> "TypeGuard[TreeSampler]":
    return hasattr(sampler, "accept_tree")
