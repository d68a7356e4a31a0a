"""The cuda-graphs mode's harness (analyzer/engine/graph_cost.py) on the CPU, where it runs the very same
static-cache steps without capturing graphs: its forwards must give the logits of transformers' own
cached forward, its greedy decoding transformers' greedy output, and its speculative decoding the same
output in exactly as many target forwards as transformers' assisted generation and prompt lookup."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import DynamicCache, LlamaForCausalLM

from analyzer.engine.graph_cost import (
    CACHE_LENGTH_STEP,
    GraphCostError,
    GraphDecoder,
    StaticModel,
    cache_length,
    time_graph_forwards_checked,
)
from analyzer.measuring.cost import _cache_argument
from analyzer.measuring.validate import assisted_generate, greedy_generate
from tests.test_validate import EOS_PROMPT, PROMPTS
from tests.tiny_models import EOS_ID, make_noisy_copy, make_tiny_model


@pytest.fixture(scope="module")
def target():
    return make_tiny_model(seed=0)


@pytest.fixture(scope="module")
def noisy(target):
    return make_noisy_copy(target, noise_std=0.005, seed=1)


def grouped_query_model(attention: str) -> LlamaForCausalLM:
    """A tiny Llama with 4 query heads sharing 2 key/value heads (as SmolLM2's 9 share 3)."""
    return make_tiny_model(seed=3, kv_heads=2, attention=attention)


def dynamic_logits(model, context: list[int], new: list[int], batch_size: int = 1) -> torch.Tensor:
    """Logits of ``new`` after ``context`` through transformers' own DynamicCache."""
    cache = DynamicCache(config=model.config)
    argument = {_cache_argument(model): cache}  # `cache` in transformers 5.2x, `past_key_values` before
    with torch.inference_mode():
        model(input_ids=torch.tensor([context] * batch_size), use_cache=True, **argument)
        return model(input_ids=torch.tensor([new] * batch_size), use_cache=True, **argument).logits


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_a_static_step_gives_the_logits_of_a_cached_forward_again_and_again(attention):
    model = grouped_query_model(attention)
    context = PROMPTS[0]
    static = StaticModel(model, 2, cache_length(len(context) + 5), capture=False)
    static.prefill(context)
    for k in (1, 3, 5, 1):  # every step writes the same positions: nothing needs cropping
        new = PROMPTS[1][:k]
        expected = dynamic_logits(model, context, new, batch_size=2)
        assert torch.allclose(static.step(new, len(context)), expected, atol=1e-5)
    # a later step of a longer sequence sees the positions written before it, not stale ones
    static.step(PROMPTS[2][:4], len(context))
    expected = dynamic_logits(model, context + PROMPTS[2][:2], PROMPTS[2][2:3], batch_size=2)
    assert torch.allclose(static.step(PROMPTS[2][2:3], len(context) + 2), expected, atol=1e-5)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_the_step_a_graph_captures_reads_nothing_back_to_the_host(attention):
    """A host read (.item(), a Python branch on a tensor) inside a step would break CUDA graph capture;
    on the meta device every such read raises, so a step that runs there has none."""
    model = grouped_query_model(attention).to("meta")
    static = StaticModel(model, 2, 256, capture=False)
    static.prefill([5, 6, 7, 8])
    for k, start in ((1, 4), (3, 4), (1, 7)):  # one token takes the grouped-query packing branch
        logits = static.step(PROMPTS[0][:k], start)
        assert logits.device.type == "meta" and tuple(logits.shape) == (2, k, 97)
    with pytest.raises(RuntimeError, match="meta"):
        static.step([1], 8)[0, 0, 0].item()  # the read itself, outside the step


def test_steps_that_do_not_fit_the_cache_are_refused(target):
    static = StaticModel(target, 1, 16, capture=False)
    with pytest.raises(ValueError, match="does not fit"):
        static.step([5, 6], 15)
    with pytest.raises(ValueError, match="do not fit"):
        static.prefill(list(range(3, 20)))


@pytest.fixture
def graphs_played_on_the_cpu(monkeypatch):
    """torch.cuda's stream and graph calls as a CPU can play them, so that the capturing code runs: the
    warm-ups run eagerly (as on a GPU), the captured body runs once too (a GPU only records it: the
    same writes), and a replay runs the captured step again into its static output. Returns the
    graphs made."""
    import contextlib
    import types

    from analyzer.engine import graph_cost

    graphs, capturing = [], []

    class Graph:
        def __init__(self):
            self.step, self.replays = None, 0
            graphs.append(self)

        def replay(self):
            static, input_ids, logits = self.step
            logits.copy_(forward(static, input_ids))
            self.replays += 1

    class Stream:
        def wait_stream(self, other):
            pass

    @contextlib.contextmanager
    def capture(graph, **options):
        capturing.append(graph)
        try:
            yield
        finally:
            capturing.pop()

    forward = graph_cost.StaticModel._forward

    def recorded_forward(self, input_ids):
        logits = forward(self, input_ids)
        if capturing:
            capturing[-1].step = (self, input_ids, logits)
        return logits

    construct = graph_cost.StaticModel.__init__

    def construct_capturing(self, model, batch_size, max_len, *, capture):
        construct(self, model, batch_size, max_len, capture=False)  # past the CPU's refusal
        self.capture = capture

    monkeypatch.setattr(graph_cost.StaticModel, "_forward", recorded_forward)
    monkeypatch.setattr(graph_cost.StaticModel, "__init__", construct_capturing)
    fake = types.SimpleNamespace(
        Stream=lambda device: Stream(),
        current_stream=lambda device: Stream(),
        stream=lambda stream: contextlib.nullcontext(),
        CUDAGraph=Graph,
        graph=capture,
        synchronize=lambda device: None,
    )
    monkeypatch.setattr(torch, "cuda", fake)
    return graphs


def test_captured_steps_replayed_decode_exactly_as_transformers(target, noisy, graphs_played_on_the_cpu):
    """Capturing runs warm-ups that write into the cache: they must write what the step will, where
    it will, or they corrupt the context (a warm-up writing at the previous step's position, say)."""
    drafted = GraphDecoder(target, noisy, ngram_max=None, eos_ids=[EOS_ID], capture=True)
    lookup = GraphDecoder(target, None, ngram_max=2, eos_ids=[EOS_ID], capture=True)
    for prompt in PROMPTS + [EOS_PROMPT, [7]]:
        greedy = greedy_generate(target, prompt, 17, eos_token_id=[EOS_ID])
        assert drafted.greedy(prompt, 17) == greedy
        assert drafted.speculative(prompt, 17, 3) == assisted_generate(
            target, prompt, 17, gamma=3, draft_model=noisy, eos_token_id=[EOS_ID]
        )
        assert lookup.speculative(prompt, 17, 4) == assisted_generate(
            target, prompt, 17, gamma=4, ngram_max=2, eos_token_id=[EOS_ID]
        )
    captured = {graph.step[2].shape[1] for graph in graphs_played_on_the_cpu}
    assert captured == {
        1,
        2,
        3,
        4,
        5,
    }  # k = 1 (plain steps, draft steps), 2 (the draft's catch-up), ..., gamma + 1
    assert all(graph.replays > 0 for graph in graphs_played_on_the_cpu)


def test_replayed_graph_timings_cover_every_k(target, graphs_played_on_the_cpu):
    timings, _ = time_graph_forwards_checked(target, PROMPTS[0], 4, repeats=2, capture=True)
    assert len(timings) == 4 and sorted(g.step[2].shape[1] for g in graphs_played_on_the_cpu) == [1, 2, 3, 4]


def test_capturing_cuda_graphs_on_a_cpu_is_refused_with_a_clear_error(target):
    with pytest.raises(GraphCostError, match="CUDA graphs need a model on a CUDA GPU, not on cpu"):
        StaticModel(target, 1, 64, capture=True)


def test_cache_lengths_grow_in_steps():
    assert [cache_length(n) for n in (1, CACHE_LENGTH_STEP, CACHE_LENGTH_STEP + 1)] == [
        CACHE_LENGTH_STEP,
        CACHE_LENGTH_STEP,
        2 * CACHE_LENGTH_STEP,
    ]


@pytest.mark.parametrize("prompt", PROMPTS + [EOS_PROMPT, [7]])
def test_graph_greedy_decoding_is_transformers_greedy_decoding(target, prompt):
    decoder = GraphDecoder(target, None, ngram_max=2, eos_ids=[EOS_ID], capture=False)
    assert decoder.greedy(prompt, 24) == greedy_generate(target, prompt, 24, eos_token_id=[EOS_ID])


@pytest.mark.parametrize("gamma", [1, 3, 5])
@pytest.mark.parametrize("max_new_tokens", [1, 2, 17])
def test_graph_speculation_with_a_model_draft_matches_assisted_generation(
    target, noisy, gamma, max_new_tokens
):
    decoder = GraphDecoder(target, noisy, ngram_max=None, eos_ids=[EOS_ID], capture=False)
    for prompt in PROMPTS + [EOS_PROMPT]:
        expected_ids, expected_passes = assisted_generate(
            target, prompt, max_new_tokens, gamma=gamma, draft_model=noisy, eos_token_id=[EOS_ID]
        )
        ids, passes = decoder.speculative(prompt, max_new_tokens, gamma)
        assert ids == greedy_generate(target, prompt, max_new_tokens, eos_token_id=[EOS_ID])[0]
        assert (ids, passes) == (expected_ids, expected_passes)


def test_an_identical_draft_takes_ceil_n_over_gamma_plus_one_rounds(target):
    decoder = GraphDecoder(target, copy.deepcopy(target), ngram_max=None, eos_ids=[], capture=False)
    ids, passes = decoder.speculative(PROMPTS[0], 20, 3)
    assert len(ids) == 20 and passes == 5


@pytest.mark.parametrize("gamma", [2, 6])
@pytest.mark.parametrize("ngram_max", [1, 3])
def test_graph_speculation_with_prompt_lookup_matches_transformers(target, gamma, ngram_max):
    decoder = GraphDecoder(target, None, ngram_max=ngram_max, eos_ids=[EOS_ID], capture=False)
    for prompt in PROMPTS + [EOS_PROMPT]:
        expected = assisted_generate(
            target, prompt, 40, gamma=gamma, ngram_max=ngram_max, eos_token_id=[EOS_ID]
        )
        assert decoder.speculative(prompt, 40, gamma) == expected
        assert expected[1] < 40 or prompt is EOS_PROMPT  # the lookup found drafts: fewer rounds than tokens


def test_a_decoder_grows_its_caches_for_a_longer_prompt_and_stays_exact(target, noisy):
    decoder = GraphDecoder(target, noisy, ngram_max=None, eos_ids=[EOS_ID], capture=False)
    decoder.speculative(PROMPTS[0], 8, 2)
    assert decoder.target.max_len == CACHE_LENGTH_STEP
    long_prompt = (PROMPTS[0] * 25)[: CACHE_LENGTH_STEP - 4]
    expected = assisted_generate(target, long_prompt, 12, gamma=2, draft_model=noisy, eos_token_id=[EOS_ID])
    assert decoder.speculative(long_prompt, 12, 2) == expected
    assert decoder.target.max_len == decoder.draft.max_len == 2 * CACHE_LENGTH_STEP


def test_timed_forwards_count_every_forward_of_both_models(target, noisy):
    decoder = GraphDecoder(target, noisy, ngram_max=None, eos_ids=[], capture=False)
    decoder.prepare_for(PROMPTS[0], 10, 3)
    with decoder.timed_forwards() as times:
        ids, passes = decoder.speculative(PROMPTS[0], 10, 3)
    # two prefills, one target step per round, and at least one draft step in every round but the last
    assert len(ids) == 10 and passes >= 3 and len(times) >= 2 + passes + passes - 1
    assert all(t > 0 for t in times)
    counted = len(times)
    decoder.greedy(PROMPTS[0], 4)
    assert len(times) == counted  # nothing is appended after the block
    with decoder.timed_forwards() as greedy_times:
        decoder.greedy(PROMPTS[0], 4, stop_ids=[])
    assert len(greedy_times) == 1 + 4  # the prefill and one step per token


def test_graph_timings_cover_every_k_and_say_how_trustworthy_they_are(target):
    timings, quality = time_graph_forwards_checked(target, PROMPTS[0], 4, repeats=3, capture=False)
    assert len(timings) == 4 and all(t > 0 for t in timings)
    assert len(quality.spread) == 4  # one relative spread per k, judged like eager forwards


def test_a_decoder_needs_exactly_one_kind_of_draft(target, noisy):
    with pytest.raises(ValueError, match="not both or neither"):
        GraphDecoder(target, noisy, ngram_max=2, eos_ids=[], capture=False)
    with pytest.raises(ValueError, match="not both or neither"):
        GraphDecoder(target, None, ngram_max=None, eos_ids=[], capture=False)


def test_the_overhead_is_the_wall_time_outside_the_forwards_per_pass_less_the_lookup(monkeypatch):
    """overhead_of, which both modes share, on a scripted clock: a plain generation of 4 passes takes
    10 s of which 6 s are forwards (1 s per pass outside them); a speculative one of 2 passes takes 9 s
    of which 4 s are forwards (2.5 s per round, less a 0.5 s lookup = 2 s)."""
    import contextlib

    from analyzer.engine import overhead

    clock = {"now": 0.0}
    monkeypatch.setattr(overhead, "perf_counter", lambda: clock["now"])
    forwards: list[float] = []

    @contextlib.contextmanager
    def timed():
        forwards.clear()
        yield forwards

    def generate(speculative: bool) -> int:
        clock["now"] += 9.0 if speculative else 10.0
        forwards.extend([2.0, 2.0] if speculative else [1.5] * 4)
        return 2 if speculative else 4

    calls = []
    measured = overhead.overhead_of(
        generate,
        timed,
        torch.device("cpu"),
        new_tokens=4,
        lookup_s=0.5,
        repeats=3,
        on_generate=calls.append,
    )
    assert (measured.decode_s, measured.round_s, measured.repeats) == (1.0, 2.0, 3)
    assert calls == [1] * 6  # every timed generation, in attempt 1


def test_a_capture_that_fails_says_so_and_what_to_use_instead(target, monkeypatch):
    """What a GPU would raise when a model's forward cannot be captured, played on the CPU: torch's
    stream and graph calls stand in, the capture raises, and the error names the step and the way out."""
    import contextlib
    import types

    class Stream:
        def wait_stream(self, other):
            pass

    def failing_capture(graph, **options):
        assert options == {"capture_error_mode": "thread_local"}
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing\nmore")

    monkeypatch.setattr(
        torch,
        "cuda",
        types.SimpleNamespace(
            Stream=lambda device: Stream(),
            current_stream=lambda device: Stream(),
            stream=lambda stream: contextlib.nullcontext(),
            CUDAGraph=object,
            graph=failing_capture,
            synchronize=torch.cuda.synchronize,
        ),
    )
    static = StaticModel(target, 1, 64, capture=False)
    static.capture = True
    with pytest.raises(GraphCostError) as caught:
        static.step([5, 6], 3)
    assert str(caught.value) == (
        "capturing the CUDA graph of a 2-token step of LlamaForCausalLM failed (CUDA error: operation not "
        "permitted when stream is capturing); time this model with --cost-mode eager"
    )
