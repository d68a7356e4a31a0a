"""Using the router from an application: ``RouterClient`` talks to the HTTP API, and
``generate_routed`` asks the router before a transformers generation, runs it with or without
speculation as told, counts what the speculation did, and sends that back as feedback.

    client = RouterClient("http://127.0.0.1:8000")
    result = generate_routed(model, tokenizer, "Translate to French: good morning", router=client)
    print(result.text, result.decision.speculate, result.decision.gamma)

The client answers with the API's own models (router/decide/contract.py's :class:`Decision`,
router/serve/responses.py's others), the ones the server answers with and the in-process Router returns.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from analyzer.engine.engines import SERVING
from analyzer.measuring.acceptance import walk_ngram
from analyzer.measuring.prompt_encoding import context_limit, encode_prompt, eos_token_ids
from analyzer.measuring.validate import assisted_generate, count_forward_passes, greedy_generate
from analyzer.names import TRANSFORMERS
from router.decide.contract import BatchResponse, Decision
from router.serve.responses import FeedbackResponse, Health, Policies, TaskEstimate


class RouterClientError(RuntimeError):
    """The router answered with an error (``status``, ``code`` and its message) or not at all."""

    def __init__(self, status: int | None, code: str, message: str, details: Mapping[str, Any] | None = None):
        super().__init__(f"{status or 'no answer'} {code}: {message}")
        self.status, self.code, self.message, self.details = status, code, message, dict(details or {})


class RouterClient:
    """A small JSON client of the routing API (standard library only)."""

    def __init__(self, url: str, *, timeout_s: float = 5.0):
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = json.dumps(body).encode("utf-8") if body is not None else None
        request = urllib.request.Request(
            self.url + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            try:
                error = json.loads(exc.read())["error"]
            except (ValueError, KeyError, TypeError):
                raise RouterClientError(exc.code, "http_error", str(exc.reason)) from None
            raise RouterClientError(exc.code, error["code"], error["message"], error.get("details")) from None
        except (urllib.error.URLError, OSError) as exc:
            raise RouterClientError(
                None, "unreachable", f"{self.url}: {getattr(exc, 'reason', exc)}"
            ) from None

    def route(
        self,
        prompt: str | None = None,
        messages: Sequence[Mapping[str, Any]] | None = None,
        *,
        max_new_tokens: int | None = None,
        batch_size: int | None = None,
        temperature: float | None = None,
    ) -> Decision:
        """The decision for one request (see POST /v1/route)."""
        body = {
            "prompt": prompt,
            "messages": list(messages) if messages is not None else None,
            "max_new_tokens": max_new_tokens,
            "batch_size": batch_size,
            "temperature": temperature,
        }
        answer = self._call("POST", "/v1/route", {k: v for k, v in body.items() if v is not None})
        return Decision.model_validate(answer)

    def route_batch(self, requests: Sequence[Mapping[str, Any]]) -> list[Decision]:
        """Decisions for up to 1,000 request objects (see POST /v1/route/batch)."""
        return BatchResponse.model_validate(
            self._call("POST", "/v1/route/batch", {"requests": list(requests)})
        ).decisions

    def feedback(self, payload: Mapping[str, Any] | None = None, **fields: Any) -> TaskEstimate:
        """Send feedback (a payload mapping and/or fields); returns the task's estimate in force."""
        answer = self._call("POST", "/v1/feedback", {**(payload or {}), **fields})
        return FeedbackResponse.model_validate(answer).estimate

    def policies(self) -> Policies:
        """The active policy set, its online estimates and every version (see GET /v1/policies)."""
        return Policies.model_validate(self._call("GET", "/v1/policies"))

    def health(self) -> Health:
        """Liveness and what the router has loaded (see GET /healthz)."""
        return Health.model_validate(self._call("GET", "/healthz"))


@dataclass(frozen=True)
class RoutedGeneration:
    """What ``generate_routed`` did: the text and new token ids, the router's decision, the
    speculation counts (zeros when it did not speculate) and the router's answer to the feedback."""

    text: str
    output_ids: list[int]
    decision: Decision
    rounds: int
    drafted: int
    accepted: int
    feedback: TaskEstimate | None


def generate_routed(
    model,
    tokenizer,
    messages_or_prompt: str | Sequence[Mapping[str, Any]],
    *,
    router: Any,
    draft=None,
    max_new_tokens: int = 128,
    use_chat_template: bool = True,
    send_feedback: bool = True,
) -> RoutedGeneration:
    """Ask ``router`` (a RouterClient, or an in-process ``router.decide.decision.Router``), then generate
    greedily with transformers: plain, with prompt lookup (n-gram decisions), or with ``draft`` as the
    assistant at the decided gamma. Speculative runs are counted exactly: rounds = target forward
    passes; accepted = new tokens − rounds; drafted = the draft's forward passes (one per drafted
    token), or for prompt lookup the replayed proposals. Feedback goes to the router when it has a
    ``feedback`` method and the request speculated."""
    prompt, messages = (
        (messages_or_prompt, None)
        if isinstance(messages_or_prompt, str)
        else (None, [dict(m) for m in messages_or_prompt])
    )
    decision: Decision = router.route(prompt, messages, max_new_tokens=max_new_tokens)
    room = max(context_limit(model) - max_new_tokens, 1)
    ids = encode_prompt(
        tokenizer, text=prompt, messages=messages, use_chat_template=use_chat_template, max_prompt_tokens=room
    ).ids
    output, rounds, drafted, accepted = _generate(model, draft, ids, decision, max_new_tokens)
    answer = None
    if send_feedback and decision.speculate and hasattr(router, "feedback") and rounds:
        answer = router.feedback(
            {
                "route_id": decision.route_id,
                "rounds": rounds,
                "drafted": drafted,
                "accepted": accepted,
                "output_tokens": len(output),
                "gamma": decision.gamma,
                "engine": TRANSFORMERS,
            }
        )
    return RoutedGeneration(
        tokenizer.decode(output, skip_special_tokens=True),
        output,
        decision,
        rounds,
        drafted,
        accepted,
        answer,
    )


def _generate(
    model, draft, ids: list[int], decision: Decision, max_new_tokens: int
) -> tuple[list[int], int, int, int]:
    """Generate greedily as ``decision`` says (plain, prompt lookup, or with ``draft`` as the
    assistant): the new token ids, and the rounds, drafted and accepted tokens (zeros when it did not
    speculate)."""
    settings = SERVING[TRANSFORMERS].settings_in(decision.to_data()) or {}
    gamma = decision.gamma
    rounds = drafted = accepted = 0
    if not decision.speculate:
        output, _ = greedy_generate(model, ids, max_new_tokens)
    elif "prompt_lookup_num_tokens" in settings:
        ngram_max = int(settings.get("max_matching_ngram_size", 2))
        output, rounds = assisted_generate(model, ids, max_new_tokens, gamma=gamma, ngram_max=ngram_max)
        walk = walk_ngram(
            ids,
            output,
            gamma,
            max_new_tokens,
            max_ngram=ngram_max,
            eos_ids=eos_token_ids(model.generation_config.eos_token_id),
        )
        drafted, accepted = walk.drafted, walk.accepted
    else:
        if draft is None:
            raise ValueError("the router chose a draft model (assistant_model); pass draft=")
        with count_forward_passes(draft) as draft_passes:
            output, rounds = assisted_generate(model, ids, max_new_tokens, gamma=gamma, draft_model=draft)
        drafted = draft_passes.count
        accepted = min(max(len(output) - rounds, 0), drafted)
    return output, rounds, drafted, accepted
