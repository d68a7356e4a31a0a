"""Model specs, offline loading, tokenizer checks and prompt encoding (analyzer/models/loading.py).

Models are tiny Llamas built by tests/tiny_tokenizer.py and loaded back through ``hf:<folder>``; one
test loads the real builtin SmolLM2 GGUF (about 10 s on two cores) and its safetensors cache.
"""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

from analyzer.measuring.prompt_encoding import EncodedPrompt, context_limit, encode_prompt
from analyzer.models import loading
from analyzer.models.loading import load_model
from analyzer.models.specs import SpecError, TokenizerMismatch, display_name, parse_spec
from analyzer.models.tokenizer_match import check_same_tokenizer, tokenizer_fingerprint
from tests.tiny_tokenizer import TINY_WORDS, build_tiny_tokenizer, save_tiny_model_folder

# ---------------------------------------------------------------------------------------------
# parse_spec


@pytest.mark.parametrize(
    "text, kind, location, gguf_file, options, canonical",
    [
        (
            "hf:HuggingFaceTB/SmolLM2-360M",
            "hf",
            "HuggingFaceTB/SmolLM2-360M",
            None,
            {},
            "hf:HuggingFaceTB/SmolLM2-360M",
        ),
        ("  hf:gpt2  ", "hf", "gpt2", None, {}, "hf:gpt2"),
        ("hf:/models/target/", "hf", "/models/target", None, {}, "hf:/models/target"),
        ("hf:/models/../models/draft", "hf", "/models/draft", None, {}, "hf:/models/draft"),
        (
            "gguf:/models#SmolLM2.Q4_1.gguf",
            "gguf",
            "/models",
            "SmolLM2.Q4_1.gguf",
            {},
            "gguf:/models#SmolLM2.Q4_1.gguf",
        ),
        (
            "builtin:smollm2-135m-instruct",
            "builtin",
            "smollm2-135m-instruct",
            None,
            {},
            "builtin:smollm2-135m-instruct",
        ),
        (
            "builtin:SmolLM2-135M-Instruct",
            "builtin",
            "smollm2-135m-instruct",
            None,
            {},
            "builtin:smollm2-135m-instruct",
        ),
        ("ngram", "ngram", "", None, {"max_ngram": 2}, "ngram:max_ngram=2"),
        ("ngram:", "ngram", "", None, {"max_ngram": 2}, "ngram:max_ngram=2"),
        ("ngram:max_ngram=3", "ngram", "", None, {"max_ngram": 3}, "ngram:max_ngram=3"),
        ("ngram: max_ngram = 8 ", "ngram", "", None, {"max_ngram": 8}, "ngram:max_ngram=8"),
        ("ngram:max_ngram=1", "ngram", "", None, {"max_ngram": 1}, "ngram:max_ngram=1"),
    ],
)
def test_parse_spec_accepts(text, kind, location, gguf_file, options, canonical):
    ref = parse_spec(text)
    assert (ref.kind, ref.location, ref.gguf_file, ref.options, ref.canonical) == (
        kind,
        location,
        gguf_file,
        options,
        canonical,
    )
    assert parse_spec(ref.canonical) == ref  # canonical strings are fixed points


def test_parse_spec_makes_relative_folders_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert parse_spec("hf:./target").canonical == f"hf:{tmp_path / 'target'}"


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("", "accepted forms: hf:<hub id or local folder>, gguf:<folder>#<file.gguf>"),
        ("openai:gpt-4", "unrecognised model spec 'openai:gpt-4'"),
        ("HuggingFaceTB/SmolLM2-360M", "accepted forms"),
        ("ngrams", "accepted forms"),
        ("hf:", "names no model"),
        ("hf:   ", "names no model"),
        ("hf:not a model id", "neither a hub id"),
        ("gguf:/models", "gguf:<folder>#<file.gguf>"),
        ("gguf:/models#", "is not a .gguf file name"),
        ("gguf:/models#weights.bin", "'weights.bin' in 'gguf:/models#weights.bin' is not a .gguf"),
        ("gguf:#model.gguf", "names no model"),
        (
            "builtin:llama-7b",
            "unknown builtin model 'llama-7b'; known builtins: builtin:smollm2-135m-instruct",
        ),
        ("builtin:", "known builtins: builtin:smollm2-135m-instruct"),
        ("ngram:max_ngram=0", "max_ngram must be an integer from 1 to 8, got '0'"),
        ("ngram:max_ngram=9", "from 1 to 8, got '9'"),
        ("ngram:max_ngram=two", "got 'two'"),
        ("ngram:max_ngram=-1", "got '-1'"),
        ("ngram:max_ngram", "must be written name=value"),
        ("ngram:lookahead=4", "unknown n-gram option 'lookahead'"),
    ],
)
def test_parse_spec_rejects_with_a_clear_message(text, fragment):
    with pytest.raises(SpecError) as caught:
        parse_spec(text)
    assert fragment in str(caught.value)


@pytest.mark.parametrize(
    "text, name",
    [
        ("hf:HuggingFaceTB/SmolLM2-360M", "SmolLM2-360M"),
        ("hf:gpt2", "gpt2"),
        ("hf:/models/my-draft", "my-draft"),
        ("gguf:/models#SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2-135M-Instruct.Q4_1"),
        ("builtin:smollm2-135m-instruct", "SmolLM2-135M-Instruct"),
        ("ngram", "n-gram (max 2)"),
        ("ngram:max_ngram=4", "n-gram (max 4)"),
    ],
)
def test_display_name(text, name):
    assert display_name(parse_spec(text)) == name


def test_spec_refs_are_hashable_by_value():
    assert len({parse_spec("ngram"), parse_spec("ngram:max_ngram=2"), parse_spec("ngram:max_ngram=3")}) == 2


# ---------------------------------------------------------------------------------------------
# Loading tiny models through hf:<folder>


@pytest.fixture
def target_folder(tmp_path):
    return save_tiny_model_folder(tmp_path / "target", seed=0)


def test_hf_local_folder_loads_model_and_tokenizer(target_folder, tmp_path):
    loaded = load_model(parse_spec(f"hf:{target_folder}"), cache_dir=tmp_path / "cache")
    model, tokenizer = loaded.model, loaded.tokenizer
    assert isinstance(model, LlamaForCausalLM)
    assert model.training is False
    assert model.dtype == torch.float32 and model.device.type == "cpu"
    assert model.config.vocab_size == len(tokenizer) == 4 + len(TINY_WORDS)
    assert (tokenizer.eos_token, tokenizer.eos_token_id, tokenizer.bos_token_id) == ("<|im_end|>", 3, 2)
    assert model.generation_config.eos_token_id == 3
    assert context_limit(model) == 512
    assert loaded.load_seconds > 0
    assert loaded.ref.canonical == f"hf:{target_folder}"
    # The weights on disk are the seeded ones: a second folder with the same seed matches.
    again = AutoModelForCausalLM.from_pretrained(save_tiny_model_folder(tmp_path / "again", seed=0))
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))


def test_tiny_folders_differ_by_seed_and_noisy_copies_add_the_requested_noise(target_folder, tmp_path):
    base = AutoModelForCausalLM.from_pretrained(target_folder)
    other = AutoModelForCausalLM.from_pretrained(save_tiny_model_folder(tmp_path / "other", seed=1))
    assert not torch.equal(base.lm_head.weight, other.lm_head.weight)

    noisy_folder = save_tiny_model_folder(
        tmp_path / "noisy", base_model=target_folder, noise_std=0.01, seed=7
    )
    noisy = load_model(parse_spec(f"hf:{noisy_folder}"), cache_dir=tmp_path)
    differences = torch.cat(
        [
            (noisy_param - base_param).flatten()
            for noisy_param, base_param in zip(noisy.model.state_dict().values(), base.state_dict().values())
        ]
    )
    assert differences.numel() > 10_000
    assert abs(differences.std().item() - 0.01) < 0.0005
    assert abs(differences.mean().item()) < 0.0005
    check_same_tokenizer(AutoTokenizer.from_pretrained(target_folder), noisy.tokenizer, "target", "noisy")


def test_missing_local_folder_and_ngram_specs_are_not_loadable(tmp_path):
    with pytest.raises(SpecError, match="model folder .*nowhere does not exist"):
        load_model(parse_spec(f"hf:{tmp_path / 'nowhere'}"), cache_dir=tmp_path)
    with pytest.raises(SpecError, match="no model to load"):
        load_model(parse_spec("ngram:max_ngram=3"), cache_dir=tmp_path)
    with pytest.raises(SpecError, match="GGUF file 'missing.gguf' not found"):
        load_model(parse_spec(f"gguf:{tmp_path}#missing.gguf"), cache_dir=tmp_path)


def test_hub_id_without_network_is_a_clear_offline_error(tmp_path):
    ref = parse_spec("hf:specroute-tests/no-such-model-anywhere")
    with pytest.raises(SpecError, match="not available offline") as caught:
        load_model(ref, cache_dir=tmp_path, allow_network=False)
    assert "specroute-tests/no-such-model-anywhere" in str(caught.value)


# ---------------------------------------------------------------------------------------------
# Tokenizer compatibility


def test_same_tokenizer_passes_and_has_a_stable_fingerprint(target_folder):
    saved = AutoTokenizer.from_pretrained(target_folder)
    built = build_tiny_tokenizer()
    assert tokenizer_fingerprint(saved) == tokenizer_fingerprint(built)
    assert len(tokenizer_fingerprint(saved)) == 64
    assert tokenizer_fingerprint(build_tiny_tokenizer(vocab_size=50)) != tokenizer_fingerprint(built)
    check_same_tokenizer(saved, built, "target", "draft")  # does not raise


def test_a_draft_with_a_different_token_is_named_in_the_mismatch(target_folder, tmp_path):
    words = list(TINY_WORDS)
    changed_index = words.index("cat")
    words[changed_index] = "kitten"
    draft_folder = save_tiny_model_folder(tmp_path / "draft", words=words)
    target = load_model(parse_spec(f"hf:{target_folder}"), cache_dir=tmp_path)
    draft = load_model(parse_spec(f"hf:{draft_folder}"), cache_dir=tmp_path)
    with pytest.raises(TokenizerMismatch) as caught:
        check_same_tokenizer(target.tokenizer, draft.tokenizer, "tiny-target", "tiny-draft")
    message = str(caught.value)
    assert f"token id {4 + changed_index} is 'cat' in 'tiny-target' but 'kitten' in 'tiny-draft'" in message
    assert isinstance(caught.value, SpecError)


def test_vocabulary_size_and_special_id_differences_are_named():
    with pytest.raises(TokenizerMismatch, match="vocabulary sizes 143 vs 60"):
        check_same_tokenizer(build_tiny_tokenizer(), build_tiny_tokenizer(vocab_size=60), "t", "d")
    draft = build_tiny_tokenizer()
    draft.eos_token = "<pad>"
    with pytest.raises(TokenizerMismatch, match="eos token id 3 vs 1"):
        check_same_tokenizer(build_tiny_tokenizer(), draft, "t", "d")


# ---------------------------------------------------------------------------------------------
# Prompt encoding


def test_text_goes_through_the_chat_template_with_a_generation_prompt():
    tokenizer = build_tiny_tokenizer()
    encoded = encode_prompt(tokenizer, text="hello world", max_prompt_tokens=100)
    decoded = tokenizer.decode(encoded.ids)
    assert decoded == "<|im_start|>user\nhello world<|im_end|>\n<|im_start|>assistant\n"
    assert "<|im_start|>user" in decoded and decoded.endswith("<|im_start|>assistant\n")
    assert encoded == EncodedPrompt(ids=encoded.ids, truncated=False, original_tokens=len(encoded.ids))
    assert all(type(token_id) is int for token_id in encoded.ids)


def test_messages_keep_their_roles_and_plain_text_skips_the_template():
    tokenizer = build_tiny_tokenizer()
    messages = [{"role": "system", "content": "be short"}, {"role": "user", "content": "hi"}]
    decoded = tokenizer.decode(encode_prompt(tokenizer, messages=messages, max_prompt_tokens=100).ids)
    assert decoded == (
        "<|im_start|>system\nbe short<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    plain = encode_prompt(tokenizer, text="hello world", use_chat_template=False, max_prompt_tokens=100)
    assert (
        plain.ids
        == tokenizer("hello world")["input_ids"]
        == [tokenizer.convert_tokens_to_ids(t) for t in ("hello", " ", "world")]
    )


def test_long_prompts_keep_their_last_tokens():
    tokenizer = build_tiny_tokenizer()
    full = encode_prompt(tokenizer, text="one two three four five", max_prompt_tokens=1000)
    cut = encode_prompt(tokenizer, text="one two three four five", max_prompt_tokens=6)
    assert cut == EncodedPrompt(ids=full.ids[-6:], truncated=True, original_tokens=len(full.ids))
    assert len(full.ids) == 17  # 3 header + 9 words and spaces + 5 footer tokens
    assert tokenizer.decode(cut.ids) == "five<|im_end|>\n<|im_start|>assistant\n"
    exact = encode_prompt(tokenizer, text="one two three four five", max_prompt_tokens=17)
    assert exact == EncodedPrompt(ids=full.ids, truncated=False, original_tokens=17)


def test_messages_need_a_chat_template_and_bad_arguments_are_refused():
    tokenizer = build_tiny_tokenizer()
    tokenizer.chat_template = None
    with pytest.raises(SpecError, match="chat template"):
        encode_prompt(tokenizer, messages=[{"role": "user", "content": "hi"}], max_prompt_tokens=10)
    # Without a template, text falls back to plain tokenization even when the template is wanted.
    hi_id = tokenizer.convert_tokens_to_ids("hi")
    assert encode_prompt(tokenizer, text="hi", max_prompt_tokens=10).ids == [hi_id]
    templated = build_tiny_tokenizer()
    with pytest.raises(SpecError, match="exactly one of text or messages"):
        encode_prompt(templated, max_prompt_tokens=10)
    with pytest.raises(SpecError, match="exactly one of text or messages"):
        encode_prompt(
            templated, text="hi", messages=[{"role": "user", "content": "hi"}], max_prompt_tokens=10
        )
    with pytest.raises(SpecError, match=r"messages\[0\]\.content: expected a string"):
        encode_prompt(templated, messages=[{"role": "user"}], max_prompt_tokens=10)
    with pytest.raises(SpecError, match="no tokens"):
        encode_prompt(templated, text="", use_chat_template=False, max_prompt_tokens=10)
    with pytest.raises(ValueError, match="at least 1"):
        encode_prompt(templated, text="hi", max_prompt_tokens=0)


def test_context_limit_falls_back_to_2048(target_folder):
    assert context_limit(AutoModelForCausalLM.from_pretrained(target_folder)) == 512
    assert context_limit(SimpleNamespace(config=SimpleNamespace())) == 2048
    assert context_limit(SimpleNamespace(config=SimpleNamespace(max_position_embeddings=None))) == 2048


# ---------------------------------------------------------------------------------------------
# The builtin cache


def test_cache_write_is_all_or_nothing(target_folder, tmp_path, monkeypatch):
    loaded = load_model(parse_spec(f"hf:{target_folder}"), cache_dir=tmp_path)
    destination = tmp_path / "models" / "tiny"

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(loaded.tokenizer, "save_pretrained", fail)
    with pytest.raises(OSError, match="disk full"):
        loading.write_cache_atomically(loaded.model, loaded.tokenizer, destination)
    assert os.listdir(tmp_path / "models") == []  # neither the cache nor a half-written temp folder
    monkeypatch.undo()
    # What killed writers left behind: an old temp folder is reclaimed, a fresh one (alive?) is kept.
    stale, fresh = tmp_path / "models" / ".tiny.tmp-old", tmp_path / "models" / ".tiny.tmp-new"
    stale.mkdir()
    fresh.mkdir()
    two_hours_ago = time.time() - 7200
    os.utime(stale, (two_hours_ago, two_hours_ago))
    loading.write_cache_atomically(loaded.model, loaded.tokenizer, destination)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(os.listdir(destination))
    assert sorted(os.listdir(tmp_path / "models")) == [".tiny.tmp-new", "tiny"]


@pytest.mark.slow
@pytest.mark.parallel
def test_builtin_model_is_cached_as_safetensors_and_reloads_identically_in_either_precision(
    tmp_path, monkeypatch
):
    """The real GGUF dequantized once (about 4 s on two cores): its float32 safetensors copy reloads the same
    weights, and loads in bfloat16 too; both answer. The first use in another precision is
    test_a_first_use_in_bfloat16_writes_the_float32_cache_and_returns_bfloat16, on a tiny model."""
    import gguf
    from safetensors import safe_open

    from analyzer.models import gguf_fields
    from analyzer.models.devices import resolve

    parses = []

    class CountedReader(gguf_fields.QuickGGUFReader):
        def __init__(self, path, mode="r"):
            parses.append(str(path))
            super().__init__(path, mode)

    real_reader = gguf.GGUFReader
    monkeypatch.setattr(gguf_fields, "QuickGGUFReader", CountedReader)
    ref = parse_spec("builtin:smollm2-135m-instruct")
    first = load_model(ref, cache_dir=tmp_path)
    # the tokenizer, the config and the weights read the file once between them (loading.gguf_parsed_once,
    # with the quick reader), and gguf's own reader is back afterwards
    assert len(parses) == 1 and parses[0].endswith(".gguf") and gguf.GGUFReader is real_reader
    cached = tmp_path / "models" / "smollm2-135m-instruct"
    expected_files = {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"}
    assert expected_files <= set(os.listdir(cached))
    assert os.listdir(tmp_path / "models") == ["smollm2-135m-instruct"]  # no temp folder left behind
    assert "quantization_config" not in (cached / "config.json").read_text()

    def no_gguf():
        raise AssertionError("a load after the first must come from the cache, not the GGUF file")

    monkeypatch.setattr(loading, "_builtin_gguf_path", no_gguf)
    second = load_model(ref, cache_dir=tmp_path)
    assert first.model.dtype == second.model.dtype == torch.float32
    assert second.model.training is False
    assert context_limit(second.model) == 8192
    assert tokenizer_fingerprint(first.tokenizer) == tokenizer_fingerprint(second.tokenizer)
    first_weights, second_weights = first.model.state_dict(), second.model.state_dict()
    assert first_weights.keys() == second_weights.keys()
    assert all(torch.equal(first_weights[name], second_weights[name]) for name in first_weights)

    prompt = encode_prompt(second.tokenizer, text="What is the capital of France?", max_prompt_tokens=256)
    assert second.tokenizer.decode(prompt.ids).endswith("<|im_start|>assistant\n")
    input_ids = torch.tensor([prompt.ids])
    with torch.no_grad():
        outputs = [
            loaded.model.generate(input_ids, max_new_tokens=8, do_sample=False)[0, len(prompt.ids) :]
            for loaded in (first, second)
        ]
    assert outputs[0].tolist() == outputs[1].tolist()
    assert len(outputs[0]) == 8
    assert "Paris" in second.tokenizer.decode(outputs[0])  # the dequantized model still works

    placement = resolve("cpu", "bfloat16")
    half = load_model(ref, cache_dir=tmp_path, placement=placement)  # from the float32 cache
    assert {p.dtype for p in half.model.parameters()} == {torch.bfloat16} and half.placement == placement
    with safe_open(str(cached / "model.safetensors"), framework="pt") as stored:
        assert {stored.get_tensor(name).dtype for name in list(stored.keys())[:5]} == {torch.float32}
    half_weights = half.model.state_dict()
    assert all(torch.equal(half_weights[n], second_weights[n].to(torch.bfloat16)) for n in second_weights)
    with torch.no_grad():
        output = half.model.generate(input_ids, max_new_tokens=8, do_sample=False)[0, len(prompt.ids) :]
    assert "Paris" in half.tokenizer.decode(output)  # bfloat16 still answers


def test_a_first_use_in_bfloat16_writes_the_float32_cache_and_returns_bfloat16(
    target_folder, tmp_path, monkeypatch
):
    """A builtin model first loaded in bfloat16: dequantized in float32 (here a tiny model stands in for the
    GGUF file), cached in float32 whatever the run's dtype, then loaded from the cache in bfloat16."""
    from safetensors import safe_open

    from analyzer.models.devices import resolve

    tiny = load_model(parse_spec(f"hf:{target_folder}"), cache_dir=tmp_path / "unused")
    dequantized = []

    def from_gguf(folder, gguf_file, *, allow_network):
        dequantized.append(gguf_file)
        return tiny.model, tiny.tokenizer

    monkeypatch.setattr(loading, "_builtin_gguf_path", lambda: tmp_path / "SmolLM2.gguf")
    monkeypatch.setattr(loading, "_load_gguf", from_gguf)
    placement = resolve("cpu", "bfloat16")
    half = load_model(parse_spec("builtin:smollm2-135m-instruct"), cache_dir=tmp_path, placement=placement)
    assert dequantized == ["SmolLM2.gguf"]
    assert {p.dtype for p in half.model.parameters()} == {torch.bfloat16} and half.placement == placement
    cached = tmp_path / "models" / "smollm2-135m-instruct"
    with safe_open(str(cached / "model.safetensors"), framework="pt") as stored:
        assert {stored.get_tensor(name).dtype for name in stored.keys()} == {torch.float32}
        assert all(
            torch.equal(stored.get_tensor(name).to(torch.bfloat16), half.model.state_dict()[name])
            for name in stored.keys()
        )
    again = load_model(parse_spec("builtin:smollm2-135m-instruct"), cache_dir=tmp_path, placement=placement)
    assert dequantized == ["SmolLM2.gguf"]  # the cache, not the GGUF file, the second time
    assert next(again.model.parameters()).dtype == torch.bfloat16
