"""A few constructors for Kubernetes structural OpenAPI v3 schemas."""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]


def _with(schema: Schema, description: str | None, **extra: Any) -> Schema:
    if description:
        schema["description"] = description
    schema.update({k: v for k, v in extra.items() if v is not None})
    return schema


def integer(description: str | None = None, *, minimum: int | None = None, maximum: int | None = None,
            default: int | None = None) -> Schema:
    return _with({"type": "integer", "format": "int64"}, description, minimum=minimum, maximum=maximum,
                 default=default)


def number(description: str | None = None, *, minimum: float | None = None, maximum: float | None = None,
           exclusive_minimum: bool | None = None, default: float | None = None) -> Schema:
    return _with({"type": "number"}, description, minimum=minimum, maximum=maximum,
                 exclusiveMinimum=exclusive_minimum, default=default)


def string(description: str | None = None, *, enum: list[str] | None = None, fmt: str | None = None,
           max_length: int | None = None, default: str | None = None, min_length: int | None = None) -> Schema:
    return _with({"type": "string"}, description, enum=enum, format=fmt, maxLength=max_length,
                 minLength=min_length, default=default)


def boolean(description: str | None = None, *, default: bool | None = None) -> Schema:
    return _with({"type": "boolean"}, description, default=default)


def array(items: Schema, description: str | None = None, *, min_items: int | None = None,
          max_items: int | None = None, list_type: str | None = None, list_map_keys: list[str] | None = None,
          rules: list[Schema] | None = None) -> Schema:
    return _with({"type": "array", "items": items}, description, minItems=min_items, maxItems=max_items,
                 **{"x-kubernetes-list-type": list_type, "x-kubernetes-list-map-keys": list_map_keys,
                    "x-kubernetes-validations": rules})


def obj(properties: dict[str, Schema], description: str | None = None, *, required: list[str] | None = None,
        rules: list[Schema] | None = None, preserve_unknown: bool = False) -> Schema:
    schema: Schema = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    if preserve_unknown:
        schema["x-kubernetes-preserve-unknown-fields"] = True
    return _with(schema, description, **{"x-kubernetes-validations": rules})


def free_object(description: str | None = None) -> Schema:
    return _with({"type": "object", "x-kubernetes-preserve-unknown-fields": True}, description)


def rule(expression: str, message: str, field_path: str | None = None) -> Schema:
    r: Schema = {"rule": expression, "message": message}
    if field_path:
        r["fieldPath"] = field_path
    return r
