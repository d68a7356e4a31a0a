"""The servers of an analysis in llama-server and the plain generation on them: what every server of one
analysis shares (:class:`ServerSetup`, which starts them or names the user's), one greedy completion timed with
the CPU other processes took meanwhile (:func:`timed_complete`), and each prompt's plain greedy completion, the
output every setting is replayed on (:func:`generate`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from analyzer.analysis.server_outcomes import (
    Generated,
    Progress,
    PromptOutcome,
    PromptTooLong,
    ServerPrompt,
    TimedCompletion,
)
from analyzer.engine.llama_server_process import LlamaServerProcess, RemoteServer, Server
from analyzer.measuring.interference import machine_reading, others_busy_s
from analyzer.measuring.noise import machine_sample, steal_share
from analyzer.measuring.server_drafting import ServerDrafter
from analyzer.run_params import LEAVE_OUT, REFUSE


@dataclass(frozen=True)
class ServerSetup:
    """What every server of one analysis shares: the binary, the GGUF model, threads and context, and the
    draft model's GGUF where a draft-simple setting is compared."""

    binary: Path | None
    model: Path
    threads: int
    n_ctx: int
    draft_model: Path | None = None
    # servers the user runs, by "off" (the plain one) and drafter label; None: start our own
    urls: Mapping[str, str] | None = None

    def server(self, drafter: ServerDrafter | None) -> Server:
        if self.urls is not None:
            return RemoteServer(self.urls["off" if drafter is None else drafter.label])
        assert self.binary is not None  # a setup without urls names the binary (the CLI finds it)
        flags = drafter.server_flags() if drafter is not None else []
        if drafter is not None and drafter.needs_draft_model:
            assert self.draft_model is not None  # analyze_in_llama_server checks it first
            flags = ["-md", str(self.draft_model), *flags]
        return LlamaServerProcess(
            self.binary, self.model, threads=self.threads, n_ctx=self.n_ctx, flags=flags
        )


def timed_complete(server: Server, prompt_ids: list[int], n_predict: int) -> TimedCompletion:
    """One greedy completion, with the CPU share other processes (not this one, not the server) took."""
    sample_before = machine_sample()
    before, server_before, wall = machine_reading(), server.cpu_seconds(), time.perf_counter()
    completion = server.client.complete(prompt_ids, n_predict)
    after, server_after, wall = machine_reading(), server.cpu_seconds(), time.perf_counter() - wall
    sample_after = machine_sample()
    steal = steal_share(sample_before, sample_after)
    mhz = float(np.mean(sample_after.mhz)) if sample_after.mhz else None
    busy = others_busy_s(before, after)
    if busy is None or server_before is None or server_after is None or wall <= 0:
        return TimedCompletion(completion, None, steal, mhz)
    others = max(0.0, busy - (server_after - server_before))
    return TimedCompletion(completion, others / (wall * (os.cpu_count() or 1)), steal, mhz)


@dataclass(frozen=True)
class LeftOutPrompt:
    """A prompt the analysis could not take: its key, task, token count and why."""

    key: str
    task: str
    tokens: int
    why: str

    def as_json(self) -> dict[str, str | int]:
        return {"prompt_id": self.key, "task": self.task, "tokens": self.tokens, "why": self.why}


def too_long(
    plain: Server, prompts: Sequence[ServerPrompt], n_predict: int, n_ctx: int
) -> tuple[dict[str, list[int]], list[LeftOutPrompt]]:
    """Every prompt's ids under the server's chat template, and the prompts whose ids and ``n_predict`` new
    tokens do not fit ``n_ctx`` (0: not checked), counted before anything is generated."""
    ids, long = {}, []
    for prompt in prompts:
        ids[prompt.key] = plain.client.tokenize(plain.client.chat_prompt(prompt.messages))
        if n_ctx and len(ids[prompt.key]) + n_predict > n_ctx:
            why = f"{len(ids[prompt.key])} tokens and {n_predict} new ones exceed the context of {n_ctx}"
            long.append(LeftOutPrompt(prompt.key, prompt.task, len(ids[prompt.key]), why))
    return ids, long


def generate(
    plain: Server,
    prompts: Sequence[ServerPrompt],
    n_predict: int,
    say: Progress,
    n_ctx: int = 0,
    generated: Generated | None = None,
    on_generated: Callable[[ServerPrompt, list[int], TimedCompletion], None] | None = None,
    long_prompts: str = LEAVE_OUT,
) -> tuple[list[PromptOutcome], float, list[LeftOutPrompt]]:
    """Each prompt's ids under the server's chat template and its plain greedy completion (``generated``'s
    where an earlier attempt made it), with the prompts left out. Every prompt is counted first
    (:func:`too_long`): where a prompt and ``n_predict`` exceed ``n_ctx`` (0: not checked), ``long_prompts``
    :data:`LEAVE_OUT` leaves it out (and the others are analyzed), :data:`REFUSE` raises :class:`PromptTooLong`
    naming every such prompt before anything is generated."""
    outcomes, seconds = [], 0.0
    generated = generated or {}
    kept = sum(1 for p in prompts if p.key in generated)
    if kept:
        say(f"kept {kept} plain generations of an earlier attempt")
    ids, long = too_long(plain, [p for p in prompts if p.key not in generated], n_predict, n_ctx)
    if long and long_prompts == REFUSE:
        raise PromptTooLong(
            f"{len(long)} of {len(prompts)} prompts do not fit the servers' context of {n_ctx} with {n_predict} new "
            f"tokens: {'; '.join(f'prompt {p.key} ({p.task}) has {p.tokens} tokens' for p in long)}. Give a larger "
            "--ctx or fewer --max-new-tokens, or --long-prompts leave-out to analyze the others"
        )
    if long:
        say(
            f"left out {len(long)} prompts too long for the context of {n_ctx}: {', '.join(p.key for p in long)}"
        )
    left_out = {p.key for p in long}
    for number, prompt in enumerate(prompts, 1):
        if prompt.key in generated:
            kept_ids, completion = generated[prompt.key]
            outcomes.append(PromptOutcome(prompt, list(kept_ids), completion))
            continue
        if prompt.key in left_out:
            continue
        wall = time.perf_counter()
        completion = timed_complete(plain, ids[prompt.key], n_predict)
        outcomes.append(PromptOutcome(prompt, ids[prompt.key], completion))
        seconds += time.perf_counter() - wall
        if on_generated is not None:
            on_generated(prompt, ids[prompt.key], completion)
        say(f"generated {number}/{len(prompts)} ({prompt.key})")
    if not outcomes:
        raise PromptTooLong(
            f"none of the {len(prompts)} prompts fits the servers' context of {n_ctx} with {n_predict} new tokens: "
            "give a larger --ctx or fewer --max-new-tokens"
        )
    return outcomes, seconds, long
