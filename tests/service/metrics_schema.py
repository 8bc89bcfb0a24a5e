"""The GPU monitor's report (``GET api/gpu/metrics``) as its tests hold it to: the JSON
Schema written here, and docs/gpu-metrics.schema.json where it exists (``validate``)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema

ROOT = Path(__file__).resolve().parents[2]
DOC_SCHEMA = ROOT / "docs" / "gpu-metrics.schema.json"

# The JSON the API returns. docs/gpu-metrics.schema.json, where it exists, is checked too.
GPU_OK = {
    "type": "object",
    "required": ["index", "uuid", "name", "memory_used", "memory_total", "utilization",
                 "temperature", "power_draw", "power_limit", "processes", "errors",
                 "memory_limit", "memory_limit_source", "memory_fraction", "warning"],
    "not": {"required": ["error"]},
    "properties": {
        "index": {"type": "integer", "minimum": 0},
        "uuid": {"type": "string", "minLength": 1},
        "name": {"type": ["string", "null"]},
        "memory_used": {"type": ["integer", "null"], "minimum": 0},
        "memory_total": {"type": ["integer", "null"], "minimum": 0},
        "utilization": {"type": ["number", "null"], "minimum": 0, "maximum": 1},
        "temperature": {"type": ["number", "null"]},
        "power_draw": {"type": ["number", "null"], "minimum": 0},
        "power_limit": {"type": ["number", "null"], "minimum": 0},
        "processes": {"type": ["object", "null"], "additionalProperties": False,
                      "required": ["count", "used_memory"],
                      "properties": {"count": {"type": "integer"},
                                     "used_memory": {"type": ["integer", "null"]}}},
        "errors": {"type": "object", "additionalProperties": {"type": "string"}},
        "memory_limit": {"type": ["integer", "null"], "minimum": 0},
        "memory_limit_source": {"enum": ["GPU_MEMORY_LIMIT", "total"]},
        "memory_fraction": {"type": ["number", "null"], "minimum": 0},
        "warning": {"type": ["string", "null"]},
    },
}
GPU_ERROR = {
    "type": "object",
    "required": ["index", "uuid", "error"],
    "properties": {"index": {"type": "integer"}, "uuid": {"type": "string"},
                   "error": {"type": "string"}},
}
HISTORY_SAMPLE = {
    "type": "object", "required": ["time", "gpus"], "additionalProperties": False,
    "properties": {"time": {"type": "number"}, "gpus": {"type": "array", "items": {
        "type": "object", "additionalProperties": False,
        "required": ["uuid", "utilization", "memory_used"],
        "properties": {"uuid": {"type": "string"},
                       "utilization": {"type": ["number", "null"]},
                       "memory_used": {"type": ["integer", "null"]}}}}},
}
PREEMPTION = {
    "type": "object", "additionalProperties": False,
    "required": ["version", "by", "by_role", "role", "gpus", "reason", "signalled_at",
                 "deadline", "grace_period", "seconds_left"],
    "properties": {
        "version": {"const": 1},
        **{k: {"type": ["string", "null"]} for k in ("by", "by_role", "role", "reason")},
        "gpus": {"type": "array", "items": {"type": "string"}},
        "signalled_at": {"type": ["number", "null"]},
        "deadline": {"type": "number"},
        "grace_period": {"type": ["number", "null"]},
        "seconds_left": {"type": "number", "minimum": 0},
    },
}
HOME = {
    "type": "object", "additionalProperties": False,
    "required": ["status", "message", "used", "limit", "fraction", "full", "at", "stale",
                 "over_size"],
    "properties": {
        "status": {"enum": ["ok", "unknown"]},
        "message": {"type": "string"},
        "used": {"type": ["integer", "null"], "minimum": 0},
        "limit": {"type": "integer", "minimum": 1},
        "fraction": {"type": ["number", "null"], "minimum": 0},
        "full": {"type": ["boolean", "null"]},
        "at": {"type": ["number", "null"]},
        "stale": {"type": "boolean"},
        "over_size": {"type": ["string", "null"]},
    },
}
SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["version", "time", "status", "message", "interval", "warning_threshold",
                 "gpu_memory_limit", "busy", "gpus", "warning", "preemption", "home"],
    "properties": {
        "version": {"const": 1},
        "time": {"type": "number"},
        "status": {"enum": ["ok", "no_gpu", "error", "starting"]},
        "message": {"type": "string"},
        "interval": {"type": "number", "exclusiveMinimum": 0},
        "warning_threshold": {"type": "number", "minimum": 0},
        "gpu_memory_limit": {"type": ["integer", "null"], "minimum": 1},
        "busy": {"type": "boolean"},
        "gpus": {"type": "array", "items": {"oneOf": [GPU_OK, GPU_ERROR]}},
        "warning": {"type": ["string", "null"]},
        "preemption": {"oneOf": [{"type": "null"}, PREEMPTION]},
        "home": {"oneOf": [{"type": "null"}, HOME]},
        "history": {"type": "array", "items": HISTORY_SAMPLE},
    },
}


def validate(body: dict) -> None:
    jsonschema.validate(body, SCHEMA)
    if DOC_SCHEMA.exists():
        jsonschema.validate(body, json.loads(DOC_SCHEMA.read_text()))
