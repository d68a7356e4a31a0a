"""The task classifier's old import path, kept for the names the docs give with it:
``router.classify.classifier.label_finished_run`` (docs/classifier.md) and
``router.classify.classifier.evaluate`` (benchmarks/README.md), re-exported from the modules that hold
them. The classifier is laid out by concept (docs/architecture.md): task_classifier.py (the runtime model),
cross_validation.py, training.py, activation.py, version_store.py and run_labelling.py; project code
imports from those.
"""

from __future__ import annotations

from router.classify.cross_validation import evaluate
from router.classify.run_labelling import label_finished_run

__all__ = ["evaluate", "label_finished_run"]
