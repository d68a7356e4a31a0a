"""Storing checked cost profiles (:mod:`analyzer.analysis.cost_import`, the file format) beside the ones
analyses measure, each for the pair its row names or the pair of the run it is imported for: all or
nothing, refused (with line and field) when a profile has no pair, names a pair nothing stored knows
(unless it is a new pair), or is stored already."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session, aliased

from analyzer.analysis.cost_import import SAME_FIELDS, CostFileError, ImportedProfile
from analyzer.analysis.run_records import get_or_create_pair
from analyzer.models.specs import parse_spec
from analyzer.names import IMPORTED
from analyzer.orm import AnalysisRun, CostProfile, ModelPair, ModelSpec

NEW_PAIR_HINT = "import with --new-pair (on the web page: tick 'new pair')"


def store_imported_profiles(
    session: Session,
    profiles: list[ImportedProfile],
    filename: str,
    *,
    for_run: int | None = None,
    new_pair: bool = False,
) -> list[CostProfile]:
    """Store checked profiles (the caller's transaction: all or nothing; hold the write lock, so that
    two imports cannot both store one profile), each for the pair its row names, else for the pair of
    run ``for_run``. A :class:`CostFileError` lists, with line and field, every profile with no pair,
    with a ``target`` or ``draft`` no stored run or model spec knows (unless ``new_pair``), or already
    stored; nothing is stored then."""
    run_pair: ModelPair | None = None
    if for_run is not None:
        run = session.get(AnalysisRun, for_run)
        if run is None:
            raise CostFileError(filename, [f"--for-run: no analysis run {for_run}"])
        run_pair = run.pair
    problems = _unstorable(session, profiles, run_pair, new_pair)
    if problems:
        raise CostFileError(filename, problems)
    stored = []
    for p in profiles:
        if p.target is None:
            # a profile without a pair was refused above unless the import is for a run
            assert run_pair is not None
            pair = run_pair
        else:
            pair = get_or_create_pair(session, parse_spec(p.target), parse_spec(p.draft or ""))
        profile = _imported_profile(p, pair, filename)
        session.add(profile)
        stored.append(profile)
    session.flush()
    return stored


def _unstorable(
    session: Session, profiles: list[ImportedProfile], run_pair: ModelPair | None, new_pair: bool
) -> list[str]:
    """A problem, with line and field, for each profile that has no pair, names a pair no stored run
    or model spec knows (unless ``new_pair``), is stored already, or repeats an earlier one."""
    problems: list[str] = []
    first_line: dict[tuple, int] = {}
    for p in profiles:
        if p.target is None and run_pair is None:
            problems.append(
                f"line {p.line}, field 'target': required (the pair the times are for), unless the "
                "profiles are imported for a run (--for-run RUN)"
            )
            continue
        if p.target is not None and not new_pair:
            unknown = _unknown_specs(session, p)
            problems.extend(unknown)
            if unknown:
                continue
        pair = run_pair if p.target is None else _stored_pair(session, p.target, p.draft or "")
        same = _stored_duplicate(session, p, pair) if pair is not None else None
        if same is not None:
            problems.append(f"line {p.line}: already stored as cost profile #{same} (the same {SAME_FIELDS})")
            continue
        # a row naming the run's pair and one taking it from --for-run (the file's own check cannot see it)
        key = (
            pair.id if pair is not None else (p.target, p.draft),
            p.engine,
            p.engine_version,
            p.device,
            p.dtype,
            p.batch_size,
            p.times_s(),
        )
        if key in first_line:
            problems.append(
                f"line {p.line}: the same profile as line {first_line[key]} (the same {SAME_FIELDS})"
            )
        first_line.setdefault(key, p.line)
    return problems


def _unknown_specs(session: Session, p: ImportedProfile) -> list[str]:
    """A problem for the ``target`` and the ``draft`` of ``p`` that no stored model spec is."""
    return [
        f"line {p.line_of(name)}, field '{name}': no stored run or model spec knows {spec}; check "
        f"the spelling, or {NEW_PAIR_HINT} to store a profile for a pair not analysed yet"
        for name, spec in (("target", p.target), ("draft", p.draft))
        if not _known(session, spec)
    ]


def _imported_profile(p: ImportedProfile, pair: ModelPair, filename: str) -> CostProfile:
    """The cost profile row that stores ``p`` for ``pair``."""
    return CostProfile(
        pair_id=pair.id,
        priced_by=p.engine,
        measured_by=IMPORTED,
        source=IMPORTED,
        engine_version=p.engine_version,
        device=p.device,
        dtype=p.dtype,
        batch_size=p.batch_size,
        threads=None,
        context_tokens=0,
        repeats=1,
        target_forward_s=p.target_forward_s,
        draft_step_s=p.draft_step_s,
        target_prefill_s=None,
        draft_prefill_s=None,
        round_overhead_s=p.round_overhead_s,
        decode_overhead_s=p.decode_overhead_s,
        target_forward_spread=None,
        quality=None,  # not judged here: the engine's benchmark measured it
        quality_notes=[f"imported from {filename} (line {p.line}, {p.shape})"],
        library_versions={p.engine: p.engine_version} if p.engine_version else {},
    )


def _known(session: Session, spec: str | None) -> bool:
    """Whether a stored model spec (every run stores its pair's) is ``spec``, canonical."""
    return session.scalar(select(ModelSpec.id).where(ModelSpec.spec == spec)) is not None


def _stored_pair(session: Session, target: str, draft: str) -> ModelPair | None:
    """The stored pair of these canonical specs, without creating one."""
    target_spec, draft_spec = aliased(ModelSpec), aliased(ModelSpec)
    return session.scalar(
        select(ModelPair)
        .join(target_spec, ModelPair.target_id == target_spec.id)
        .join(draft_spec, ModelPair.draft_id == draft_spec.id)
        .where(target_spec.spec == target, draft_spec.spec == draft)
    )


def _stored_duplicate(session: Session, p: ImportedProfile, pair: ModelPair) -> int | None:
    """The id of a stored profile of ``pair`` with every field and time of ``p``, else None."""
    candidates = session.scalars(
        select(CostProfile)
        .where(
            CostProfile.pair_id == pair.id,
            CostProfile.priced_by == p.engine,
            CostProfile.engine_version.is_(None)
            if p.engine_version is None
            else CostProfile.engine_version == p.engine_version,
            CostProfile.device == p.device,
            CostProfile.dtype == p.dtype,
            CostProfile.batch_size == p.batch_size,
        )
        .order_by(CostProfile.id)
    )
    for stored in candidates:
        times = (
            tuple(stored.target_forward_s),
            stored.draft_step_s,
            stored.round_overhead_s,
            stored.decode_overhead_s,
        )
        if times == p.times_s():
            return stored.id
    return None
