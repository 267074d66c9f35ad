"""What the API server does with a custom resource before it stores it: default, prune, validate.

The CRD's unit tests (``tests/unit/operator/test_crd_refusals.py``) call :func:`admit`
in-process, without a control plane (the real API server is what the e2e tests use). It
follows the structural-schema rules of ``apiextensions.k8s.io/v1``: null on a
non-nullable field is dropped, then ``default``s are applied, then fields the schema does
not know are pruned (reported, so that ``fieldValidation=Strict`` can reject them), then
the value is checked against the schema and its CEL rules (``x-kubernetes-validations``).
Errors come back as :class:`FieldError` in the shapes the API server prints, so a test can
assert on the same text a user reads from ``kubectl apply``.

CEL is evaluated by ``common-expression-language`` (``import cel``), which has standard CEL
but not the Kubernetes extension libraries (``quantity()``, ``url()``, ...): a rule that
needs them fails with an evaluation error naming the rule, never silently passes.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from typing import Any

import cel

# Property names that are not CEL identifiers are escaped as the API server does
# (https://kubernetes.io/docs/reference/using-api/cel/#escaping).
_CEL_ESCAPES = (("__", "__underscores__"), (".", "__dot__"), ("-", "__dash__"), ("/", "__slash__"))
_CEL_RESERVED = {
    "true",
    "false",
    "null",
    "in",
    "as",
    "break",
    "const",
    "continue",
    "else",
    "for",
    "function",
    "if",
    "import",
    "let",
    "loop",
    "package",
    "namespace",
    "return",
    "var",
    "void",
    "while",
}
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class FieldError:
    """One cause of a 422 Invalid: ``reason`` is the API server's cause type."""

    field: str
    reason: str  # FieldValueInvalid, FieldValueRequired, FieldValueNotSupported, ...
    detail: str

    def message(self) -> str:
        return f"{self.field}: {self.detail}"


@dataclass
class Admission:
    """The object as it will be stored, the fields pruned from it and what is wrong with it."""

    obj: dict[str, Any]
    unknown_fields: list[str]
    errors: list[FieldError]


def admit(
    obj: dict[str, Any], schema: dict[str, Any], *, old: dict[str, Any] | None = None
) -> Admission:
    """Default, prune and validate ``obj`` (a whole custom resource) against ``schema``."""
    result = copy.deepcopy(obj)
    unknown: list[str] = []
    errors: list[FieldError] = []
    properties = schema.get("properties", {})
    for key in list(result):
        if key in ("apiVersion", "kind", "metadata"):
            continue
        if key not in properties and not schema.get("x-kubernetes-preserve-unknown-fields"):
            unknown.append(key)
            del result[key]
    root = {k: v for k, v in schema.items() if k != "properties"}
    root["properties"] = {k: v for k, v in properties.items() if k not in ("metadata",)}
    root["x-kubernetes-preserve-unknown-fields"] = True  # apiVersion, kind, metadata
    _default(result, root)
    _prune(result, root, "", unknown, keep_root_unknown=True)
    _validate(result, root, "", errors, old)
    return Admission(result, unknown, errors)


def _child(path: str, key: str) -> str:
    """The API server's schema errors join property names with dots, dotted names included
    (``spec.config.max.task.idle.ms``)."""
    return f"{path}.{key}" if path else key


def _default(value: Any, schema: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for key, sub in schema.get("properties", {}).items():
            if value.get(key, ...) is None and not sub.get("nullable"):
                del value[key]
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                _default(value[key], sub)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for item in value.values():
                _default(item, extra)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for item in value:
            _default(item, schema["items"])


def _prune(
    value: Any,
    schema: dict[str, Any],
    path: str,
    unknown: list[str],
    *,
    keep_root_unknown: bool = False,
) -> None:
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        preserve = schema.get("x-kubernetes-preserve-unknown-fields") or keep_root_unknown
        for key in list(value):
            if key in properties:
                _prune(value[key], properties[key], _child(path, key), unknown)
            elif isinstance(extra, dict):
                _prune(value[key], extra, _child(path, key), unknown)
            elif not (preserve or extra is True or schema.get("x-kubernetes-embedded-resource")):
                unknown.append(_child(path, key))
                del value[key]
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            _prune(item, schema["items"], f"{path}[{index}]", unknown)


def _render(value: Any) -> str:
    """The value as the API server prints it after ``Invalid value:``."""
    if isinstance(value, dict):
        return '"object"'
    if isinstance(value, list):
        return '"array"'
    return json.dumps(value)


def _type_ok(value: Any, schema: dict[str, Any]) -> bool:
    kind = schema.get("type")
    if value is None:
        return bool(schema.get("nullable")) or kind is None
    if schema.get("x-kubernetes-int-or-string"):
        return isinstance(value, (int, str)) and not isinstance(value, bool)
    checks: dict[str, Any] = {
        "object": lambda v: isinstance(v, dict),
        "array": lambda v: isinstance(v, list),
        "string": lambda v: isinstance(v, str),
        "boolean": lambda v: isinstance(v, bool),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    }
    return kind is None or bool(checks[kind](value))


def _validate(
    value: Any,
    schema: dict[str, Any],
    path: str,
    errors: list[FieldError],
    old: Any,
) -> None:
    if not _type_ok(value, schema):
        errors.append(
            FieldError(
                path,
                "FieldValueTypeInvalid",
                f"Invalid value: {_render(value)}: {path} in body must be of type "
                f"{schema.get('type')}: {_render(value)}",
            )
        )
        return
    if value is None:
        return
    before = len(errors)
    _validate_value(value, schema, path, errors)
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        for key in schema.get("required", []):
            if key not in value:
                errors.append(FieldError(_child(path, key), "FieldValueRequired", "Required value"))
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            sub = properties.get(key, extra if isinstance(extra, dict) else None)
            if sub is not None:
                old_item = old.get(key) if isinstance(old, dict) else None
                _validate(item, sub, _child(path, key), errors, old_item)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            _validate(item, schema["items"], f"{path}[{index}]", errors, None)
    if len(errors) == before:  # the API server runs CEL only on values that passed the schema
        _check_rules(value, schema, path, errors, old)


def _validate_value(
    value: Any, schema: dict[str, Any], path: str, errors: list[FieldError]
) -> None:
    def invalid(detail: str) -> None:
        errors.append(
            FieldError(path, "FieldValueInvalid", f"Invalid value: {_render(value)}: {detail}")
        )

    if "enum" in schema and value not in schema["enum"]:
        accepted = ", ".join(json.dumps(choice) for choice in schema["enum"])
        errors.append(
            FieldError(
                path,
                "FieldValueNotSupported",
                f"Unsupported value: {_render(value)}: supported values: {accepted}",
            )
        )
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema:
            if schema.get("exclusiveMinimum") and value <= schema["minimum"]:
                invalid(f"{path} in body should be greater than {schema['minimum']}")
            elif value < schema["minimum"]:
                invalid(f"{path} in body should be greater than or equal to {schema['minimum']}")
        if "maximum" in schema:
            if schema.get("exclusiveMaximum") and value >= schema["maximum"]:
                invalid(f"{path} in body should be less than {schema['maximum']}")
            elif value > schema["maximum"]:
                invalid(f"{path} in body should be less than or equal to {schema['maximum']}")
    if isinstance(value, str):
        if "pattern" in schema and not re.search(schema["pattern"], value):
            invalid(f"{path} in body should match '{schema['pattern']}'")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errors.append(
                FieldError(
                    path,
                    "FieldValueTooLong",
                    f"Too long: may not be longer than {schema['maxLength']}",
                )
            )
        if "minLength" in schema and len(value) < schema["minLength"]:
            invalid(f"{path} in body should be at least {schema['minLength']} chars long")
    if isinstance(value, list):
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            errors.append(
                FieldError(
                    path,
                    "FieldValueTooMany",
                    f"Too many: {len(value)}: must have at most {schema['maxItems']} items",
                )
            )
        if "minItems" in schema and len(value) < schema["minItems"]:
            invalid(f"{path} in body should have at least {schema['minItems']} items")
    for keyword in ("anyOf", "oneOf"):
        if keyword in schema:
            passing = 0
            for option in schema[keyword]:
                trial: list[FieldError] = []
                _validate(value, {"type": schema.get("type"), **option}, path, trial, None)
                passing += not trial
            if passing == 0 or (keyword == "oneOf" and passing > 1):
                how_many = "exactly one" if keyword == "oneOf" else "at least one"
                invalid(f"{path} in body must match {how_many} schema in {keyword}")


def _escape_key(key: str) -> str | None:
    if key in _CEL_RESERVED:
        return f"__{key}__"
    escaped = key
    for plain, replacement in _CEL_ESCAPES:
        escaped = escaped.replace(plain, replacement)
    return escaped if _IDENTIFIER.match(escaped) and escaped != key else None


def _cel_value(value: Any, schema: dict[str, Any] | None) -> Any:
    """A copy where property names that are not identifiers are also reachable escaped.

    Only an object's declared properties are escaped, as the API server does: a map's keys
    (``additionalProperties``) are data, iterated by ``all()`` and indexed as they are."""
    schema = schema or {}
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        result = {
            key: _cel_value(
                item, properties.get(key) or (extra if isinstance(extra, dict) else None)
            )
            for key, item in value.items()
        }
        if "additionalProperties" not in schema:
            for key in value:
                escaped = _escape_key(key)
                if escaped is not None:
                    result.setdefault(escaped, result[key])
        return result
    if isinstance(value, list):
        return [_cel_value(item, schema.get("items")) for item in value]
    return value


def _check_rules(
    value: Any, schema: dict[str, Any], path: str, errors: list[FieldError], old: Any
) -> None:
    for rule in schema.get("x-kubernetes-validations", []):
        expression = rule["rule"]
        uses_old = re.search(r"\boldSelf\b", expression) is not None
        if uses_old and old is None and not rule.get("optionalOldSelf"):
            continue  # a transition rule: only checked on updates that had a value
        context = {"self": _cel_value(value, schema)}
        if uses_old:
            context["oldSelf"] = _cel_value(old, schema)
        field = path + rule.get("fieldPath", "")
        kind = schema.get("type", "object")
        try:
            passed = cel.evaluate(expression, context)
        except (RuntimeError, KeyError, ValueError, TypeError) as error:
            errors.append(
                FieldError(
                    field,
                    "FieldValueInvalid",
                    f'Invalid value: "{kind}": rule "{expression}" evaluation error: {error}',
                )
            )
            continue
        if passed is True:
            continue
        message = rule.get("message") or f"failed rule: {expression}"
        reason = rule.get("reason", "FieldValueInvalid")
        prefix = {
            "FieldValueForbidden": "Forbidden: ",
            "FieldValueRequired": "Required value: ",
            "FieldValueDuplicate": f'Duplicate value: "{kind}": ',
        }.get(reason, f'Invalid value: "{kind}": ')
        errors.append(FieldError(field, reason, prefix + message))
