"""The OpenAPI 3.1 document of the admin API (``GET /openapi.json``), written from the
routes (admin/routes.py) and the pydantic models the handlers validate bodies with."""

from __future__ import annotations

import re
from typing import Any, Final

from pydantic import BaseModel

from admin.models import ErrorAnswer
from admin.routes import PREFIX, ROUTES

_REF: Final = "#/components/schemas/{model}"
_PARAM: Final = re.compile(r"\{(\w+)\}")
#: the refusals every route may answer, and why
_REFUSALS: Final = {
    "400": "The body is not a JSON object.",
    "401": "No token, or an unknown or revoked one.",
    "403": "The caller's role or org may not do this.",
    "404": "No such resource the caller may see.",
    "408": "The body was not received in time.",
    "409": "It exists already.",
    "413": "The body is over the limit.",
    "422": "A field is invalid (named in `field`).",
    "503": "The broker did not acknowledge the write; retry.",
}


def _schemas(models: set[type[BaseModel]], into: dict[str, Any]) -> None:
    for model in sorted(models, key=lambda m: m.__name__):
        schema = model.model_json_schema(ref_template=_REF)
        for name, nested in schema.pop("$defs", {}).items():
            into[name] = nested
        into[model.__name__] = schema


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": _REF.format(model=model.__name__)}


def _error() -> dict[str, Any]:
    return {"content": {"application/json": {"schema": _ref(ErrorAnswer)}}}


def openapi_document() -> dict[str, Any]:
    models: set[type[BaseModel]] = {ErrorAnswer}
    paths: dict[str, dict[str, Any]] = {}
    for route in ROUTES:
        models.add(route.answer)
        success = "201" if route.method == "POST" else "200"
        responses: dict[str, Any] = {
            success: {
                "description": "Done.",
                "content": {"application/json": {"schema": _ref(route.answer)}},
            },
        }
        if route.method == "PUT":  # a PUT that creates answers 201
            responses["201"] = responses["200"]
        if route.method == "POST" and route.body is None:
            responses["200"] = responses["201"]  # an action already done converges
        for status, why in _REFUSALS.items():
            responses[status] = {"description": why, **_error()}
        operation: dict[str, Any] = {
            "operationId": f"{route.method.lower()}_{route.handler.__name__}",
            "summary": route.summary,
            "security": [{"bearer": []}],
            "responses": responses,
        }
        parameters = [
            {
                "name": name,
                "in": "path",
                "required": True,
                "schema": {"type": "string", "minLength": 1},
            }
            for name in _PARAM.findall(route.path)
        ]
        if route.idempotent:
            parameters.append(
                {
                    "name": "Idempotency-Key",
                    "in": "header",
                    "required": False,
                    "schema": {"type": "string", "minLength": 1, "maxLength": 200},
                    "description": "A retry with the same key (and body) gets the same answer.",
                }
            )
        helps = dict(route.query_help)
        parameters += [
            {"name": name, "in": "query", "required": False, "schema": {"type": "string"}}
            | ({"description": helps[name]} if name in helps else {})
            for name in route.query
        ]
        if parameters:
            operation["parameters"] = parameters
        if route.body is not None:
            models.add(route.body)
            operation["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": _ref(route.body)}},
            }
        paths.setdefault(PREFIX + route.path, {})[route.method.lower()] = operation
    schemas: dict[str, Any] = {}
    _schemas(models, schemas)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "spendbus admin API",
            "version": "1",
            "description": "Budgets, virtual keys, raises and the audit trail, fenced by org.",
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
