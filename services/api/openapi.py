"""Route declarations and the OpenAPI 3.1 document derived from them.

Each handler of services/api/app.py is declared with `ROUTES.route(...)`: its method and
path, its request body and query string models, and the model of each status it answers
(services/api/models.py). The declaration is what aiohttp serves (the wrapper validates
the body and the query string with the models, 400 otherwise, takes the request's slot of
its kind, 429 beyond the limit, and sends the handler's answer through the model declared
for its status) and what the document says (`Routes.document`, served at /openapi.json),
so the two cannot drift. The refusals of services/api/guard.py are added to each
operation's responses by what the operation is (a change, a read of the broker, ...), and
the bearer token is documented as required only where the API was started with one.
tests/test_api_schemathesis.py runs schemathesis with every check against the document
the live API serves.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import orjson
from aiohttp import web
from pydantic import BaseModel, ValidationError
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaMode, models_json_schema
from pydantic_core import ErrorDetails

from cep_core.errors import Category
from cep_service.api.errors import Refused
from cep_service.api.limits import LimitKind
from cep_service.api.models import NAME_MAX, NAME_ROUTE, NAME_SCHEMA, Error

# Each path parameter: its route pattern, its schema, and the pattern a value must match
# (else 400).
PATH_PARAMS = {"name": (NAME_ROUTE, NAME_SCHEMA,
                        re.compile(NAME_SCHEMA["pattern"]), NAME_MAX)}
RETRY_AFTER = {"Retry-After": {"description": "seconds to wait before retrying",
                               "required": True,
                               "schema": {"type": "string", "pattern": "^[0-9]+$"}}}
DESCRIPTION = (
    "Streams and queries of the running pipelines, changed through the control topic; "
    "composite events as server-sent events. Changes need a JSON body (`Content-Type: "
    "application/json`) and no `Origin` but the API's own or an allowed one; every request "
    "a loopback or allowed `Host`; every error is a JSON `{\"error\": ...}`; a kind of "
    "request over its limit in flight is 429 with `Retry-After` (docs/api.md, Safety and "
    "Under load). This document is derived from the handlers' declarations "
    "(services/api/openapi.py).")

# What a handler answers: a response it built (a tail), a payload for 200, or (status,
# payload); a payload is a model or what the status's model validates.
Answer: TypeAlias = "web.StreamResponse | BaseModel | dict[str, Any] | list[Any] | tuple[int, Any]"


@dataclass
class Operation:
    """One method on one path and what it takes and answers. kind: the slot it takes
    (read, change, tail; None: none); change: the guard's rules for changes apply (Origin,
    JSON body); secured: the token is needed when one is set; checks: it checks a text on
    the checking threads (429 when they are full); broker: it reads the broker (503 when
    it does not answer); guarded: the Host rule applies (not to the probes)."""

    method: str
    path: str
    handler: Callable[..., Any]
    summary: str
    responses: dict[int, tuple[type[BaseModel] | None, str]]
    body: type[BaseModel] | None = None
    params: type[BaseModel] | None = None
    kind: LimitKind | None = None
    change: bool = False
    secured: bool = False
    checks: bool = False
    broker: bool = True
    guarded: bool = True
    event_stream: bool = False
    path_params: list[str] = field(default_factory=list)

    @property
    def route_path(self) -> str:
        """The aiohttp path: each {param} with its pattern."""
        return re.sub(r"\{(\w+)\}", lambda m: f"{{{m[1]}:{PATH_PARAMS[m[1]][0]}}}", self.path)


class Routes:
    """The API's operations, in declaration order."""

    def __init__(self) -> None:
        self.operations: list[Operation] = []

    @classmethod
    def joined(cls, *tables: Routes) -> Routes:
        """One table of the operations of several (an area's each), in their order."""
        out = cls()
        out.operations = [op for table in tables for op in table.operations]
        return out

    def route(self, method: str, path: str, summary: str, responses: dict[int, Any],
              **options: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def declare(handler: Callable[..., Any]) -> Callable[..., Any]:
            self.operations.append(Operation(
                method, path, handler, summary, dict(responses),
                path_params=re.findall(r"\{(\w+)\}", path), **options))
            return handler
        return declare

    # ------------------------------------------------------------ serving

    def add_to(self, app: web.Application, limits_of: Callable[[web.Request], Any]) -> None:
        """The operations as aiohttp routes; `limits_of(request)`: the Limits of the app."""
        for op in self.operations:
            if op.method == "GET":  # and HEAD
                app.router.add_get(op.route_path, _endpoint(op, limits_of))
            else:
                app.router.add_route(op.method, op.route_path, _endpoint(op, limits_of))

    # ------------------------------------------------------------ the document

    def document(self, token: bool) -> dict[str, Any]:
        """The OpenAPI 3.1 document; `token`: the API was started with one (the changes
        then document the bearer token as required, and 401)."""
        models: set[tuple[type[BaseModel], JsonSchemaMode]] = {
            (m, "validation") for op in self.operations for m in (op.body,) if m is not None}
        models |= {(model, "serialization") for op in self.operations
                   for model, _ in op.responses.values() if model is not None}
        models.add((Error, "serialization"))
        refs, top = models_json_schema(sorted(models, key=lambda m: (m[0].__name__, m[1])),
                                       ref_template="#/components/schemas/{model}",
                                       schema_generator=_Schemas, by_alias=True)
        schemas = _tidy(top.get("$defs", {}))
        paths: dict[str, Any] = {}
        for op in self.operations:
            paths.setdefault(op.path, {})[op.method.lower()] = \
                self._operation(op, refs, token)
        document: dict[str, Any] = {"openapi": "3.1.0",
                    "info": {"title": "cep API", "version": "1", "description": DESCRIPTION},
                    "components": {"schemas": schemas},
                    "paths": paths}
        if token:
            document["components"]["securitySchemes"] = {
                "bearer": {"type": "http", "scheme": "bearer",
                           "description": "CEP_API_TOKEN, on changes"}}
        return document

    def _operation(self, op: Operation, refs: dict[Any, Any], token: bool) -> dict[str, Any]:
        def ref(model: type[BaseModel], mode: JsonSchemaMode = "serialization") -> Any:
            return _tidy(refs[(model, mode)])

        out: dict[str, Any] = {"summary": op.summary, "operationId": _operation_id(op)}
        parameters = [{"name": p, "in": "path", "required": True,
                       "schema": PATH_PARAMS[p][1]} for p in op.path_params]
        if op.params is not None:
            schema = _tidy(op.params.model_json_schema(by_alias=True,
                                                        schema_generator=_Schemas))
            required = set(schema.get("required", ()))
            for name, prop in schema["properties"].items():
                description = prop.pop("description", None)
                parameters.append({"name": name, "in": "query", "required": name in required,
                                   "schema": prop, **({"description": description}
                                                      if description else {})})
        if parameters:
            out["parameters"] = parameters
        if op.body is not None:
            out["requestBody"] = {"required": True, "content": {
                "application/json": {"schema": ref(op.body, "validation")}}}
        if op.secured and token:
            out["security"] = [{"bearer": []}]
        responses: dict[str, Any] = {}
        for status, (model, description) in sorted(op.responses.items()):
            if op.event_stream and status == 200:
                responses["200"] = {"description": description, "content": {
                    "text/event-stream": {"schema": {"type": "string"}}}}
            else:
                responses[str(status)] = _json(ref(model) if model else {}, description)

        def add(status: int, description: str, headers: dict[str, Any] | None = None) -> None:
            if str(status) not in responses:
                responses[str(status)] = _json(ref(Error), description)
                if headers:
                    responses[str(status)]["headers"] = headers
        if op.body is not None or op.params is not None or op.path_params:
            add(400, "the path, the query string or the body is not as this document says")
        if op.secured and token:
            add(401, "the request lacks Authorization: Bearer <CEP_API_TOKEN>")
        if op.change:
            add(403, "a change from the web page of another origin")
            add(413, "the body is over 1 MiB")
            add(415, "the body is not Content-Type: application/json")
        if op.guarded:
            add(421, "the Host header is not a loopback name or an allowed host")
        if op.kind is not None or op.checks:
            add(429, "too many requests of this kind in flight: retry after Retry-After "
                "seconds", RETRY_AFTER)
        if op.broker:
            add(503, "the broker is unreachable: retry after Retry-After seconds",
                RETRY_AFTER)
        out["responses"] = responses
        return out


class _Schemas(GenerateJsonSchema):
    """pydantic's JSON Schema without titles."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False


def _tidy(schema: Any) -> Any:
    """Without `title` keys and `default: null` (a field that may be absent is not
    nullable unless its type says so)."""
    if isinstance(schema, dict):
        return {k: _tidy(v) for k, v in schema.items()
                if k != "title" and not (k == "default" and v is None)}
    if isinstance(schema, list):
        return [_tidy(v) for v in schema]
    return schema


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _operation_id(op: Operation) -> str:
    words = [w.strip("{}") for w in op.path.strip("/").split("/") if w]
    return "_".join([op.method.lower(), *words]) or op.method.lower()


# ---------------------------------------------------------------- the wrapper


def _endpoint(op: Operation, limits_of: Callable[[web.Request], Any]
              ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def endpoint(request: web.Request) -> web.StreamResponse:
        limits = limits_of(request)
        if op.kind is not None:
            limits.enter(op.kind)
        try:
            kwargs: dict[str, Any] = {p: _path_param(p, request.match_info[p])
                                      for p in op.path_params}
            if op.params is not None:
                kwargs["params"] = _validated(op.params, _query_of(request))
            if op.body is not None:
                kwargs["body"] = _validated(op.body, await _json_body(request))
            try:
                answer = await op.handler(request, **kwargs)
            except Refused as e:
                return _response(op, e.status, e.body, e.headers)
            if isinstance(answer, web.StreamResponse):
                return answer
            status, payload = answer if isinstance(answer, tuple) else (200, answer)
            return _response(op, status, payload)
        finally:
            if op.kind is not None:
                limits.leave(op.kind)
    endpoint.__name__ = op.handler.__name__
    return endpoint


def _path_param(name: str, value: str) -> str:
    _, _, pattern, longest = PATH_PARAMS[name]
    if len(value) > longest or not pattern.match(value):
        raise Refused(Category.MALFORMED, {
            "error": f"{name}: {value[:80]!r} is not a name ({NAME_SCHEMA['pattern']}, at "
                     f"most {longest} characters)"})
    return value


def _query_of(request: web.Request) -> dict[str, str]:
    out = {}
    for key in request.query.keys():
        values = request.query.getall(key)
        if len(values) > 1:
            raise Refused(Category.MALFORMED, {"error": f"{key}: given {len(values)} times"})
        out[key] = values[0]
    return out


async def _json_body(request: web.Request) -> Any:
    try:
        return orjson.loads(await request.read())
    except orjson.JSONDecodeError as e:
        raise Refused(Category.MALFORMED, {"error": f"not JSON: {e}"}) from None


def _validated(model: type[BaseModel], data: Any) -> BaseModel:
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise Refused(Category.MALFORMED, {"error": "; ".join(_problem(p) for p in e.errors(
            include_url=False))}) from None


def _problem(problem: ErrorDetails) -> str:
    where = ".".join(str(p) for p in problem["loc"])
    message = problem["msg"].removeprefix("Value error, ")
    return f"{where}: {message}" if where else message


def _response(op: Operation, status: int, payload: Any,
              headers: dict[str, str] | None = None) -> web.Response:
    model = op.responses.get(status, (Error if status >= 400 else None, ""))[0]
    if model is not None and not isinstance(payload, BaseModel):
        payload = model.model_validate(payload)
    body = payload.model_dump_json(by_alias=True, exclude_unset=True).encode() \
        if isinstance(payload, BaseModel) else orjson.dumps(payload)
    return web.Response(body=body, status=status, content_type="application/json",
                        headers=headers)
