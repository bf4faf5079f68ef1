"""The OpenAPI 3.1 document of `cep serve api` (services/api/app.py), served at /openapi.json.
tests/test_api_schemathesis.py runs it against the live API."""

from __future__ import annotations

from functools import cache

NAME = {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$", "maxLength": 200}
NULLABLE_INT = {"type": ["integer", "null"]}
ERROR = {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}}
LOCATED = {
    "type": "object", "required": ["message", "line", "column"],
    "properties": {"message": {"type": "string"}, "line": NULLABLE_INT,
                   "column": NULLABLE_INT, "query": {"type": ["string", "null"]},
                   "source_line": {"type": ["string", "null"]}}}
OUTCOME = {
    "type": "object", "required": ["outcome", "errors", "changes"],
    "description": "applied: every service applied it; refused: the splitter refused it "
    "(errors: its reason, located); queued: no pipeline of that stream is up, the change "
    "waits on the control topic; timed_out: no outcome in time; sent: wait was false; "
    "invalid: checked here and not sent.",
    "properties": {
        "outcome": {"enum": ["applied", "refused", "queued", "timed_out", "sent", "invalid"]},
        "errors": {"type": "array", "items": {"$ref": "#/components/schemas/LocatedError"}},
        "changes": {"type": "array", "items": {
            "type": "object", "required": ["kind", "name", "op", "outcome"],
            "properties": {"kind": {"enum": ["query", "stream"]}, "name": {"type": "string"},
                           "op": {"enum": ["add", "update", "remove"]},
                           "key": {"type": "string"}, "offset": {"type": "integer"},
                           "outcome": {"type": "string"}, "said": {"type": "string"},
                           "reason": {"type": "string"},
                           "latency_ms": {"type": ["number", "null"]}}}}}}
WAIT = {"wait": {"type": "boolean", "default": True,
                 "description": "Wait for the services' outcome."},
        "timeout_s": {"type": "number", "minimum": 0.1, "maximum": 300}}
QUERY_BODY = {"type": "object", "required": ["text"],
              "properties": {"text": {"type": "string", "minLength": 1,
                                      "description": "Query language text."}, **WAIT}}
STREAM_BODY = {
    "type": "object",
    "description": "schema: a stream schema as schemas/*.json; or json_schema: a JSON "
    "Schema (draft 2020-12) of one event, imported as `cep schema import` does (name: the "
    "stream's name if the document has no title; time, time_unit, type_attribute, "
    "skip_optional).",
    "properties": {"schema": {"type": "object"}, "json_schema": {"type": "object"},
                   "name": {"type": "string"}, "time": {"type": "string"},
                   "time_unit": {"type": "string"}, "type_attribute": {"type": "string"},
                   "skip_optional": {"type": "boolean"}, **WAIT}}
STREAM = {"type": "object", "required": ["name", "source", "version", "schema"],
          "properties": {"name": {"type": "string"}, "source": {"enum": ["control", "file"]},
                         "version": NULLABLE_INT, "schema": {"type": "object"}}}
STATE = {"type": "object", "properties": {
    "live": {"type": "boolean"}, "services": {"type": "array", "items": {"type": "string"}},
    "partitions": {"type": "array", "items": {"type": "integer"}},
    "into_records": NULLABLE_INT, "composites_per_s": {"type": ["number", "null"]},
    "partial_matches": NULLABLE_INT, "events_in": {"type": "number"},
    "failed": {"type": "boolean", "description": "the query's engine failed in a keyed "
               "partition: it stopped alone (docs/live.md)"},
    "reason": {"type": ["string", "null"], "description": "why it failed"}}}
EXPLANATION = {"type": "object", "required": ["name", "kind", "headline", "lines", "nodes",
                                             "edges", "text", "dot", "svg"],
               "properties": {
                   "name": {"type": "string"}, "kind": {"enum": ["MATCH", "SEQ", "WINDOW"]},
                   "headline": {"type": "string"},
                   "lines": {"type": "array", "items": {"type": "string"}},
                   "nodes": {"type": "array", "items": {"type": "object"}},
                   "edges": {"type": "array", "items": {"type": "object"}},
                   "text": {"type": "string"}, "dot": {"type": "string"},
                   "svg": {"type": ["string", "null"],
                           "description": "null where Graphviz's dot is not installed"}}}
QUERY = {"type": "object", "required": ["name", "stream", "output", "index", "text"],
         "properties": {"name": {"type": "string"}, "stream": {"type": "string"},
                        "output": {"type": "string"}, "index": {"type": "integer"},
                        "text": {"type": "string"},
                        "state": {"$ref": "#/components/schemas/QueryState"}}}


def _json(schema: dict, description: str = "OK") -> dict:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


RETRY_AFTER = {"Retry-After": {"description": "seconds", "schema": {"type": "string"}}}


def _guarded(responses: dict, change: bool = False, broker: bool = True) -> dict:
    """`responses` with the refusals of services/api/guard.py: 421 (a Host that is not
    the API's) everywhere; for a change (and a validate call) 403 (another origin's page),
    413 (over 1 MiB), 415 (not application/json); 503 when it reads the broker (or checks
    a text: too many checks at once), with Retry-After."""
    out = {**responses,
           "421": _json(_ref("Error"), "the Host header is not a loopback name or an "
                        "allowed host")}
    if change:
        out.update({
            "403": _json(_ref("Error"), "a change from the web page of another origin"),
            "413": _json(_ref("Error"), "the body is over 1 MiB"),
            "415": _json(_ref("Error"), "the body is not Content-Type: application/json")})
    if broker or change:
        out["503"] = {**_json(_ref("Error"), "the broker is unreachable, or too many "
                              "checks are running: retry after Retry-After seconds"),
                      "headers": RETRY_AFTER}
    return out


def _change_responses(created: bool = False) -> dict:
    outcome = _json(_ref("Outcome"))
    out = {"200" if not created else "201": {**outcome, "description": "applied"},
           "202": {**outcome, "description": "queued or sent (not waited for)"},
           "400": _json(_ref("Error"), "not a JSON object of the right shape"),
           "401": _json(_ref("Error"), "a token is set and the request lacks it"),
           "404": {**outcome, "description": "nothing of that name is live"},
           "409": {**outcome, "description": "refused: live already, or by the splitter"},
           "422": {**outcome, "description": "does not check (errors with line, column)"},
           "504": {**outcome, "description": "no outcome in time"}}
    return _guarded(out, change=True)


def _body(schema: dict) -> dict:
    return {"required": True, "content": {"application/json": {"schema": schema}}}


NAME_PARAM = {"name": "name", "in": "path", "required": True, "schema": NAME}
SECURED = [{"bearer": []}]


@cache
def openapi_document() -> dict:
    return {
        "openapi": "3.1.0",
        "info": {"title": "cep API", "version": "1",
                 "description": "Streams and queries of the running pipelines, changed "
                 "through the control topic; composite events as server-sent events. "
                 "Changes need `Authorization: Bearer <CEP_API_TOKEN>` when a token is "
                 "set, a JSON body (`Content-Type: application/json`), and no `Origin` "
                 "but the API's own or an allowed one; every request a loopback or "
                 "allowed `Host`; every error is a JSON `{\"error\": ...}` (docs/api.md, "
                 "Safety)."},
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {"Error": ERROR, "LocatedError": LOCATED, "Outcome": OUTCOME,
                        "Stream": STREAM, "Query": QUERY, "QueryState": STATE,
                        "Explanation": EXPLANATION}},
        "paths": {
            "/healthz": {"get": {"summary": "The process serves", "responses": {
                "200": _json({"type": "object", "required": ["alive"]})}}},
            "/readyz": {"get": {"summary": "The broker answers a read of the control topic",
                                "responses": {
                                    "200": _json({"type": "object", "required": ["ready"]}),
                                    "503": _json({"type": "object", "required": ["ready"]},
                                                 "not ready")}}},
            "/api/streams": {
                "get": {"summary": "Every stream: schema files and the control topic's",
                        "responses": _guarded({"200": _json({
                            "type": "object", "required": ["streams"],
                            "properties": {"streams": {"type": "array",
                                                       "items": _ref("Stream")}}})})},
                "post": {"summary": "Register a stream", "security": SECURED,
                         "requestBody": _body(STREAM_BODY),
                         "responses": _change_responses(created=True)}},
            "/api/streams/validate": {"post": {
                "summary": "Check a stream schema (or import a JSON Schema); changes nothing",
                "requestBody": _body(STREAM_BODY),
                "responses": _guarded({
                    "200": _json({"type": "object", "required": ["ok", "errors"],
                                  "properties": {"ok": {"type": "boolean"},
                                                 "errors": {"type": "array"},
                                                 "schema": {"type": "object"}}}),
                    "400": _json(_ref("Error")),
                    "422": _json(_ref("Outcome"))}, change=True)}},
            "/api/streams/{name}": {
                "parameters": [NAME_PARAM],
                "get": {"summary": "One stream", "responses": _guarded({
                    "200": _json(_ref("Stream")), "404": _json(_ref("Error"))})},
                "put": {"summary": "Change a stream", "security": SECURED,
                        "requestBody": _body(STREAM_BODY), "responses": _change_responses()},
                "delete": {"summary": "Remove a stream registered on the control topic",
                           "security": SECURED, "responses": _change_responses()}},
            "/api/queries": {
                "get": {"summary": "The live queries (the control topic's), with their state",
                        "parameters": [
                            {"name": "stream", "in": "query", "schema": {"type": "string"}},
                            {"name": "state", "in": "query",
                             "schema": {"enum": ["true", "false"]}}],
                        "responses": _guarded({"200": _json({
                            "type": "object", "required": ["queries"],
                            "properties": {"queries": {"type": "array",
                                                       "items": _ref("Query")}}})})},
                "post": {"summary": "Add the queries of a text", "security": SECURED,
                         "requestBody": _body(QUERY_BODY),
                         "responses": _change_responses(created=True)}},
            "/api/queries/validate": {"post": {
                "summary": "Check a query text (parsed and checked, never run)",
                "requestBody": _body({"type": "object", "required": ["text"],
                                      "properties": {"text": {"type": "string"}}}),
                "responses": _guarded({
                    "200": _json({"type": "object", "required": ["ok", "errors", "queries"],
                                  "properties": {
                                      "ok": {"type": "boolean"},
                                      "errors": {"type": "array", "items": _ref("LocatedError")},
                                      "queries": {"type": "array"}}}),
                    "400": _json(_ref("Error"))}, change=True)}},
            "/api/queries/{name}": {
                "parameters": [NAME_PARAM],
                "get": {"summary": "One live query with its state", "responses": _guarded({
                    "200": _json(_ref("Query")), "404": _json(_ref("Error"))})},
                "put": {"summary": "Replace a live query", "security": SECURED,
                        "requestBody": _body(QUERY_BODY), "responses": _change_responses()},
                "delete": {"summary": "Remove a live query", "security": SECURED,
                           "responses": _change_responses()}},
            "/api/queries/{name}/explain": {"get": {
                "summary": "What the live query compiled to (cep explain): text, a graph, "
                           "and its SVG drawing where Graphviz is installed",
                "parameters": [NAME_PARAM],
                "responses": _guarded({"200": _json(_ref("Explanation")),
                                       "404": _json(_ref("Error"))})}},
            "/api/queries/{name}/tail": {"get": {
                "summary": "The query's composite events as server-sent events",
                "parameters": [
                    NAME_PARAM,
                    {"name": "from", "in": "query", "schema": {"enum": ["beginning", "end"]}},
                    {"name": "limit", "in": "query",
                     "schema": {"type": "integer", "minimum": 1, "maximum": 1000000}},
                    {"name": "idle_s", "in": "query",
                     "schema": {"type": "number", "minimum": 0.1, "maximum": 3600}}],
                "responses": _guarded({
                    "200": {"description": "`event: composite`, `id: PARTITION:OFFSET`, "
                            "`data:` one composite event as JSON",
                            "content": {"text/event-stream": {"schema": {"type": "string"}}}},
                    "400": _json(_ref("Error")), "404": _json(_ref("Error"))})}},
        },
    }
