"""Cross-validation's features with each prompt's terms counted once: the TF-IDF parts of a fold's feature
union built from one count matrix of every prompt, instead of each fold re-reading its prompts' words and
character n-grams (0.9 s of a fold's 3.3 s on the bundled corpus; its 21 folds 32.3 s -> 23.9 s on two cores,
benchmarks/bench_fold_features.py).
The pipeline's own ``fit_transform`` on the fold's training prompts and ``transform`` on its held-out ones
give the same matrices: the fold's vocabulary is the terms its training prompts hold, pruned by the
vectorizer's own ``min_df``, ``max_df`` and ``max_features`` rules on the training rows' counts, in the
vectorizer's (alphabetical) order; the values agree to the last bit's rounding (the vectorizer sums a row's
squares in the order it met the terms), the out-of-fold decision values to 3e-14 with the same predictions
(tests/test_classifier.py compares them fold by fold). Other parts of the union (the structural features,
the sentence encoder's embeddings) are fitted per fold as before."""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral

import numpy as np
from scipy import sparse
from sklearn.base import clone
from sklearn.feature_extraction.text import CountVectorizer, TfidfTransformer, TfidfVectorizer
from sklearn.pipeline import FeatureUnion, Pipeline

_COUNT_PARAMS = set(CountVectorizer().get_params())


@dataclass(frozen=True)
class _Counted:
    """One TF-IDF part: every prompt's term counts over every term (alphabetical), and the part's rules."""

    counts: sparse.csr_matrix
    vectorizer: TfidfVectorizer


@dataclass(frozen=True)
class FoldFeatures:
    """A pipeline's feature union with its TF-IDF parts counted once over ``texts``: :meth:`fold` gives a
    fold's training and held-out feature matrices. Build with :meth:`of`."""

    union: FeatureUnion
    texts: np.ndarray
    counted: dict[str, _Counted]

    @classmethod
    def of(cls, pipeline: Pipeline, texts: np.ndarray) -> FoldFeatures | None:
        """The counts of ``pipeline``'s TF-IDF parts over ``texts``; None for a pipeline that is not a
        "features" FeatureUnion with a TF-IDF part (nothing to count once) or that weighs or vocabulary-fixes
        them."""
        steps = pipeline.named_steps if isinstance(pipeline, Pipeline) else {}
        union = steps.get("features")
        if (
            list(steps) != ["features", "model"]
            or not isinstance(union, FeatureUnion)
            or union.transformer_weights
        ):
            return None
        counted = {}
        for name, part in union.transformer_list:
            if type(part) is TfidfVectorizer and part.vocabulary is None and not part.binary:
                everything = CountVectorizer(
                    **{k: v for k, v in part.get_params().items() if k in _COUNT_PARAMS}
                ).set_params(min_df=1, max_df=1.0, max_features=None)
                counted[name] = _Counted(everything.fit_transform(list(texts)).tocsr(), part)
        return cls(union, texts, counted) if counted else None

    def fold(self, train: np.ndarray, test: np.ndarray) -> tuple[sparse.csr_matrix, sparse.csr_matrix]:
        """The union's features of the ``train`` rows as its ``fit_transform`` on them gives, and of the
        ``test`` rows as the fitted union's ``transform`` gives."""
        fitted, held_out = [], []
        for name, part in self.union.transformer_list:
            if name in self.counted:
                a, b = _tfidf_fold(self.counted[name], train, test)
            else:
                own = clone(part)
                a = own.fit_transform(list(self.texts[train]))
                b = own.transform(list(self.texts[test]))
            fitted.append(a)
            held_out.append(b)
        return sparse.hstack(fitted).tocsr(), sparse.hstack(held_out).tocsr()


def _tfidf_fold(
    counted: _Counted, train: np.ndarray, test: np.ndarray
) -> tuple[sparse.csr_matrix, sparse.csr_matrix]:
    """The TF-IDF matrices of one part for a fold: the vocabulary the vectorizer would learn from the
    training rows (sklearn's CountVectorizer._limit_features rules, on the same alphabetical order), the
    idf from them."""
    rules = counted.vectorizer
    rows = counted.counts[train]
    documents = np.bincount(rows.indices, minlength=rows.shape[1])  # the training rows holding each term
    n = rows.shape[0]
    high = float(rules.max_df if isinstance(rules.max_df, Integral) else rules.max_df * n)
    low = float(rules.min_df if isinstance(rules.min_df, Integral) else rules.min_df * n)
    if high < low:
        raise ValueError("max_df corresponds to < documents than min_df")
    mask = (documents > 0) & (documents <= high) & (documents >= low)
    limit = rules.max_features
    if limit is not None and mask.sum() > limit:
        totals = np.asarray(rows.sum(axis=0)).ravel()
        chosen = (-totals[mask]).argsort()[:limit]
        limited = np.zeros(len(mask), dtype=bool)
        limited[np.where(mask)[0][chosen]] = True
        mask = limited
    kept = np.where(mask)[0]
    if len(kept) == 0:
        raise ValueError("After pruning, no terms remain. Try a lower min_df or a higher max_df.")
    tfidf = TfidfTransformer(
        norm=rules.norm, use_idf=rules.use_idf, smooth_idf=rules.smooth_idf, sublinear_tf=rules.sublinear_tf
    )
    fitted = tfidf.fit_transform(rows[:, kept])
    return fitted, tfidf.transform(counted.counts[test][:, kept])
