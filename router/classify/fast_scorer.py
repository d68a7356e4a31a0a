"""The classifier's routing fast path: a fitted TF-IDF + structural-features + linear-model pipeline
evaluated on one prompt with numpy, without scikit-learn's per-call overhead (the same analyzers,
vocabularies, idf weights, scaling and weights; a test checks the probabilities are equal)."""

from __future__ import annotations

from typing import Sequence, cast

import numpy as np
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.pipeline import Pipeline

from analyzer.errors import SpecrouteError
from router.classify.features import structural_row


class ScorerError(SpecrouteError, RuntimeError):
    """The pipeline has a part the fast path cannot evaluate."""

    status, code = 500, "scorer_unsupported"


def _char_wb_ngrams(text: str, min_n: int, max_n: int) -> list[str]:
    """The same multiset of n-grams as scikit-learn's ``char_wb`` analyzer (after preprocessing):
    per whitespace-separated word padded with one space each side, every n-gram for n = min_n..max_n,
    and a word no longer than n counted once as a whole."""
    grams: list[str] = []
    for word in text.split():
        padded = f" {word} "
        length = len(padded)
        for n in range(min_n, max_n + 1):
            if length <= n:
                grams.append(padded)
                break
            grams.extend([padded[i : i + n] for i in range(length - n + 1)])
    return grams


_HASH_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)
_LENGTH_SALT = np.uint64(0xD6E8FEB86659FD93)
_SPACE = 32


def _codes(text: str) -> np.ndarray:
    # surrogatepass: a lone surrogate (which no API body passes any more) is one code like any other
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)


class _CharGramTable:
    """``char_wb`` n-gram lookup in numpy. With min_n >= 2, the char_wb n-grams of a text are exactly
    the length-n windows of " " + " ".join(words) + " " with no space strictly inside (a word's padded
    form, whole, is such a window when it is no longer than n). Each window gets a 64-bit rolling hash
    salted with n; the vocabulary's n-grams are hashed the same way once and sorted (``indices`` maps a
    position in that order to the vocabulary index), and every window of every n is looked up with one
    searchsorted; a word's hits are kept for its next occurrence (in any prompt)."""

    WORD_CACHE_SIZE = 50_000

    def __init__(self, vocabulary: dict[str, int], min_n: int, max_n: int):
        self.min_n, self.max_n = min_n, max_n
        keys, indices = [], []
        for n in range(min_n, max_n + 1):
            grams = [g for g in vocabulary if len(g) == n]
            if grams:
                codes = _codes("".join(grams)).astype(np.uint64).reshape(len(grams), n)
                hashes = codes[:, 0].copy()
                with np.errstate(over="ignore"):
                    for j in range(1, n):
                        hashes = hashes * _HASH_MULTIPLIER + codes[:, j]
                    keys.append(hashes + np.uint64(n) * _LENGTH_SALT)
                indices.append(np.asarray([vocabulary[g] for g in grams], dtype=np.intp))
        keys_all = np.concatenate(keys) if keys else np.zeros(0, np.uint64)
        order = np.argsort(keys_all)
        self.keys = keys_all[order]
        self.indices = (np.concatenate(indices) if indices else np.zeros(0, np.intp))[order]
        if np.any(self.keys[1:] == self.keys[:-1]):
            raise ScorerError("char n-gram hash collision in the vocabulary")
        with np.errstate(over="ignore"):
            self._salts = [np.uint64(n) * _LENGTH_SALT for n in range(max_n + 1)]
        self._word_hits: dict[str, np.ndarray] = {}

    def warm(self, words: Sequence[str]) -> None:
        """Cache these words' hits now (the loader passes the word vocabulary's single words)."""
        distinct = list(dict.fromkeys(w for w in words if w and not any(c.isspace() for c in w)))
        distinct = distinct[: self.WORD_CACHE_SIZE // 2]
        if distinct and self.keys.shape[0]:
            self._word_hits.update(zip(distinct, self._word_positions(distinct)))

    def positions(self, text: str) -> np.ndarray:
        """Sorted positions in ``keys`` of the text's n-grams found in the vocabulary, one entry per
        occurrence. A word's n-grams do not depend on its neighbours, so each distinct word's hits
        are computed once and kept (at most WORD_CACHE_SIZE words; the cache starts over when full)."""
        words = text.split()
        if not words or self.keys.shape[0] == 0:
            return np.zeros(0, dtype=np.intp)
        cache = self._word_hits
        found = [cache.get(w) for w in words]
        missing = [w for w, hits in zip(words, found) if hits is None]
        if missing:
            distinct = list(dict.fromkeys(missing))
            fresh = dict(zip(distinct, self._word_positions(distinct)))
            if len(cache) + len(fresh) > self.WORD_CACHE_SIZE:
                cache.clear()
            cache.update(fresh)
            found = [hits if hits is not None else fresh[w] for w, hits in zip(words, found)]
        # no entry is None here: every word missing from the cache got its fresh hits above
        hits = np.concatenate(cast("list[np.ndarray]", found))
        hits.sort()
        return hits

    def _word_positions(self, words: list[str]) -> list[np.ndarray]:
        """For each word, the positions in ``keys`` of its padded form's n-grams (all words hashed
        at once: the windows of " " + " ".join(words) + " " with no space strictly inside)."""
        codes = _codes(" " + " ".join(words) + " ").astype(np.uint64)
        spaces = codes == _SPACE
        owner_at = np.cumsum(spaces) - 1  # a window starting at i belongs to word owner_at[i]
        length = codes.shape[0]
        hashes = codes
        inner = None
        queries, owners = [], []
        with np.errstate(over="ignore"):
            for n in range(2, self.max_n + 1):
                count = length - n + 1
                if count <= 0:
                    break
                hashes = hashes[:count] * _HASH_MULTIPLIER + codes[n - 1 : n - 1 + count]
                if n > 2:  # windows with a space strictly inside are not n-grams of one word
                    step = spaces[n - 2 : n - 2 + count]
                    inner = step if inner is None else inner[:count] | step
                if n >= self.min_n:
                    keys = hashes + self._salts[n]
                    queries.append(keys if inner is None else keys[~inner])
                    owners.append(owner_at[:count] if inner is None else owner_at[:count][~inner])
        query, owner = np.concatenate(queries), np.concatenate(owners)
        position = np.searchsorted(self.keys, query)
        np.minimum(position, self.keys.shape[0] - 1, out=position)
        hit = self.keys.take(position) == query
        position, owner = position[hit], owner[hit]
        order = np.argsort(owner, kind="stable")
        position, owner = position[order], owner[order]
        bounds = np.searchsorted(owner, np.arange(len(words) + 1))
        return [position[bounds[i] : bounds[i + 1]] for i in range(len(words))]

    def features(self, text: str) -> np.ndarray:
        """Vocabulary indices of the text's n-grams, one entry per occurrence."""
        return self.indices[self.positions(text)]


def _runs(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values of a sorted array and how often each occurs (in few numpy calls: this
    runs twice per decision)."""
    size = ids.shape[0]
    if size == 0:
        return ids, ids
    first = np.empty(size, dtype=bool)
    first[0] = True
    np.not_equal(ids[1:], ids[:-1], out=first[1:])
    starts = first.nonzero()[0]
    counts = np.empty_like(starts)
    np.subtract(starts[1:], starts[:-1], out=counts[:-1])
    counts[-1] = size - starts[-1]
    return ids.take(starts), counts


class _WordGrams:
    """A word TfidfVectorizer's analyzer (preprocessor, token pattern, word n-grams) with the
    vocabulary lookup folded in: ``ids`` gives sorted vocabulary indices, one per occurrence."""

    def __init__(self, transformer: TfidfVectorizer):
        if transformer.stop_words is not None or transformer.analyzer != "word":
            raise ScorerError("FastScorer supports word n-grams without stop words only")
        self.preprocess, self.tokenize = transformer.build_preprocessor(), transformer.build_tokenizer()
        self.low, self.high = transformer.ngram_range
        self.get = transformer.vocabulary_.get

    def ids(self, text: str) -> np.ndarray:
        """Sorted vocabulary indices of the text's word n-grams, one per occurrence."""
        tokens = self.tokenize(self.preprocess(text))
        grams = list(tokens) if self.low == 1 else []
        for n in range(max(self.low, 2), self.high + 1):
            if n == 2:
                grams += [f"{a} {b}" for a, b in zip(tokens, tokens[1:])]
            else:
                grams += [" ".join(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
        get = self.get
        found = [i for i in map(get, grams) if i is not None]
        ids = np.array(found, dtype=np.intp)
        ids.sort()
        return ids


# one block of the feature union: (kind, ids function, idf per id (None for "dense" and "structure"),
# model weights per id (rows)); a plain tuple, unpacked in the scoring loop
_Part = tuple


def _embedding_part(weights: np.ndarray) -> tuple[_Part, int]:
    """The sentence-embedding block's part and its width; ``weights`` are the model's from its first row."""
    from router.classify.encoder import DIMENSIONS, embed

    return (
        "dense",
        lambda text: embed([text])[0],
        None,
        np.ascontiguousarray(weights[:DIMENSIONS]),
    ), DIMENSIONS


def _structure_part(transformer: Pipeline, weights: np.ndarray) -> tuple[_Part, int]:
    """The structural features' part (their scaling folded into the weights) and its width; ``weights``
    are the model's from its first row."""
    scaler = transformer.steps[-1][1]
    size = len(scaler.scale_)
    inverse = 1.0 / np.where(scaler.scale_ == 0, 1.0, scaler.scale_)
    return (
        "structure",
        structural_row,
        None,
        np.ascontiguousarray(weights[:size] * inverse[:, None]),
    ), size


class FastScorer:
    """The fitted pipeline's probabilities without scikit-learn's per-call overhead: the same
    analyzers, vocabularies, idf weights, structural scaling and linear model, evaluated on one
    sparse row with numpy (character n-grams found by vectorised hashing, their weights stored in
    hash order so that the hits index them directly). ``predict_proba`` equals the pipeline's to
    rounding (a test checks it)."""

    def __init__(self, pipeline: Pipeline):
        union, model = pipeline.named_steps["features"], pipeline.named_steps["model"]
        weights = np.asarray(model.coef_.T, dtype=np.float64)  # (n_features, n_classes or 1)
        self.parts: list[_Part] = []
        self.char_tables: list[_CharGramTable] = []
        offset = 0
        for name, transformer in union.transformer_list:
            if isinstance(transformer, TfidfVectorizer):
                part, size = self._tfidf_part(name, transformer, weights[offset:])
            elif name == "embedding":  # router.classify.encoder.EmbeddingFeatures: a dense block, no scaling
                part, size = _embedding_part(weights[offset:])
            else:
                part, size = _structure_part(transformer, weights[offset:])
            self.parts.append(part)
            offset += size
        single_words = [
            term
            for transformer in union.transformer_list
            if isinstance(transformer[1], TfidfVectorizer) and transformer[1].analyzer == "word"
            for term in transformer[1].vocabulary_
            if " " not in term
        ]
        for table in self.char_tables:  # the first prompts then find most of their words cached
            table.warm(single_words)
        self.intercept = model.intercept_.astype(np.float64)
        self.classes_ = model.classes_
        if weights.shape[0] != offset:
            raise ScorerError("FastScorer: feature count does not match the model")

    def _tfidf_part(self, name: str, transformer: TfidfVectorizer, weights: np.ndarray) -> tuple[_Part, int]:
        """A TF-IDF block's part (character n-grams through a _CharGramTable, kept in ``char_tables``;
        word n-grams through _WordGrams) and its width; ``weights`` are the model's from its first row."""
        if not (transformer.sublinear_tf and transformer.use_idf and transformer.norm == "l2"):
            raise ScorerError(f"FastScorer supports sublinear, idf-weighted, l2-normed TF-IDF only ({name})")
        size = len(transformer.vocabulary_)
        block = weights[:size]
        low, high = transformer.ngram_range
        if transformer.analyzer == "char_wb" and low >= 2:
            preprocess, table = (
                transformer.build_preprocessor(),
                _CharGramTable(transformer.vocabulary_, low, high),
            )
            self.char_tables.append(table)
            return (
                "tfidf",
                lambda text, p=preprocess, t=table: t.positions(p(text)),
                transformer.idf_[table.indices],
                np.ascontiguousarray(block[table.indices]),
            ), size
        return ("tfidf", _WordGrams(transformer).ids, transformer.idf_, block), size

    def cached_words(self) -> int:
        """How many distinct words' character n-grams are cached."""
        return sum(len(table._word_hits) for table in self.char_tables)

    def scores(self, text: str) -> np.ndarray:
        """The linear model's decision values for one text, shape (n_classes,) or (1,) for two."""
        total = self.intercept.copy()
        for kind, ids_of, idf, rows in self.parts:
            if kind in ("structure", "dense"):
                total += np.asarray(ids_of(text), dtype=np.float64) @ rows
                continue
            ids, counts = _runs(ids_of(text))
            if ids.shape[0] == 0:
                continue
            values = (np.log(counts) + 1.0) * idf.take(ids)
            total += (values @ rows.take(ids, axis=0)) / np.sqrt(values @ values)  # take: faster than [ids]
        return total

    def predict_proba(self, texts: Sequence[str], temperature: float = 1.0) -> np.ndarray:
        """Class probabilities, shape (len(texts), n_classes), as the pipeline computes them (with
        ``temperature`` > 1 the decision values are divided by it first: calibrated probabilities)."""
        rows = (
            np.array([self.scores(t) for t in texts], dtype=np.float64).reshape(len(texts), -1) / temperature
        )
        if rows.shape[1] == 1:  # two classes: a logistic of one decision value
            positive = 1.0 / (1.0 + np.exp(-rows[:, 0]))
            return np.column_stack([1.0 - positive, positive])
        rows -= rows.max(axis=1, keepdims=True)
        np.exp(rows, out=rows)
        rows /= rows.sum(axis=1, keepdims=True)
        return rows
