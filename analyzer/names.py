"""The names and limits every layer of analyzer/ (and router/, webui/) shares: the engines' and cost modes'
names, the device and dtype names, a run's defaults, and the entropy buckets a run stores. It imports nothing
of the project, so any module may import it (tests/test_layout.py keeps it so); their checks, which raise the
project's errors, are in :mod:`analyzer.checks`.

Acceptance travels between engines; cost does not (DESIGN.md, "Engines"). So every run, cost profile and
policy set records two engines: the one that **measured** the acceptance (``measured_by``: one of
:data:`ENGINES`, which measure) and the one that **priced** it (the same engine, or the engine an imported
cost profile came from, vLLM or SGLang for example).
"""

from __future__ import annotations

TRANSFORMERS, LLAMA_CPP = "transformers", "llama.cpp"
ENGINES = (TRANSFORMERS, LLAMA_CPP)  # the engines that measure (the CLI's --engine, the web form's select)
DEFAULT_ENGINE = TRANSFORMERS
# the engine entry of cost profiles imported from another engine's own benchmark (analyzer/analysis/cost_import.py):
# they price, and never measure
IMPORTED = "imported"
# llama.cpp's own C++ server: analysed by its own analysis (analyzer/analysis/server_analysis.py, not a run),
# it measures and prices there; its registry entry routes the policy sets published from those analyses
LLAMA_SERVER = "llama-server"
# SPECROUTE_ENGINE's default: the first engine of AUTO_ENGINE_ORDER that can measure the run as asked
AUTO_ENGINE = "auto"
AUTO_ENGINE_ORDER = (LLAMA_CPP, TRANSFORMERS)

# How transformers' costs are timed (DESIGN.md, "Cost model and speedup"): eager forwards, as
# generate() runs them, or forwards replayed from captured CUDA graphs over a static KV cache, as
# vLLM, SGLang and TensorRT-LLM serve (analyzer/engine/graph_cost.py; a CUDA GPU only).
EAGER, CUDA_GRAPHS = "eager", "cuda-graphs"
COST_MODES = (EAGER, CUDA_GRAPHS)
DEFAULT_COST_MODE = EAGER
# what each cost mode times, in the words a report uses
COST_MODE_WORDS = {
    EAGER: "forwards as transformers' generate() runs them",
    CUDA_GRAPHS: "steps replayed from captured CUDA graphs over a static KV cache, as serving engines run them",
}

DEVICE_CHOICES = ("auto", "cpu", "cuda", "cuda:N")
DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")
DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}
MAX_PROFILE_BATCH_SIZE = 256

DEFAULT_MARGIN = 0.05  # speculate only where the predicted speedup clears 1 + margin
DEFAULT_GAMMA_MAX = 16
# prompts a new greedy run validates with real speculative decoding when the input is left blank (a
# sampling run validates none: validation compares token for token with greedy decoding)
DEFAULT_VALIDATE = 3
# the target-entropy buckets (nats) of a run's entropy table (analyzer/measuring/entropy.py)
ENTROPY_EDGES_NATS = (0.0, 0.25, 0.5, 1.0, 2.0, 3.0, 4.0, float("inf"))
