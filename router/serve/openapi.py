"""The OpenAPI 3.1 document of the routing API, served at ``/openapi.json``. Its schemas are JSON
Schema 2020-12, and the tests validate every real response (and the request examples) against them,
so the document cannot drift from what the server does."""

from __future__ import annotations

from typing import Any

from analyzer.engine.engines import ENGINES
from router.decide.reasons import REASON_CODES

MAX_BATCH = 1000

_INT1 = {"type": "integer", "minimum": 1}
MAX_NEW_TOKENS = 1 << 20  # beyond any model's context: a larger number is a client's mistake
MAX_BATCH_SIZE = 1 << 16  # beyond any engine's batch
_NUM = {"type": "number"}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*statuses: int) -> dict[str, Any]:
    meaning = {
        400: "Bad input: malformed JSON, a wrong type, a missing or unknown field.",
        404: "Unknown route_id.",
        409: "Nothing to apply feedback to: no active policy set, or one without a cost to adapt with "
        "(policy_not_adaptive: a run's set without a cost profile, or a llama-server set published before such "
        "sets took feedback).",
        413: "The body exceeds SPECROUTE_API_MAX_BODY_BYTES.",
        502: "The decision's pool did not answer (pool_unavailable).",
        503: "The database or the stored classifier cannot be used; for the front door also a decision whose "
        "pool is a name, not a URL (pool_not_addressable).",
    }
    return {str(s): _json(_ref("Error"), meaning[s]) for s in statuses}


SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "required": ["error"],
        "additionalProperties": False,
        "properties": {
            "error": {
                "type": "object",
                "required": ["code", "message", "details"],
                "additionalProperties": False,
                "properties": {
                    "code": {"type": "string"},
                    "message": {"type": "string"},
                    "details": {"type": "object"},
                },
            }
        },
    },
    "ChatMessage": {
        "type": "object",
        "required": ["role", "content"],
        "properties": {"role": {"type": "string"}, "content": {"type": "string"}},
    },
    "RouteRequest": {
        "type": "object",
        "additionalProperties": False,
        "description": "Give exactly one of prompt and messages. batch_size and concurrency are the same "
        "thing (give one): how many sequences the engine runs together with this one.",
        "properties": {
            "prompt": {"type": "string", "minLength": 1},
            "messages": {"type": "array", "minItems": 1, "items": _ref("ChatMessage")},
            "max_new_tokens": {**_INT1, "maximum": MAX_NEW_TOKENS},
            "batch_size": {**_INT1, "maximum": MAX_BATCH_SIZE},
            "concurrency": {**_INT1, "maximum": MAX_BATCH_SIZE},
            "temperature": {"type": "number", "minimum": 0},
        },
    },
    "Reason": {
        "type": "object",
        "required": ["code"],
        "additionalProperties": True,
        "description": "One reason of a decision: a code and its parameters (router/decide/reasons.py lists them).",
        "properties": {"code": {"type": "string", "enum": list(REASON_CODES)}},
    },
    "Decision": {
        "type": "object",
        "additionalProperties": False,
        "required": [
            "route_id",
            "speculate",
            "gamma",
            "task_type",
            "confidence",
            "predicted_acceptance",
            "expected_speedup",
            "reasons",
            "reason_codes",
            "policy_version",
            "engine",
        ],
        "properties": {
            "route_id": {
                "type": "string",
                "description": "Name this in feedback. Signed with the server's secret key: send it unchanged.",
            },
            "speculate": {"type": "boolean"},
            "gamma": {"type": "integer", "minimum": 0, "description": "Lookahead; 0 when not speculating."},
            "task_type": {"type": "string"},
            "confidence": {"type": "number", "minimum": 0, "maximum": 1},
            "predicted_acceptance": {"type": ["number", "null"]},
            "expected_speedup": _NUM,
            "reasons": {
                "type": "array",
                "items": {"type": "string"},
                "description": "Why, in words for people (reason_codes holds the same, for programs).",
            },
            "reason_codes": {"type": "array", "items": _ref("Reason")},
            "policy_version": {"type": ["integer", "null"]},
            "engine": {
                "type": "object",
                "required": ["pool", "priced_by", "measured_by"],
                "additionalProperties": False,
                "description": "The decision in each engine that can run it: transformers and llama.cpp for a "
                "set published from a run (and for a plain decision of any set); llama-server for a set published "
                "from a llama-server analysis.",
                "properties": {
                    "llama-server": {
                        "type": "object",
                        "required": ["pool", "setting", "flags"],
                        "additionalProperties": False,
                        "description": "llama-server fixes its drafter per server: the pool to send the request to, "
                        "the drafter setting it runs (off: plain) and that server's command-line flags.",
                        "properties": {
                            "pool": {"type": "string"},
                            "setting": {"type": "string"},
                            "flags": {"type": "array", "items": {"type": "string"}},
                        },
                    },
                    "transformers": {
                        "type": "object",
                        "description": "generate() settings: "
                        "{assistant_model: false}, or prompt_lookup_num_tokens and "
                        "max_matching_ngram_size, or assistant_model: true with the values to set "
                        "on the draft's generation_config.",
                    },
                    "llama.cpp": {
                        "type": "object",
                        "required": ["pool", "speculative"],
                        "additionalProperties": False,
                        "description": "llama.cpp fixes speculation per server: the pool to send the request to "
                        "and what that pool speculates with (null: a plain pool).",
                        "properties": {
                            "pool": {"type": "string"},
                            "speculative": {
                                "oneOf": [
                                    {"type": "null"},
                                    {
                                        "type": "object",
                                        "required": ["draft", "n_max"],
                                        "additionalProperties": False,
                                        "properties": {
                                            "draft": {"enum": ["prompt-lookup", "model"]},
                                            "n_max": _INT1,
                                        },
                                    },
                                ]
                            },
                        },
                    },
                    "pool": {"type": "string", "description": "Deployment to send the request to."},
                    "priced_by": {
                        "type": ["string", "null"],
                        "description": "The engine whose cost priced the active policy set (null: none): "
                        f"{', '.join(ENGINES)}, or an engine whose own step times were imported (vllm, sglang, ...).",
                    },
                    "measured_by": {
                        "type": ["string", "null"],
                        "description": "The engine that measured the acceptance behind the active policy set "
                        f"(null: none): {', '.join(ENGINES)}.",
                    },
                },
            },
        },
    },
    "BatchRequest": {
        "type": "object",
        "required": ["requests"],
        "additionalProperties": False,
        "properties": {
            "requests": {"type": "array", "minItems": 1, "maxItems": MAX_BATCH, "items": _ref("RouteRequest")}
        },
    },
    "BatchResponse": {
        "type": "object",
        "required": ["decisions"],
        "additionalProperties": False,
        "properties": {"decisions": {"type": "array", "items": _ref("Decision")}},
    },
    "FeedbackRequest": {
        "type": "object",
        "description": "route_id (from a decision) or task_type, plus one of: counts {rounds, drafted, accepted}; "
        "llama.cpp timings {draft_n, draft_n_accepted, predicted_n} (a set published from a llama-server analysis "
        "also needs predicted_ms and prompt_n, with cache_n where the server reused prompt tokens; the optional "
        "setting names the pool's llama-server setting, 400 unknown_setting for one the set does not publish); "
        "vLLM speculative_decoding "
        "{num_drafts, num_draft_tokens, num_accepted_tokens | num_accepted_tokens_per_pos | "
        "acceptance_histogram}; SGLang meta_info {spec_verify_ct, completion_tokens, "
        "spec_num_correct_drafts?, spec_num_proposed_drafts? | spec_accept_rate? | gamma}. "
        "Any other field is refused (400 unknown_field).",
        "additionalProperties": False,
        "properties": {
            "route_id": {"type": "string"},
            "task_type": {"type": "string"},
            "rounds": {"type": "integer", "minimum": 0},
            "drafted": {"type": "integer", "minimum": 0},
            "accepted": {"type": "integer", "minimum": 0},
            "output_tokens": {"type": "integer", "minimum": 0},
            "gamma": {"type": "integer", "minimum": 1},
            "engine": {"type": "string"},
            "timings": {"type": "object"},
            "speculative_decoding": {"type": "object"},
            "meta_info": {"type": "object"},
            "setting": {"type": "string", "maxLength": 64},
        },
    },
    "TaskEstimate": {
        "type": "object",
        "additionalProperties": False,
        "required": [
            "task_type",
            "alpha",
            "prior_alpha",
            "speculate",
            "gamma",
            "events",
            "total_rounds",
            "total_drafted",
            "total_accepted",
        ],
        "properties": {
            "task_type": {"type": "string"},
            "alpha": _NUM,
            "prior_alpha": _NUM,
            "speculate": {"type": "boolean"},
            "gamma": {"type": "integer"},
            "events": {"type": "integer"},
            "total_rounds": {"type": "integer"},
            "total_drafted": {"type": "integer"},
            "total_accepted": {"type": "integer"},
            "decision_since": {
                "type": ["string", "null"],
                "description": "when speculate/gamma (or the llama-server setting) last changed (ISO 8601, UTC)",
            },
            "setting": {
                "type": ["string", "null"],
                "description": "A llama-server set: the setting in force (its pool takes the task); null: off, "
                "or a run's set.",
            },
            "options": {
                "type": ["object", "null"],
                "description": "A llama-server set: per setting that served the task, the decayed plain and "
                "served milliseconds of its feedback and its events ({label: {plain_ms, served_ms, events}}).",
            },
            "updated_at": {"type": ["string", "null"], "description": "the last feedback event"},
        },
    },
    "FeedbackResponse": {
        "type": "object",
        "required": ["estimate"],
        "additionalProperties": False,
        "properties": {"estimate": _ref("TaskEstimate")},
    },
    "Policy": {
        "type": "object",
        "additionalProperties": False,
        "required": [
            "task_type",
            "fallback",
            "speculate",
            "gamma",
            "alpha_mean",
            "alpha_var",
            "n_prompts",
            "expected_speedup",
            "tier",
        ],
        "properties": {
            "task_type": {"type": "string"},
            "fallback": {"type": "boolean"},
            "speculate": {"type": "boolean"},
            "gamma": {"type": "integer"},
            "alpha_mean": _NUM,
            "alpha_var": {"type": ["number", "null"]},
            "n_prompts": {"type": "integer"},
            "expected_speedup": _NUM,
            "tier": {"enum": ["HIGHLY_RECOMMENDED", "RECOMMENDED", "CONDITIONAL", "NOT_RECOMMENDED"]},
            "speedup_interval": {
                "type": "array",
                "items": {"type": ["number", "null"]},
                "minItems": 2,
                "maxItems": 2,
                "description": "90% bootstrap interval over the analysed prompts of expected_speedup "
                "(nulls for policies published before intervals).",
            },
            "decision_basis": {
                "type": ["string", "null"],
                "description": "task, or workload when the task had too few prompts "
                "to decide (its decision is then the workload's).",
            },
            "decision_reason": {"type": ["string", "null"]},
            "setting": {
                "type": ["string", "null"],
                "description": "The llama-server drafter setting the task speculates with (a set published from "
                "a llama-server analysis: its pool is keyed by it); null: off, or a set published from a run.",
            },
            "option_curve": {
                "type": ["object", "null"],
                "description": "A set published from a llama-server analysis: the task's curve over the analysis' "
                "settings ({options: [{label, speedup, low, high}], chosen, code, basis}), decided by the one rule; "
                "the prior its online estimate moves. null: a run's policy (its curve is over gamma).",
            },
            "by_batch": {
                "type": "object",
                "description": "Per profiled batch size: the best gamma, its predicted speedup and "
                "whether to speculate, by the one decision rule over the published S(g) curve (the "
                "report's decision at that batch size), with the rule's code.",
                "additionalProperties": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["gamma", "expected_speedup", "speculate", "decision_code"],
                    "properties": {
                        "gamma": {"type": "integer"},
                        "expected_speedup": _NUM,
                        "speculate": {"type": "boolean"},
                        "decision_code": {"type": "string"},
                    },
                },
            },
        },
    },
    "PolicySet": {
        "type": "object",
        "required": [
            "version",
            "active",
            "run_id",
            "engine",
            "priced_by",
            "measured_by",
            "margin",
            "gamma_max",
            "draft_kind",
            "draft_options",
            "cost",
            "pools",
            "notes",
            "created_at",
            "activated_at",
        ],
        "properties": {
            "version": {"type": "integer"},
            "active": {"type": "boolean"},
            "run_id": {"type": ["integer", "null"]},
            "server_analysis_id": {
                "type": ["integer", "null"],
                "description": "The llama-server analysis the set was published from (run_id is then null).",
            },
            "engine": {"type": "string", "description": "The same as priced_by (for earlier clients)."},
            "priced_by": {
                "type": "string",
                "description": f"The engine whose cost priced the set: {', '.join(ENGINES)}, or an engine whose "
                "own step times were imported (a re-priced run).",
            },
            "measured_by": {
                "type": "string",
                "description": f"The engine that measured the acceptance: {', '.join(ENGINES)}.",
            },
            "draft_kind": {
                "type": "string",
                "description": "The draft's spec kind (ngram: prompt lookup; else a draft model).",
            },
            "draft_options": {"type": "object", "description": "The draft's options, e.g. {max_ngram: 2}."},
            "cost": {
                "type": ["object", "null"],
                "description": "The batch-1 cost the decisions were priced with, in seconds "
                "(target_forward_s = T_t(1..K), draft_step_s, ...); null: none was linked.",
            },
            "pools": {
                "type": ["object", "null"],
                "additionalProperties": {"type": "string"},
                "description": "The deployment each decision goes to, published with the set: keys off and "
                "k1..k<gamma_max> (SPECROUTE_ROUTER_POOLS when it was published, else spec-off / spec-k<gamma>), "
                "or for a set from a llama-server analysis off and each drafter setting it uses (else "
                "http://127.0.0.1:<port>); "
                "null: published before pools were, so the serving process's SPECROUTE_ROUTER_POOLS names them.",
            },
            "plain_cost": {
                "type": ["object", "null"],
                "description": "A set from a llama-server analysis: the plain step cost (step_ms, per_context_ms) "
                "its pools' feedback is priced against; null for a run's set.",
            },
            "margin": _NUM,
            "gamma_max": {
                "type": "integer",
                "minimum": 1,
                "description": "The largest gamma the run analysed: the router prices and "
                "adapts over 1..gamma_max.",
            },
            "notes": {"type": ["string", "null"]},
            "created_at": {"type": "string"},
            "activated_at": {"type": ["string", "null"]},
        },
    },
    "Policies": {
        "type": "object",
        "required": ["active", "versions"],
        "additionalProperties": False,
        "properties": {
            "active": {
                "oneOf": [
                    {"type": "null"},
                    {
                        "allOf": [
                            _ref("PolicySet"),
                            {
                                "type": "object",
                                "required": ["policies", "estimates"],
                                "properties": {
                                    "policies": {"type": "array", "items": _ref("Policy")},
                                    "estimates": {"type": "array", "items": _ref("TaskEstimate")},
                                },
                            },
                        ]
                    },
                ]
            },
            "versions": {"type": "array", "items": _ref("PolicySet")},
        },
    },
    "Classifier": {
        "type": "object",
        "required": ["active"],
        "additionalProperties": False,
        "properties": {
            "active": {
                "oneOf": [
                    {"type": "null"},
                    {
                        "type": "object",
                        "required": [
                            "version",
                            "active",
                            "labels",
                            "training_prompt_count",
                            "training_data_sha256",
                            "library_versions",
                            "created_at",
                            "source",
                            "macro_f1",
                            "accuracy",
                            "baseline",
                            "per_class",
                        ],
                        "properties": {
                            "version": {"type": "integer"},
                            "active": {"type": "boolean"},
                            "labels": {"type": "array", "items": {"type": "string"}},
                            "training_prompt_count": {"type": "integer"},
                            "training_data_sha256": {"type": "string"},
                            "library_versions": {"type": "object"},
                            "created_at": {"type": "string"},
                            "source": {"type": ["string", "null"]},
                            "macro_f1": {"type": ["number", "null"]},
                            "accuracy": {"type": ["number", "null"]},
                            "baseline": {"type": ["object", "null"]},
                            "per_class": {"type": ["object", "null"]},
                            "features": {"enum": ["tfidf", "minilm", "tfidf+minilm"]},
                            "grouped": {
                                "type": ["object", "null"],
                                "description": "leave-one-source-out scores (null with a single source)",
                            },
                            "calibration": {
                                "type": ["object", "null"],
                                "description": "temperature, ECE before/after, reliability tables, routing threshold",
                            },
                            "reachability": {
                                "type": ["object", "null"],
                                "description": "per task: reachable, recall, training prompts, reason",
                            },
                        },
                    },
                ]
            }
        },
    },
    "Health": {
        "type": "object",
        "required": ["status", "database", "classifier_version", "policy_version"],
        "additionalProperties": False,
        "properties": {
            "status": {"const": "ok"},
            "database": {"const": "ok"},
            "classifier_version": {"type": ["integer", "null"]},
            "policy_version": {"type": ["integer", "null"]},
        },
    },
}


def openapi_document(version: str) -> dict[str, Any]:
    """The OpenAPI 3.1 document of the API (``version`` is specroute's)."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "specroute routing API",
            "version": version,
            "description": "Ask before each generation whether to speculate and with which gamma; "
            "send back what the engine saw. Every error has the Error shape.",
        },
        "paths": _api_paths() | _document_paths(),
        "components": {"schemas": SCHEMAS},
    }


def _post(summary: str, request: str, response: str, *errors: int) -> dict[str, Any]:
    """A POST operation with a required JSON ``request`` body, a JSON ``response`` and its ``errors``."""
    return {
        "summary": summary,
        "requestBody": {"required": True, "content": {"application/json": {"schema": _ref(request)}}},
        "responses": {"200": _json(_ref(response), "OK"), **_errors(*errors)},
    }


def _get(summary: str, response: str, *errors: int) -> dict[str, Any]:
    """A GET operation with a JSON ``response`` and its ``errors``."""
    return {
        "summary": summary,
        "responses": {"200": _json(_ref(response), "OK"), **_errors(*errors)},
    }


def _api_paths() -> dict[str, Any]:
    """The JSON endpoints: routing, feedback, policies, classifier and health."""
    return {
        "/v1/route": {"post": _post("Decide for one request", "RouteRequest", "Decision", 400, 413, 503)},
        "/v1/route/batch": {
            "post": _post(
                f"Decide for up to {MAX_BATCH} requests", "BatchRequest", "BatchResponse", 400, 413, 503
            )
        },
        "/v1/feedback": {
            "post": _post(
                "Report what the engine saw for one generation",
                "FeedbackRequest",
                "FeedbackResponse",
                400,
                404,
                409,
                413,
                503,
            )
        },
        "/v1/policies": {
            "get": _get("The active policy set, its online estimates and every version", "Policies", 503)
        },
        "/v1/classifier": {"get": _get("The active task classifier's version record", "Classifier", 503)},
        "/healthz": {"get": _get("Liveness and what is loaded", "Health", 503)},
    }


def _front_door(summary: str, field: str) -> dict[str, Any]:
    """A front-door operation (router/serve/front_door.py): an OpenAI-style body with ``field``, answered by the
    pool the decision names, whole or as server-sent events."""
    return {
        "summary": summary,
        "description": f"Decides for the body's {field} as /v1/route does (max_tokens, temperature), forwards the "
        "body unchanged to the decision's pool and answers with the pool's status and body (text/event-stream "
        "when the body asks for a stream). Headers X-Specroute-Route-Id, X-Specroute-Pool, X-Specroute-Task and "
        "X-Specroute-Speculate carry the decision; the pool's timings are stored as its feedback.",
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"type": "object", "required": [field]}}},
        },
        "responses": {
            "200": {
                "description": "The pool's answer",
                "content": {
                    "application/json": {"schema": {"type": "object"}},
                    "text/event-stream": {"schema": {"type": "string"}},
                },
            },
            **_errors(400, 413, 502, 503),
        },
    }


def _document_paths() -> dict[str, Any]:
    """The endpoints that answer a document of their own: this one, the Prometheus metrics, and the front
    door's pools' answers."""
    return {
        "/v1/chat/completions": {"post": _front_door("Chat completion through the decided pool", "messages")},
        "/v1/completions": {"post": _front_door("Completion through the decided pool", "prompt")},
        "/openapi.json": {
            "get": {
                "summary": "This document",
                "responses": {
                    "200": {
                        "description": "OpenAPI 3.1",
                        "content": {"application/json": {"schema": {"type": "object"}}},
                    }
                },
            }
        },
        "/metrics": {
            "get": {
                "summary": "Prometheus metrics",
                "responses": {
                    "200": {
                        "description": "Prometheus text format 0.0.4",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    }
                },
            }
        },
    }
