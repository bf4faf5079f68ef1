"""The API's request and response bodies as pydantic models: the one source of the
contract. A handler's request body and query string are validated by these models (400
otherwise), its answer is serialized through the model declared for its status (so what
is sent is what the document says), and services/api/openapi.py assembles the OpenAPI
document from the same models (`model_json_schema`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    WithJsonSchema,
    model_validator,
)

from cep_core.control_message import _validator, control_schema, violations

# An optional field is `x: T = None` (or Field(None)): absent gives None, a null is refused
# (`T | None` would accept it and say so in the document), so mypy is told to let it be
# (type: ignore[assignment]).
NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
NAME_MAX = 200
# The path parameter {name}: any segment but the word of a sibling path (validate), so
# that /api/queries/validate is one resource with its own methods (Allow: POST); one that
# is not a name is 400 (services/api/openapi.py checks it against NAME_SCHEMA).
NAME_ROUTE = r"(?!validate$)[^/]+"
NAME_SCHEMA: dict[str, Any] = {
    "type": "string", "pattern": r"^(?!validate$)[A-Za-z_][A-Za-z0-9_]*$", "maxLength": NAME_MAX}


class Body(BaseModel):
    """A request body: unknown fields are refused (the document says
    additionalProperties: false)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, strict=True)


class Reply(BaseModel):
    """A response body: what the handler gives is validated and serialized through it;
    fields it does not declare are not sent."""

    model_config = ConfigDict(populate_by_name=True)


# ---------------------------------------------------------------- shared


class Error(Reply):
    error: str


class LocatedError(Reply):
    """One problem, located in the text where it has a place."""

    message: str
    line: int | None = None
    column: int | None = None
    query: str | None = None
    source_line: str | None = None


class Change(Reply):
    """One change written to the control topic and what the services said of it."""

    kind: Literal["query", "stream"]
    name: str
    op: Literal["add", "update", "remove"]
    outcome: str
    key: str | None = None
    offset: int | None = None
    said: str | None = None
    reason: str | None = None
    at: int | None = None
    splitter: str | None = None
    workers: list[str] | None = None
    coordinator: str | None = None
    partitions: int | None = None
    missing: list[str] | None = None
    latency_ms: float | None = None


class Outcome(Reply):
    """applied: every service applied it; refused: the splitter refused it (errors: its
    reason, located); queued: no pipeline of that stream is up, the change waits on the
    control topic; timed_out: no outcome in time; sent: wait was false; invalid: checked
    here and not sent."""

    outcome: Literal["applied", "refused", "queued", "timed_out", "sent", "invalid"]
    errors: list[LocatedError]
    changes: list[Change]


class WaitOptions(Body):
    wait: bool = Field(True, description="Wait for the services' outcome.")
    timeout_s: float = Field(None, ge=0.1, le=300, description="How long to wait, in "  # type: ignore[assignment]
                             "seconds (absent: the API's default, 30).")


# ---------------------------------------------------------------- streams

def _stream_schema(value: dict) -> dict:
    problems = violations(_validator("stream_schema"), value, "schema")
    if problems:
        raise ValueError("; ".join(dict.fromkeys(problems)))
    return value


# A stream schema as schemas/*.json: the control message's JSON Schema of one
# (cep_core/schemas/control_message.json), documented and checked as it is there.
StreamSchemaDocument = Annotated[dict[str, Any], AfterValidator(_stream_schema),
                                 WithJsonSchema(control_schema()["$defs"]["stream_schema"])]


class EventJsonSchema(BaseModel):
    """A JSON Schema (draft 2020-12) of one event: an object with properties. What the
    import (cep_core/schema_import.py) needs of one at least; it refuses more (422, or
    ok: false), with its reasons."""

    model_config = ConfigDict(extra="allow", strict=True)
    type: Literal["object"]
    properties: dict[str, Any] = Field(min_length=1)


class StreamCheck(Body):
    """schema: a stream schema as schemas/*.json; or json_schema: a JSON Schema (draft
    2020-12) of one event, imported as `cep schema import` does (name: the stream's name
    if the document has no title; time, time_unit, type_attribute, skip_optional). One of
    the two."""

    model_config = ConfigDict(json_schema_extra={"oneOf": [{"required": ["schema"]},
                                                           {"required": ["json_schema"]}]})

    stream_schema: StreamSchemaDocument = Field(None, alias="schema")  # type: ignore[arg-type]
    json_schema: EventJsonSchema = None  # type: ignore[assignment]
    name: str = Field(None, pattern=NAME_PATTERN, max_length=NAME_MAX)  # type: ignore[assignment]
    time: str = Field(None, min_length=1)  # type: ignore[assignment]
    time_unit: Literal["ms", "s", "us", "ns", "ticks"] = None  # type: ignore[assignment]
    type_attribute: str = Field(None, min_length=1)  # type: ignore[assignment]
    skip_optional: bool = None  # type: ignore[assignment]

    @model_validator(mode="after")
    def _one_of_the_two(self) -> StreamCheck:
        if (self.stream_schema is None) == (self.json_schema is None):
            raise ValueError("give schema (a stream schema) or json_schema (a JSON Schema "
                             "of one event), one of the two")
        return self


class StreamBody(StreamCheck, WaitOptions):
    """A stream change: the stream (as for validate) and how to wait."""


class Stream(Reply):
    name: str
    source: Literal["control", "file"]
    version: int | None
    stream_schema: dict[str, Any] = Field(alias="schema")


class StreamList(Reply):
    streams: list[Stream]


class StreamChecked(Reply):
    ok: bool
    errors: list[LocatedError]
    stream_schema: dict[str, Any] | None = Field(None, alias="schema")


# ---------------------------------------------------------------- queries


class QueryBody(WaitOptions):
    text: str = Field(min_length=1, description="Query language text.")


class QueryCheck(Body):
    text: str = Field(description="Query language text.")


class Params(BaseModel):
    """A query string: its values are strings, converted to the fields' types; unknown
    parameters are ignored."""

    model_config = ConfigDict(populate_by_name=True)


class QueriesParams(Params):
    stream: str = Field(None, description="Only the queries of this stream.")  # type: ignore[assignment]
    state: Literal["true", "false"] = Field("true", description="false: without state.")


class TailParams(Params):
    start: Literal["beginning", "end"] = Field("end", alias="from", description=
                                               "beginning: replay the INTO topic first.")
    limit: int = Field(None, ge=1, le=1_000_000, description="End after N events.")  # type: ignore[assignment]
    idle_s: float = Field(None, ge=0.1, le=3600,  # type: ignore[assignment]
                                 description="End after S seconds without an event.")


class TailManyParams(Params):
    queries: str = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*(,[A-Za-z_][A-Za-z0-9_]*)*$",  # type: ignore[assignment]
                         max_length=4000, description="Query names apart by commas "
                         "(absent: every live query).")
    limit: int = Field(None, ge=1, le=1_000_000, description="End after N events.")  # type: ignore[assignment]
    idle_s: float = Field(None, ge=0.1, le=3600,  # type: ignore[assignment]
                          description="End after S seconds without an event.")


class QueryState(Reply):
    live: bool
    services: list[str]
    partitions: list[int]
    into_records: int | None
    composites_per_s: float | None
    failed: bool = Field(description="the query's engine failed in a keyed partition: it "
                         "stopped alone (docs/live.md)")
    reason: str | None = Field(description="why it failed")
    partial_matches: int | None = None
    state_bytes: int | None = Field(None, description="bytes of the arrays its engines "
                                    "hold, summed over partitions (with --api-metrics)")
    events_in: float | None = None


class Query(Reply):
    name: str
    stream: str
    output: str
    index: int
    text: str
    state: QueryState | None = None


class QueryList(Reply):
    queries: list[Query]


class CheckedQuery(Reply):
    name: str
    stream: str
    output: str
    live: bool


class QueryChecked(Reply):
    ok: bool
    errors: list[LocatedError]
    queries: list[CheckedQuery]


class Explanation(Reply):
    name: str
    kind: Literal["MATCH", "SEQ", "WINDOW", "match_recognize"]  # as cep explain names it
    headline: str
    lines: list[str]
    nodes: list[dict[str, Any]]
    edges: list[dict[str, Any]]
    text: str
    dot: str
    svg: str | None = Field(description="null where Graphviz's dot is not installed")


# ---------------------------------------------------------------- the console's views


class PipelineParams(Params):
    stream: str = Field(None, pattern=NAME_PATTERN, max_length=NAME_MAX,  # type: ignore[assignment]
                        description="Only this stream's pipeline (default: those of the "
                        "live queries' streams).")


class PipelineStage(Reply):
    """A stage of a chained process (one process runs every role, services/stream/chained.py)."""

    stage: str
    events_in_per_s: float | None
    events_out_per_s: float | None
    in_unit: str
    out_unit: str
    services: list[str] = Field(description="the names it writes as on the status topic")


class PipelineProcess(Reply):
    """A node of the graph: the broker, a service up on the status topic (any role), or
    this API."""

    id: str
    role: str
    name: str
    state: str
    partitions: list[int] = Field(description="keyed partitions it holds (workers)")
    rate: float | None = Field(description="per second, as rate_unit says (null: no "
                               "figure yet, or no metrics endpoint for it)")
    rate_unit: str
    lag: float | None = None
    checkpoint_s_ago: float | None = None
    checkpoint_time: float | None = Field(None, description="Unix time of its last "
                                          "checkpoint")
    checkpoint_generation: int | None = None
    checkpoint_ms: float | None = Field(None, description="how long its last checkpoint "
                                        "took (a chained process's: the whole cut)")
    tails: int | None = None
    services: list[str] = Field([], description="a chained process: the names its stages "
                                "write as on the status topic (folded into this node)")
    stages: list[PipelineStage] = Field([], description="a chained process: its stages, in "
                                        "the order data flows (routing, partitions, merge)")


class PipelineEdge(Reply):
    source: str
    target: str
    label: str


class PipelinePartition(Reply):
    partition: int
    worker: str | None
    lag: float | None = Field(description="messages behind on the keyed topic")
    seq: int | None = Field(description="the coordinator: processed up to this seq")
    event_time: float | None = Field(description="the coordinator: stream time of its "
                                     "last pulse, in the stream's unit")
    last_frame_s_ago: float | None


class Withheld(Reply):
    output: str
    count: int
    seq: int = Field(description="seq of the oldest withheld composite event")
    waits_for: str
    says: str


class Pipeline(Reply):
    stream: str
    processes: list[PipelineProcess]
    edges: list[PipelineEdge]
    partitions: list[PipelinePartition]
    withheld: list[Withheld]
    time_unit: str | None = Field(description="the unit of the stream's time (the "
                                  "partitions' event_time)")
    metrics: bool = Field(description="false: no metrics endpoint answered "
                          "(--api-metrics), so no rates, lags or checkpoints")
    svg: str | None = Field(description="the graph drawn by Graphviz's dot (null where it "
                            "is not installed); node i is the SVG group id node-i")


class PipelineList(Reply):
    pipelines: list[Pipeline]


class HistoryParams(Params):
    since: float = Field(0, ge=0, description="Only points after this Unix time.")


class QueryHistory(Reply):
    t: list[float] = Field(description="Unix times")
    composites_per_s: list[float | None]
    partial_matches: list[int | None]
    state_bytes: list[int | None]


class History(Reply):
    queries: dict[str, QueryHistory]


# ---------------------------------------------------------------- probes


class Alive(Reply):
    alive: bool


class Ready(Reply):
    ready: bool
    control_topic: str
    reason: str | None = None
