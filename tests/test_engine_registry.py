"""One engine interface: every engine is an object of the registry
(analyzer/engine/engines.py) implementing analyzer.engine.engine_base.Engine, and code outside the registry and the
engines' own modules asks it rather than comparing engine names. The scan below fails on a comparison
with an engine's name or a cost mode's, in Python (any ``==``, ``!=``, ``in`` or ``not in`` with such a
constant or its name) and in the templates."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from analyzer import checks, names
from analyzer.engine import engine_base
from analyzer.engine.engines import (
    COST_SOURCES,
    MEASURING,
    REGISTRY,
    SERVING,
    analyzes_settings,
    engine_named,
    measuring_engine,
    pricing_entry,
)
from analyzer.run_params import RunError, RunParams

ROOT = Path(__file__).resolve().parent.parent
# the names and their checks, the registry, the protocols, and the engines' own modules: the only places a name may
# be compared
ENGINE_MODULES = {
    "analyzer/names.py",
    "analyzer/checks.py",
    "analyzer/engine/engine_base.py",
    "analyzer/engine/engines.py",
    "analyzer/engine/engine_transformers.py",
    "analyzer/engine/engine_llamacpp.py",
    "analyzer/engine/engine_imported.py",
    "analyzer/engine/engine_llama_server.py",
    "analyzer/engine/run_models.py",
    "analyzer/engine/graph_cost.py",
    "analyzer/engine/llamacpp_run.py",
    "analyzer/engine/llamacpp_engine.py",
    "analyzer/engine/llamacpp_cost.py",
    "analyzer/engine/llamacpp_speculative.py",
}
NAMES = {*REGISTRY, *names.COST_MODES}
CONSTANTS = {"TRANSFORMERS", "LLAMA_CPP", "IMPORTED", "LLAMA_SERVER", "EAGER", "CUDA_GRAPHS"}


def _names_in(node: ast.AST) -> bool:
    """Whether ``node`` is an engine or cost-mode name: the string itself, its constant, or a tuple,
    list or set of them."""
    if isinstance(node, ast.Constant):
        return node.value in NAMES
    if isinstance(node, (ast.Name, ast.Attribute)):
        return (node.id if isinstance(node, ast.Name) else node.attr) in CONSTANTS
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_in(element) for element in node.elts)
    return False


# the registries' tables: looking an entry up by name there is how callers ask an engine
TABLES = {
    "MEASURING",
    "SERVING",
    "COST_SOURCES",
    "REGISTRY",
    "SERVING_ENGINES",
    "EXPORTERS",
    "FEEDBACK_FORMATS",
}


def _is_table(node: ast.AST) -> bool:
    return (node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)) in TABLES


def engine_name_comparisons(source: str) -> list[int]:
    """The lines of ``source`` that compare something with an engine's or a cost mode's name, or read a result
    by one (``decision["engine"]["transformers"]``, ``.get(LLAMA_CPP)``) anywhere but in a registry's table."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(_names_in(side) for side in [node.left, *node.comparators]):
            lines.append(node.lineno)
        elif isinstance(node, ast.Subscript) and _names_in(node.slice) and not _is_table(node.value):
            lines.append(node.lineno)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and node.args
            and _names_in(node.args[0])
            and not _is_table(node.func.value)
        ):
            lines.append(node.lineno)
    return sorted(set(lines))


def test_the_scan_finds_each_kind_of_comparison():
    code = (
        "a = x == 'llama.cpp'\n"
        "b = engine != TRANSFORMERS\n"
        "c = mode in (EAGER, 'other')\n"
        "d = params.cost_mode == engines.CUDA_GRAPHS\n"
        "e = x == 'vllm'\n"
        "f = name in REGISTRY\n"
        "g = decision['engine']['transformers']\n"
        "h = settings.get(LLAMA_CPP)\n"
        "i = SERVING[TRANSFORMERS].decision_settings\n"
        "j = engines.SERVING_ENGINES['llama-server']\n"
    )
    assert engine_name_comparisons(code) == [1, 2, 3, 4, 7, 8]


def _product_files():
    for folder in ("analyzer", "router", "webui"):
        yield from sorted((ROOT / folder).rglob("*.py"))


def test_no_engine_name_is_compared_outside_the_registry_and_the_engines_own_modules():
    found = {}
    for path in _product_files():
        relative = path.relative_to(ROOT).as_posix()
        if relative in ENGINE_MODULES:
            continue
        lines = engine_name_comparisons(path.read_text())
        if lines:
            found[relative] = lines
    assert found == {}


def test_no_template_compares_an_engine_or_cost_mode_name():
    names = "|".join(re.escape(name) for name in sorted(NAMES))
    comparison = re.compile(rf"""(==|!=)\s*['"]({names})['"]|['"]({names})['"]\s*(==|!=)""")
    found = {
        path.name: [m.group(0) for m in comparison.finditer(path.read_text())]
        for path in sorted((ROOT / "webui" / "templates").glob("*.html"))
        if comparison.search(path.read_text())
    }
    assert found == {}


def test_the_registry_holds_every_engine_and_the_measuring_ones_are_the_engines_runs_name():
    assert list(MEASURING) == list(names.ENGINES)
    assert [name for name, source in COST_SOURCES.items() if source.measures] == list(names.ENGINES)
    assert {name: engine.name for name, engine in REGISTRY.items()} == {n: n for n in REGISTRY}
    assert engine_named(None).name == names.DEFAULT_ENGINE  # runs stored before engines
    assert MEASURING["transformers"].cost_modes == names.COST_MODES
    assert MEASURING["llama.cpp"].cost_modes == ()
    assert pricing_entry("vllm", "imported").name == "imported"
    assert pricing_entry("llama.cpp", "measured").name == "llama.cpp"
    with pytest.raises(
        checks.EngineError, match="unknown engine 'vllm'; use one of: transformers, llama.cpp"
    ):
        measuring_engine("vllm")
    with pytest.raises(checks.EngineError, match="unknown engine 'tgi'; known: transformers, llama.cpp"):
        engine_named("tgi")


def test_each_engine_implements_only_its_capabilities():
    """An engine is in the table of each capability it has (measuring runs, serving a decision, being a cost
    source) and implements that interface whole; no entry carries methods that only refuse."""
    assert list(MEASURING) == ["transformers", "llama.cpp"]
    assert list(SERVING) == ["transformers", "llama.cpp", "llama-server"]
    assert list(COST_SOURCES) == ["transformers", "llama.cpp", "imported", "llama-server"]
    tables = ((MEASURING, engine_base.MeasuringEngine), (SERVING, engine_base.ServingEngine),
              (COST_SOURCES, engine_base.CostSource))  # fmt: skip
    for table, protocol in tables:
        wanted = {n for n in dir(protocol) if not n.startswith("_")} | set(protocol.__annotations__)
        for name, engine in table.items():
            missing = [m for m in sorted(wanted) if not hasattr(engine, m)]
            assert missing == [], (name, protocol.__name__, missing)
    for name, engine in REGISTRY.items():  # what an entry has beyond its tables' interfaces: nothing
        own = {n for n in dir(type(engine)) if not n.startswith("_")}
        allowed = set()
        for table, protocol in tables:
            if name in table:
                allowed |= {n for n in dir(protocol) if not n.startswith("_")} | set(protocol.__annotations__)
        assert own <= allowed, (name, sorted(own - allowed))
    assert not hasattr(REGISTRY["imported"], "check_params") and not hasattr(REGISTRY["llama-server"], "load")
    assert (
        analyzes_settings("llama-server")
        and not analyzes_settings("llama.cpp")
        and not analyzes_settings(None)
    )


def test_each_engine_refuses_what_it_cannot_measure_and_the_imported_entry_measures_nothing():
    transformers, llama_cpp = (MEASURING[n] for n in ("transformers", "llama.cpp"))
    imported = COST_SOURCES["imported"]
    transformers.check_params(RunParams(temperature=0.7, dtype="bfloat16", batch_size=1))
    with pytest.raises(RunError, match="greedy decoding only"):
        llama_cpp.check_params(RunParams(engine="llama.cpp", temperature=0.7))
    assert not imported.measures and "imported" not in MEASURING and "imported" not in SERVING
    # the cost mode a run stores: the setting is transformers' default, llama.cpp times its own way
    assert transformers.cost_mode_for(None, "cuda-graphs") == "cuda-graphs"
    assert transformers.cost_mode_for("eager", "cuda-graphs") == "eager"
    assert llama_cpp.cost_mode_for(None, "cuda-graphs") == "eager"
    assert imported.profile_note({"engine": "vllm", "engine_version": "0.11"}) == (
        "imported from vllm 0.11's own benchmark, not judged here"
    )
    assert COST_SOURCES["transformers"].profile_note({}) is None
    assert llama_cpp.replay_mode("Q4_1").startswith("greedy (")


def test_each_engine_says_a_routing_decision_in_its_own_terms():
    """The router asks every entry for the decision's settings (router/decide/decision.py names no engine):
    transformers gets generate() kwargs, llama.cpp the pool and what its server speculates with, the
    imported entry is no serving engine (its engine is configured by its own server's flags)."""
    transformers, llama_cpp = (SERVING[n] for n in ("transformers", "llama.cpp"))
    assert transformers.decision_settings(True, 4, "ngram", 3, "p") == {
        "prompt_lookup_num_tokens": 4,
        "max_matching_ngram_size": 3,
    }
    assert transformers.decision_settings(True, 2, "hf", 3, "p")["assistant_generation_config"] == {
        "num_assistant_tokens": 2,
        "num_assistant_tokens_schedule": "constant",
        "assistant_confidence_threshold": 0.0,
    }
    assert transformers.decision_settings(False, 0, "ngram", 3, "p") == {"assistant_model": False}
    assert llama_cpp.decision_settings(True, 5, "hf", 3, "spec-k5") == {
        "pool": "spec-k5",
        "speculative": {"draft": "model", "n_max": 5},
    }
    assert llama_cpp.decision_settings(False, 0, "ngram", 3, "plain") == {
        "pool": "plain",
        "speculative": None,
    }
    assert "imported" not in SERVING
    server = SERVING["llama-server"]
    assert (
        server.decision_settings(True, 2, "llama-server", 3, "p", "ngram-simple 2/4")["setting"]
        == "ngram-simple 2/4"
    )
    assert server.decision_settings(True, 4, "ngram", 3, "p") is None  # a run's gamma is no server setting
    decision = (Path(__file__).resolve().parents[1] / "router" / "decide" / "decision.py").read_text("utf-8")
    code = re.sub(r'""".*?"""', "", decision, flags=re.S)  # docstrings may name engines; the code does not
    assert "llama.cpp" not in code and "transformers" not in code


def test_each_serving_engine_has_its_decision_terms_export_and_feedback_where_it_has_them():
    """router/export/serving.py: one entry per serving engine with only the capabilities it has;
    the export pages and ``--for`` offer its exporters, feedback reads its sections, and a decision's terms are
    read through the entry, not by name."""
    from router.decide.feedback import FeedbackError, normalise
    from router.decide.feedback_body import FEEDBACK_FIELDS
    from router.decide.feedback_formats import FEEDBACK_FORMATS
    from router.export.serving import EXPORTERS, SERVING_ENGINES

    has = {
        name: (e.decides is not None, e.exporter is not None, e.feedback.key if e.feedback else None)
        for name, e in SERVING_ENGINES.items()
    }
    assert has == {
        "vllm": (False, True, "speculative_decoding"),
        "sglang": (False, True, "meta_info"),
        "trtllm": (False, True, None),
        "llama-server": (True, True, "timings"),
        "transformers": (True, True, None),
        "llama.cpp": (True, False, None),
    }
    assert list(EXPORTERS) == ["vllm", "sglang", "trtllm", "llama-server", "transformers"]
    assert all(EXPORTERS[name].name == name for name in EXPORTERS)
    assert {e.decides.name for e in SERVING_ENGINES.values() if e.decides} == set(SERVING)
    assert {n: e.feedback for n, e in SERVING_ENGINES.items() if e.feedback} == FEEDBACK_FORMATS
    assert {f.key for f in FEEDBACK_FORMATS.values()} <= set(FEEDBACK_FIELDS)
    decision = {"engine": {"transformers": {"prompt_lookup_num_tokens": 3}, "llama-server": None}}
    assert SERVING_ENGINES["transformers"].settings_in(decision) == {"prompt_lookup_num_tokens": 3}
    assert SERVING_ENGINES["llama-server"].settings_in(decision) is None
    assert SERVING_ENGINES["vllm"].settings_in(decision) is None  # no terms of its own in a decision
    # each section is read by its engine's format
    counts = {
        "timings": {"draft_n": 10, "draft_n_accepted": 6, "predicted_n": 20},
        "speculative_decoding": {"num_drafts": 5, "num_draft_tokens": 10, "num_accepted_tokens": 6},
        "meta_info": {"spec_verify_ct": 5, "spec_num_correct_drafts": 6, "spec_num_proposed_drafts": 10},
    }
    read = {key: normalise({key: section}) for key, section in counts.items()}
    assert {k: (c.engine, c.rounds, c.drafted, c.accepted) for k, c in read.items()} == {
        "timings": ("llama.cpp", 14, 10, 6),
        "speculative_decoding": ("vllm", 5, 10, 6),
        "meta_info": ("sglang", 5, 10, 6),
    }
    with pytest.raises(
        FeedbackError, match="give one engine's section, not 2: 'speculative_decoding', 'timings'"
    ):
        normalise({"timings": counts["timings"], "speculative_decoding": counts["speculative_decoding"]})
