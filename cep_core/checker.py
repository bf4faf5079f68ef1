"""Static checks: a parsed query file -> checked queries, or QueryErrors at file:line:col.

The public API (CheckedQuery, check, load_queries, load_query_text) is what every engine
uses. `check` reports every problem of a file at once, in source order, each at the node
it is about; each CheckedQuery carries `types`, the type of every expression node (an
ExprType; a schema's timestamp is an int), kept beside the tree, not written into it.

How it is organised:

- `Scope` says what an expression may use where it stands (bare attributes, `var.attr`,
  which aggregates, window aggregates). Each clause of each query kind has one.
- `_QueryChecker` checks one query: an `ast.Visitor` with a `visit_<Class>` method per query
  body and per expression node class, and one method per clause (`_defines`, `_step`, ...).
- MATCH pattern analysis (nullable, first positions) is in `cep_core.regex_analysis`.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path

from cep_core import ast
from cep_core import regex_analysis as ra
from cep_core.admission import admit
from cep_core.checked import NUMERIC, CheckedQuery, ExprType, Types, select_name  # noqa: F401
from cep_core.errors import QueryError, QueryErrors
from cep_core.functions import FUNCTIONS
from cep_core.functions import lookup as lookup_function
from cep_core.parser import parse
from cep_core.recognize_pattern import recognize_elements
from cep_core.schema import (NANOS_PER_UNIT, AttrType, SchemaError, SchemaRegistry,
                             StreamSchema, TimeUnit)

T = ExprType
B = ast.BinaryOp
ORDERING = frozenset({B.LT, B.LE, B.GT, B.GE})
A = ast.AggFunc
F = ast.Builtin
WINDOW_AGGREGATES = (A.COUNT, A.SUM, A.MIN, A.MAX, A.AVG)
# Fields every composite event has (schemas/composite_event.json): no EMIT/SELECT name may
# take them.
RESERVED_FIELDS = ("query", "key", "seq", "start_seq", "events", "window_start", "window_end")
MAX_DURATION_MS = 366 * 86_400_000


def check(query_file: ast.QueryFile, registry: SchemaRegistry,
          source: str | None = None) -> list[CheckedQuery]:
    """Check every query of a file; raise QueryErrors with all problems in source order."""
    errors: list[QueryError] = []
    checked: list[CheckedQuery] = []
    first_by_name: dict[str, ast.Query] = {}
    for index, query in enumerate(query_file.queries):
        if query.name in first_by_name:
            errors.append(QueryError(
                f"query name '{query.name}' is used twice in this file (first at line "
                f"{first_by_name[query.name].pos.line})", query.pos, source))
        first_by_name.setdefault(query.name, query)
        schema = _schema_of(query, registry, source, errors)
        if schema is None:
            continue
        query_checker = _QueryChecker(query, schema, source)
        query_errors = query_checker.run()
        if not query_errors:
            candidate = CheckedQuery(query, schema, index, query_checker.types)
            query_errors = admit(candidate, source)
            if not query_errors:
                checked.append(candidate)
        errors.extend(query_errors)
    if errors:
        raise QueryErrors(_in_source_order(errors))
    return checked


def load_queries(path: str | Path, registry: SchemaRegistry | None = None) -> list[CheckedQuery]:
    """Parse and check a query file; raises QueryError (syntax) or QueryErrors (checks)."""
    text = Path(path).read_text()
    return check(parse(text, str(path)), registry or SchemaRegistry(), text)


def load_query_text(text: str, registry: SchemaRegistry | None = None,
                    path: str = "<query>") -> list[CheckedQuery]:
    return check(parse(text, path), registry or SchemaRegistry(), text)


def _schema_of(query: ast.Query, registry: SchemaRegistry, source: str | None,
               errors: list[QueryError]) -> StreamSchema | None:
    try:
        schema = registry.get(query.stream)
    except SchemaError as e:
        errors.append(QueryError(f"schema of stream '{query.stream}': {e}", query.pos, source))
        return None
    if schema is None:
        # Where a registry finds schemas (cep_core/schema.py): those given to it (`--schema
        # FILE|DIR` in the CLI), the files and folders of CEP_SCHEMA_PATH, the built-in ones;
        # a LiveRegistry (the control topic's view) also knows the streams `cep stream add`
        # registered.
        hint = ("give its schema file with --schema FILE (or a directory of <stream>.json "
                "files), or name that file or directory in CEP_SCHEMA_PATH")
        if hasattr(registry, "learn"):  # control_message.LiveRegistry
            hint += ", or register the stream on the control topic with `cep stream add FILE`"
        suggestion = _suggest(query.stream, registry.names())
        message = f"unknown stream '{query.stream}'" + (
            f"{suggestion} If not, {hint}" if suggestion else
            f": no schema of that name is known here; {hint}")
        errors.append(QueryError(message, query.pos, source))
    return schema


def _in_source_order(errors: list[QueryError]) -> list[QueryError]:
    seen: set[tuple[int, int, str]] = set()
    unique = []
    for error in errors:  # a node shared by `a = b = c` may be reported twice
        key = (error.pos.line, error.pos.column, error.message)
        if key not in seen:
            seen.add(key)
            unique.append(error)
    return sorted(unique, key=lambda e: (e.pos.line, e.pos.column))


# ---------------------------------------------------------------- scopes


@dataclass(frozen=True)
class Var:
    """A SEQ variable: the step that binds it and the step's place in sequence order
    (the members of an AND group share one place)."""

    step: ast.Step
    index: int

    @property
    def negated(self) -> bool:
        return self.step.kind is ast.StepKind.NEGATED

    @property
    def kleene(self) -> bool:
        return self.step.kind is ast.StepKind.KLEENE


class Aggregates(Enum):
    """Which aggregates a scope allows, and so how their argument is checked."""

    MATCH = "MATCH"  # over the match so far
    MATCH_EMIT = "MATCH's EMIT"  # as MATCH, and Collect()
    KLEENE = "SEQ"  # over a Kleene variable's events
    WINDOW = "WINDOW"  # over the group's events in the window
    RECOGNIZE = "MATCH_RECOGNIZE"  # over a variable's rows or the whole match


@dataclass(frozen=True)
class Scope:
    """Where an expression stands, and so which leaves it may use."""

    name: str  # for messages: "WHERE", "EMIT", "a step filter", ...
    bare: bool = True  # bare attributes (the current event's) allowed
    variables: Mapping[str, Var] | None = None  # var.attr allowed for these; None: no var.attr
    no_vars: str = ""  # message for var.attr where there are no variables ({var}, {name})
    aggregates: Aggregates | None = None  # which aggregates; None: none
    window_aggregates: bool = False
    kleene_elements: bool = True  # `x.attr` of a Kleene variable outside an aggregate
    negated: bool = True  # `x.attr` of a negated variable
    prev: bool = False  # PREV() (MATCH_RECOGNIZE's DEFINE)


_NO_VARS_MATCH = "'{var}.{name}': a MATCH query has no variables; write '{name}'"
_NO_VARS_WINDOW = "'{var}.{name}': a WINDOW query has no variables; write '{name}'"
_NO_VARS_FILTER = ("'{var}.{name}': a step filter is a condition on its own event; write "
                   "'{name}' and relate variables in WHERE")

MATCH_PREDICATE = Scope("a MATCH predicate", no_vars=_NO_VARS_MATCH, aggregates=Aggregates.MATCH)
MATCH_EMIT = replace(MATCH_PREDICATE, name="EMIT", aggregates=Aggregates.MATCH_EMIT)
SEQ_WHERE = Scope("WHERE", bare=False, variables={}, aggregates=Aggregates.KLEENE,
                 window_aggregates=True)
SEQ_EMIT = replace(SEQ_WHERE, name="EMIT", kleene_elements=False, negated=False)
STEP_FILTER = Scope("a step filter", no_vars=_NO_VARS_FILTER)
WINDOW_AGGREGATE_FILTER = Scope("a window aggregate's filter", variables={},
                                kleene_elements=False, negated=False)
WINDOW_WHERE = Scope("WHERE of a WINDOW query (it filters events before aggregation)",
                     no_vars=_NO_VARS_WINDOW)
WINDOW_SELECT = replace(WINDOW_WHERE, name="SELECT", aggregates=Aggregates.WINDOW)
RECOGNIZE_DEFINE = Scope("DEFINE", variables={}, aggregates=Aggregates.RECOGNIZE, prev=True)
RECOGNIZE_MEASURES = replace(RECOGNIZE_DEFINE, name="MEASURES", prev=False)


# ---------------------------------------------------------------- one query


class _QueryChecker(ast.Visitor):
    """`visit_<QueryBody>(body)` checks a query body, `visit_<Expression>(node, scope)` an
    expression and returns its type."""

    def __init__(self, query: ast.Query, schema: StreamSchema, source: str | None):
        self.query = query
        self.schema = schema
        self.source = source
        self.errors: list[QueryError] = []
        self.types = Types()

    def error(self, pos: ast.Pos, message: str) -> None:
        self.errors.append(QueryError(message, pos, self.source))

    def run(self) -> list[QueryError]:
        self._key_attrs(self.query.partition_by, "PARTITION BY")
        self.visit(self.query.body)
        return self.errors

    # ------------------------------------------------------------ shared pieces

    def attribute_type(self, name: str, pos: ast.Pos) -> ExprType | None:
        kind = self.schema.attributes.get(name)
        if kind is None:
            self.error(pos, f"stream '{self.schema.stream}' has no attribute '{name}'"
                            f"{_suggest(name, self.schema.attributes)}")
            return None
        return ExprType.of(kind)

    def _known_type(self, name: str) -> ExprType | None:
        kind = self.schema.attributes.get(name)
        return None if kind is None else ExprType.of(kind)

    def _key_attrs(self, attrs: list[ast.Attr], clause: str) -> None:
        for attr in attrs:
            if attr.var is not None:
                self.error(attr.pos, f"{clause} takes attribute names: write '{attr.name}', "
                                     f"not '{attr.var}.{attr.name}'")
            else:
                self.types[attr] = self.attribute_type(attr.name, attr.pos)

    def duration(self, d: ast.Duration, positive: bool = True) -> int | None:
        """The duration in the stream's time unit, or None after reporting why not."""
        if positive and d.amount <= 0:
            self.error(d.pos, f"a duration must be positive, not {_show(d)}")
            return None
        try:
            units = d.in_time_units(self.schema.time_unit)
        except ValueError as e:
            self.error(d.pos, f"{_show(d)} on stream '{self.schema.stream}' (timed in "
                              f"{self.schema.time_unit}): {e}")
            return None
        ms = _milliseconds(d, self.schema.time_unit)
        if ms is not None and ms > MAX_DURATION_MS:
            self.error(d.pos, f"{_show(d)} is longer than the maximum of 366 days")
            return None
        return units

    def event_type(self, name: str, pos: ast.Pos) -> None:
        schema = self.schema
        if schema.type_attribute is None:
            if not ast.is_any_type(name):
                self.error(pos, f"stream '{schema.stream}' has no type attribute, so its "
                                f"events have no type '{name}': use ANY, as in 'ANY x'")
            return
        if not ast.is_any_type(name) and schema.types is not None and name not in schema.types:
            self.error(pos, f"unknown event type '{name}': the {schema.type_attribute} of "
                            f"stream '{schema.stream}' is one of {', '.join(schema.types)}"
                            f"{_suggest(name, schema.types)}")

    def condition(self, expr: ast.Expr, scope: Scope, what: str) -> None:
        kind = self.expr(expr, scope)
        if kind is not None and kind is not T.BOOL:
            self.error(_start(expr), f"{what} must be a condition (bool), not {kind}")

    def _output_name(self, name: str, pos: ast.Pos, seen: dict[str, ast.Pos],
                     clause: str) -> None:
        if name in RESERVED_FIELDS:
            self.error(pos, f"output name '{name}' is a field every composite event has "
                            f"({', '.join(RESERVED_FIELDS)}); choose another")
        elif name in seen:
            self.error(pos, f"duplicate output name '{name}' in {clause} (first at line "
                            f"{seen[name].line}, column {seen[name].column})")
        else:
            seen[name] = pos

    def _emit(self, items: list[ast.EmitItem], scope: Scope) -> None:
        seen: dict[str, ast.Pos] = {}
        for item in items:
            self._output_name(item.name, item.pos, seen, "EMIT")
            self.expr(item.expr, scope)

    # ------------------------------------------------------------ MATCH

    def visit_MatchQuery(self, body: ast.MatchQuery) -> None:
        defines = self._defines(body.defines)
        self._pattern(body.pattern, defines, body.pos)
        self._emit(body.emit, MATCH_EMIT)

    def _defines(self, defines: list[ast.Define]) -> dict[str, ast.Define]:
        found: dict[str, ast.Define] = {}
        for define in defines:
            if define.name in found:
                self.error(define.pos, f"predicate '{define.name}' is defined twice (first at "
                                       f"line {found[define.name].pos.line})")
            else:
                found[define.name] = define
            self.condition(define.condition, MATCH_PREDICATE, f"predicate '{define.name}'")
        return found

    def _pattern(self, pattern: ast.Regex, defines: dict[str, ast.Define],
                 body_pos: ast.Pos) -> None:
        symbols = [p for p in ra.positions(pattern) if isinstance(p, ast.RSym)]
        for symbol in symbols:
            if symbol.name not in defines:
                self.error(symbol.pos, f"unknown predicate '{symbol.name}' in PATTERN: DEFINE "
                                       f"does not define it{_suggest(symbol.name, defines)}")
        used = {symbol.name for symbol in symbols}
        for name, define in defines.items():
            if name not in used:
                self.error(define.pos, f"predicate '{name}' is defined but not used in PATTERN")
        if ra.matches_only_empty(pattern):
            self.error(body_pos, "PATTERN matches only the empty sequence; a match needs at least "
                            "one event")
        for position in ra.first(pattern):
            start = defines.get(position.name) if isinstance(position, ast.RSym) else None
            if start is not None and _reads_aggregates(start.condition):
                self.error(position.pos, f"predicate '{start.name}' reads aggregates but can "
                                         "start a match (transition out of the start state); "
                                         "nothing has been matched yet")

    # ------------------------------------------------------------ SEQ and TESLA

    def visit_SeqQuery(self, body: ast.SeqQuery) -> None:
        variables = self._bind(body.steps)
        for index, item in enumerate(body.steps):
            for step in _members(item):
                self._step(step, index, item, variables)
        self._seq_shape(body)
        if body.emit_timeouts:
            self._timeouts(body)
        if body.within is not None:
            self.duration(body.within)
        if body.order_by is not None:
            self._order_by(body.order_by)
        if body.where is not None:
            self.condition(body.where, replace(SEQ_WHERE, variables=variables), "WHERE")
            for conjunct in _conjuncts(body.where):
                self._conjunct(conjunct, variables)
        self._emit(body.emit, replace(SEQ_EMIT, variables=variables))

    def _bind(self, items: list[ast.SeqItem]) -> dict[str, Var]:
        variables: dict[str, Var] = {}
        for index, item in enumerate(items):
            for step in _members(item):
                if step.var in variables:
                    first = variables[step.var].step.pos
                    self.error(step.pos, f"variable '{step.var}' is bound twice (first at line "
                                         f"{first.line}, column {first.column})")
                else:
                    variables[step.var] = Var(step, index)
        return variables

    def _step(self, step: ast.Step, index: int, item: ast.SeqItem,
              variables: dict[str, Var]) -> None:
        self.event_type(step.event_type, step.pos)
        if isinstance(item, ast.AndGroup) and step.kind is not ast.StepKind.EVENT:
            self.error(step.pos, "NOT and KLEENE steps cannot be inside AND(...): AND takes "
                                 "single events")
        if isinstance(item, ast.AndGroup) and step.policy is not None:
            self.error(step.pos, f"{step.policy.value.upper()} cannot be inside AND(...): "
                                 "selection policies apply to steps in sequence")
        if step.kind is ast.StepKind.KLEENE:
            self._kleene_bounds(step)
            if step.policy in (ast.Policy.LAST, ast.Policy.FIRST):
                self.error(step.pos, f"{step.policy.value.upper()} selects one event, but a "
                                     f"Kleene step binds several")
        if step.filter is not None:
            self.condition(step.filter, STEP_FILTER, "a step filter")
        if step.within is not None:
            self.duration(step.within)
        if step.anchor is not None:
            self._anchor(step, step.anchor, index, variables)

    def _kleene_bounds(self, step: ast.Step) -> None:
        if step.min < 1:
            self.error(step.pos, f"Kleene step '{step.var}' needs a lower bound of at least 1, "
                                 f"not {step.min}")
        elif step.max is not None and step.max < step.min:
            self.error(step.pos, f"Kleene step '{step.var}': upper bound {step.max} is below "
                                 f"lower bound {step.min}")

    def _anchor(self, step: ast.Step, name: str, index: int,
                variables: dict[str, Var]) -> None:
        anchor = variables.get(name)
        if anchor is None:
            self.error(step.pos, f"unknown variable '{step.anchor}' after FROM (bound: "
                                 f"{', '.join(variables)})")
        elif anchor.negated or anchor.kleene:
            self.error(step.pos, f"'{step.var}' is measured FROM '{step.anchor}', which must "
                                 "be bound to one event (not a NOT or KLEENE step)")
        elif anchor.index <= index:
            self.error(step.pos, f"'{step.var}' is measured FROM '{step.anchor}', which is not "
                                 "a later step: a TESLA step is measured back from a later event")

    def _seq_shape(self, body: ast.SeqQuery) -> None:
        steps = [step for item in body.steps for step in _members(item)]
        policies = [(step, step.policy) for step in steps if step.policy is not None]
        if policies and body.strategy is not ast.Strategy.SKIP_TILL_ANY_MATCH:
            policed, policy = policies[0]
            self.error(policed.pos, f"{policy.value.upper()} is a selection "
                                    f"policy of its own; it cannot be combined with USING "
                                    f"{body.strategy.value}")
        if all(step.kind is ast.StepKind.NEGATED for step in steps):
            if len(steps) == 1:
                self.error(steps[0].pos, "NOT cannot be the only step: a match needs a "
                                         "positive event")
            else:
                self.error(body.pos, "a SEQ needs at least one positive step (one not "
                                     "under NOT)")
            return
        if body.within is not None:
            return
        first, last = body.steps[0], body.steps[-1]
        if _is_negated(first):
            self.error(first.pos, "a pattern that starts with NOT needs WITHIN: a leading NOT "
                                  "looks back from the first event, and only the window "
                                  "says how far")
        if _is_negated(last):
            self.error(last.pos, "a pattern that ends with NOT needs WITHIN: a trailing NOT "
                                 "is decided when the window after the first event closes")

    def _timeouts(self, body: ast.SeqQuery) -> None:
        if body.within is None:
            self.error(body.timeouts_pos, "ON TIMEOUT EMIT PARTIAL needs WITHIN: a partial "
                                          "match times out when its window closes")
        if body.strategy is ast.Strategy.SKIP_TILL_ANY_MATCH:
            self.error(body.timeouts_pos, "ON TIMEOUT EMIT PARTIAL needs USING "
                                          "skip-till-next-match or strict-contiguity: under "
                                          "skip-till-any-match every prefix of every "
                                          "combination would be a partial match")

    def _order_by(self, attr: ast.Attr) -> None:
        self.types[attr] = self._known_type(attr.name)
        if attr.name != self.schema.time:
            self.error(attr.pos, f"ORDER BY takes the time attribute '{self.schema.time}' "
                                 f"(or seq), not '{attr.name}'")

    def _conjunct(self, conjunct: ast.Expr, variables: dict[str, Var]) -> None:
        """Checks on one WHERE condition (top-level AND operand) as a whole."""
        mentions = [(name, pos) for name, pos in _mentions(conjunct) if name in variables]
        names = list(dict.fromkeys(name for name, _ in mentions))
        negated = [name for name in names if variables[name].negated]
        if len(negated) > 1:
            self.error(_start(conjunct), "a condition may mention at most one negated "
                                         f"variable; this one mentions {', '.join(negated)}")
        for name in names:
            var = variables[name]
            if var.step.policy not in (ast.Policy.LAST, ast.Policy.FIRST):
                continue
            policy = var.step.policy.value.upper()
            for other, pos in mentions:
                if other != name and variables[other].index <= var.index:
                    self.error(pos, f"condition on {policy} step '{name}' mentions '{other}', "
                                    f"which is not a later step: {policy} is chosen backwards "
                                    "from the terminator, so its conditions may only mention "
                                    "itself and later steps")

    # ------------------------------------------------------------ MATCH_RECOGNIZE

    def visit_RecognizeQuery(self, body: ast.RecognizeQuery) -> None:
        """Flink's MATCH_RECOGNIZE: what Flink 2.3 refuses is refused here, with its reason."""
        if body.all_rows_pos is not None:
            self.error(body.all_rows_pos, "ALL ROWS PER MATCH: Flink answers ONE ROW PER MATCH "
                                          "only")
        if body.order_by.name != self.schema.time:
            self.error(body.order_by.pos, f"ORDER BY takes the time attribute "
                                          f"'{self.schema.time}' (Flink orders a MATCH_RECOGNIZE "
                                          f"by its time attribute), not '{body.order_by.name}'")
        self.types[body.order_by] = self._known_type(body.order_by.name)
        if body.order_desc_pos is not None:
            self.error(body.order_desc_pos, f"ORDER BY {body.order_by.name} DESC: Flink refuses "
                                            "it (\"Primary sort order of a streaming table must "
                                            "be ascending on time\")")
        for attr in body.then_by:  # rows of one time: Flink sorts them by these
            self.types[attr] = self.attribute_type(attr.name, attr.pos)
        variables = {}
        for index, element in enumerate(recognize_elements(body.pattern, self.error)):
            if element.var in variables:
                self.error(element.pos, f"pattern variable '{element.var}' appears twice; Flink "
                                        "takes each variable once")
            variables[element.var] = Var(ast.Step(ast.StepKind.EVENT, ast.ANY_TYPE, element.var,
                                                  pos=element.pos), index)
        for symbol in body.pattern.find_all(ast.RSym):  # those of a refused part too
            variables.setdefault(symbol.name, Var(ast.Step(
                ast.StepKind.EVENT, ast.ANY_TYPE, symbol.name, pos=symbol.pos), len(variables)))
        self._recognize_skip(body, variables)
        if body.within is not None:
            self.duration(body.within)
        seen: dict[str, ast.Pos] = {}
        for define in body.defines:
            if define.name in seen:
                self.error(define.pos, f"'{define.name}' is defined twice (first at line "
                                       f"{seen[define.name].line})")
            elif define.name not in variables:
                self.error(define.pos, f"DEFINE '{define.name}': PATTERN has no such variable"
                                       f"{_suggest(define.name, variables)}")
            seen.setdefault(define.name, define.pos)
            self.condition(define.condition, replace(RECOGNIZE_DEFINE, variables=variables),
                           f"DEFINE '{define.name}'")
        outputs: dict[str, ast.Pos] = {}
        for attr in self.query.partition_by:
            outputs[attr.name] = attr.pos
        for item in body.measures:
            if item.name in _COMPOSITE_NAMES:
                self.error(item.pos, f"MEASURES ... AS {item.name}: Flink takes this name, but "
                                     f"every composite event here has '{item.name}' already "
                                     f"({_COMPOSITE_NAMES[item.name]}); name the measure "
                                     f"otherwise, as in AS {item.name}_")
                continue
            self._output_name(item.name, item.pos, outputs, "PARTITION BY and MEASURES")
            self.expr(item.expr, replace(RECOGNIZE_MEASURES, variables=variables))
        for attr in body.select or []:
            if attr.name not in outputs:
                self.error(attr.pos, f"SELECT '{attr.name}': a MATCH_RECOGNIZE answers its "
                                     f"PARTITION BY attributes and MEASURES only"
                                     f"{_suggest(attr.name, outputs)}")
            self.types[attr] = self._known_type(attr.name)

    def _recognize_skip(self, body: ast.RecognizeQuery, variables: dict[str, Var]) -> None:
        if body.skip_var is None:
            return
        var = variables.get(body.skip_var)
        if var is None:
            self.error(body.pos, f"AFTER MATCH SKIP {body.skip.value.upper()} "
                                 f"{body.skip_var}: PATTERN has no such variable"
                                 f"{_suggest(body.skip_var, variables)}")
        elif body.skip is ast.SkipTo.FIRST and var.index == 0:
            self.error(body.pos, f"AFTER MATCH SKIP TO FIRST {body.skip_var}: the pattern's "
                                 "first variable; the next match would start where this one "
                                 "did (Flink refuses it)")

    def _recognize_call(self, node: ast.Call, name: ast.Builtin,
                        scope: Scope) -> ExprType | None:
        if name is F.COALESCE:
            return self._coalesce(node, scope)
        if name is F.IS_NULL:
            self.expr(node.args[0], scope)
            return T.BOOL
        if name in _FLINK_LACKS:
            self.error(node.pos, f"{name}(): {_FLINK_LACKS[name]}")
            return None
        if name in (F.PREV, F.NEXT):
            return self._prev(node, name, scope)
        if node.args:
            self.error(node.pos, f"{name}() takes no argument")
            return None
        # MATCH_ROWTIME(), MATCH_PROCTIME(): in DEFINE too, as in Flink (there MATCH_ROWTIME()
        # is the current row's time); MATCH_PROCTIME() is the machine's clock, in milliseconds
        return T.INT

    def _prev(self, node: ast.Call, name: ast.Builtin, scope: Scope) -> ExprType | None:
        """PREV(expr [, n]) in DEFINE as Flink 2.3 takes it: the row n (default 1) before
        the current one within the match, of an expression over the current row's columns."""
        if not scope.prev:
            self.error(node.pos, f"{name} in MEASURES: Flink refuses it (\"Cannot use "
                                 f"PREV/NEXT in MEASURE\"); use FIRST or LAST, as in "
                                 f"LAST(B.price, 1)")
            return None
        if name is F.NEXT:
            self.error(node.pos, "NEXT in DEFINE: Flink refuses it (\"Flink does not support "
                                 "physical offsets within partition\": a DEFINE sees the rows "
                                 "so far, not the next one)")
            return None
        if not 1 <= len(node.args) <= 2:
            self.error(node.pos, "PREV takes an expression and an optional offset, as in "
                                 "PREV(price) or PREV(price, 2)")
            return None
        if len(node.args) == 2:
            offset = node.args[1]
            if not isinstance(offset, ast.Literal) or type(offset.value) is not int or \
                    offset.duration is not None:
                self.error(_start(offset), "PREV's offset is a whole number, as in "
                                           "PREV(price, 2) (Flink refuses an expression there)")
                return None
            if offset.value < 0:
                self.error(offset.pos, f"PREV(..., {offset.value}): a negative offset looks "
                                       "ahead, which Flink fails on when it runs (an "
                                       "IndexOutOfBoundsException); PREV looks back")
                return None
        nested = next(iter(node.args[0].find_all(ast.Aggregate)), None)
        if nested is not None:
            self.error(nested.pos, f"PREV({nested.func.value.upper()}(...)): Flink refuses "
                                   "navigation inside PREV (\"Flink does not support physical "
                                   "offsets within partition\"); write PREV(price) or "
                                   "LAST(B.price, 1)")
            return None
        named = next((a for a in node.args[0].find_all(ast.Attr) if a.var), None)
        if named is not None:
            self.error(named.pos, f"PREV({named.var}.{named.name}): Flink refuses a "
                                  f"variable's column in PREV (no physical offsets within "
                                  f"a partition); write PREV({named.name}) for the "
                                  f"previous row, or LAST({named.var}.{named.name}, 1)")
            return None
        return self.expr(node.args[0], scope)

    def _coalesce(self, node: ast.Call, scope: Scope) -> ExprType | None:
        kinds = [self.expr(arg, scope) for arg in node.args]
        known = [k for k in kinds if k is not None]
        if not node.args:
            self.error(node.pos, "COALESCE takes at least one argument")
            return None
        if len({_kind(k) for k in known}) > 1:
            self.error(node.pos, f"COALESCE of {' and '.join(dict.fromkeys(known))}: its "
                                 "arguments must be of one kind")
            return None
        return T.FLOAT if T.FLOAT in known else (known[0] if known else None)

    # ------------------------------------------------------------ WINDOW

    def visit_WindowQuery(self, body: ast.WindowQuery) -> None:
        if isinstance(body.window, ast.TimeWindow):
            window_attr = self._time_window(body.window)
        else:
            self._row_window(body.window)
            window_attr = None
        self._key_attrs(body.group_by, "GROUP BY")
        if body.where is not None:
            self.condition(body.where, WINDOW_WHERE, "WHERE")
        self._select(body, window_attr)

    def _time_window(self, window: ast.TimeWindow) -> str | None:
        size, slide = self.duration(window.range), self.duration(window.slide)
        if size is not None and slide is not None and size % slide:
            self.error(window.range.pos, f"RANGE ({_show(window.range)}) must be a multiple "
                                         f"of SLIDE ({_show(window.slide)})")
        name = window.attr or self.schema.time
        kind = self.schema.attributes.get(name)
        if kind is None:
            self.error(window.pos, f"WATTR '{name}': stream '{self.schema.stream}' has no "
                                   f"such attribute{_suggest(name, self.schema.attributes)}")
            return None
        if kind not in (AttrType.INT, AttrType.TIMESTAMP):
            self.error(window.pos, f"WATTR '{name}' must be an int or timestamp attribute, "
                                   f"not {kind}")
        return name

    def _row_window(self, window: ast.RowWindow) -> None:  # count-based: no window attribute
        if window.rows < 1:
            self.error(window.pos, f"ROWS must be at least 1, not {window.rows}")
        if window.slide < 1:
            self.error(window.pos, f"SLIDE must be at least 1 row, not {window.slide}")
        elif window.rows >= 1 and window.rows % window.slide:
            self.error(window.pos, f"ROWS {window.rows} must be a multiple of SLIDE "
                                   f"{window.slide}")

    def _select(self, body: ast.WindowQuery, window_attr: str | None) -> None:
        group = {attr.name for attr in body.group_by}
        seen: dict[str, ast.Pos] = {}
        for item in body.items:
            expr = item.expr
            self.expr(expr, WINDOW_SELECT)
            if isinstance(expr, ast.Attr) and expr.var is None and self.types[expr] is not None \
                    and expr.name not in group and expr.name != window_attr:
                also = f" nor the window attribute '{window_attr}'" if window_attr else ""
                self.error(expr.pos, f"'{expr.name}' in SELECT is not a GROUP BY attribute"
                                     f"{also}: aggregate it, as in max({expr.name})")
            elif not isinstance(expr, (ast.Aggregate, ast.Attr)):
                self.error(_start(expr), "a SELECT item is an aggregate (count, sum, min, max, "
                                         "avg), a GROUP BY attribute or the window attribute")
            self._output_name(select_name(item), item.pos, seen, "SELECT")
        if not any(isinstance(item.expr, ast.Aggregate) for item in body.items):
            self.error(body.pos, "a WINDOW query needs an aggregate in SELECT")

    # ------------------------------------------------------------ expressions

    def expr(self, node: ast.Expr, scope: Scope) -> ExprType | None:
        """Check an expression, record its type (and its children's) in `types` and return
        it; None when an error made it unknown."""
        kind: ExprType | None = self.visit(node, scope)
        self.types[node] = kind
        return kind

    def visit_Literal(self, node: ast.Literal, scope: Scope) -> ExprType | None:
        if node.duration is not None:  # not beside Delta (`_binary` takes those)
            d = node.duration
            self.error(node.pos, f"a duration ({_show(d)}) can only be compared with "
                                 f"Delta({self.schema.time}); elsewhere write the number in "
                                 f"the stream's time unit ({self.schema.time_unit})"
                                 f"{_as_units(d, self.schema.time_unit)}")
            return None
        return {bool: T.BOOL, int: T.INT, float: T.FLOAT, str: T.STRING}[type(node.value)]

    def _delta_duration(self, node: ast.Binary) -> ast.Literal | None:
        """The duration literal of a comparison `Delta(ts) <= 5 minutes` (either side)."""
        if not node.op.is_comparison:
            return None
        for literal, other in ((node.left, node.right), (node.right, node.left)):
            if isinstance(literal, ast.Literal) and literal.duration is not None and \
                    isinstance(other, ast.Aggregate) and other.func is A.DELTA:
                return literal
        return None

    def visit_Attr(self, node: ast.Attr, scope: Scope) -> ExprType | None:
        if node.var is None:
            if not scope.bare:
                self.error(node.pos, f"bare attribute '{node.name}' in a SEQ pattern: name the "
                                     f"event it belongs to, as in "
                                     f"'{_example_var(scope)}.{node.name}'")
                return self._known_type(node.name)
            return self.attribute_type(node.name, node.pos)
        if scope.variables is None:
            self.error(node.pos, scope.no_vars.format(var=node.var, name=node.name))
            return self._known_type(node.name)
        var = self.variable(node.var, node.pos, scope)
        if var is not None and var.negated and not scope.negated:
            self.error(node.pos, f"'{node.var}' is a negated variable: it binds no event, so "
                                 f"{scope.name} cannot read it")
        elif var is not None and var.kleene and not scope.kleene_elements:
            hint = (f"{scope.name} needs an aggregate over it, as in avg({node.var}.{node.name})"
                    if scope.aggregates is Aggregates.KLEENE
                    else f"{scope.name} can only read variables bound to one event")
            self.error(node.pos, f"'{node.var}' is a Kleene variable bound to several events: "
                                 f"{hint}")
        return self.attribute_type(node.name, node.pos)

    def variable(self, name: str, pos: ast.Pos, scope: Scope) -> Var | None:
        var = (scope.variables or {}).get(name)
        if var is None:
            bound = ", ".join(scope.variables or {}) or "none"
            self.error(pos, f"unknown variable '{name}' (the pattern binds: {bound})")
        return var

    def visit_Unary(self, node: ast.Unary, scope: Scope) -> ExprType | None:
        kind = self.expr(node.operand, scope)
        if node.op is ast.UnaryOp.NOT:
            self._expect_bool(node.operand, kind, "NOT")
            return T.BOOL
        if kind is not None and kind not in NUMERIC:
            self.error(_start(node.operand), f"unary '-' takes a number, not {kind}")
            return None
        return kind

    def visit_Binary(self, node: ast.Binary, scope: Scope) -> ExprType | None:
        duration = self._delta_duration(node)
        if duration is not None and duration.duration is not None:  # (always, when found)
            # Delta is in the stream's time unit: so is the duration, as a plain int from here
            # on (recomputed from `duration` each time, so checking twice changes nothing).
            units = self.duration(duration.duration, positive=False)
            duration.value, self.types[duration] = (units, T.INT) if units is not None \
                else (0, None)
        left = self.types[duration] if duration is node.left else self.expr(node.left, scope)
        right = self.types[duration] if duration is node.right else self.expr(node.right, scope)
        if node.op.is_logical:
            self._expect_bool(node.left, left, node.op)
            self._expect_bool(node.right, right, node.op)
            return T.BOOL
        if node.op.is_comparison:
            self._comparable(node, left, right)
            return T.BOOL
        return self._arithmetic(node, left, right)

    def _expect_bool(self, operand: ast.Expr, kind: ExprType | None, op: str) -> None:
        if kind is not None and kind is not T.BOOL:
            self.error(_start(operand), f"{op} takes conditions (bool), not {kind}")

    def _comparable(self, node: ast.Binary, left: ExprType | None, right: ExprType | None) -> None:
        if left is None or right is None:
            return
        if T.LIST in (left, right):
            self.error(node.pos, f"cannot compare lists with '{node.op}'")
        elif _kind(left) != _kind(right):
            self.error(node.pos, f"cannot compare {left} with {right}")
        elif left is T.BOOL and node.op in ORDERING:
            self.error(node.pos, f"cannot order bool values with '{node.op}'")

    def _arithmetic(self, node: ast.Binary, left: ExprType | None,
                    right: ExprType | None) -> ExprType | None:
        ok = True
        for operand, kind in ((node.left, left), (node.right, right)):
            if kind is not None and kind not in NUMERIC:
                self.error(_start(operand), f"arithmetic on {kind}: '{node.op}' takes numbers")
                ok = False
        if not ok or left is None or right is None:
            return None
        if node.op is ast.BinaryOp.DIV or T.FLOAT in (left, right):
            return T.FLOAT
        return T.INT

    def visit_InList(self, node: ast.InList, scope: Scope) -> str:
        kind = self.expr(node.operand, scope)
        if kind is T.LIST:
            self.error(_start(node.operand), "IN tests a single value, not a list")
            kind = None
        for option in node.options:
            option_kind = self.expr(option, scope)
            if kind is not None and option_kind is not None and \
                    _kind(option_kind) != _kind(kind):
                self.error(_start(option), f"IN list item is {option_kind} but the value "
                                           f"tested is {kind}")
        return T.BOOL

    def visit_Call(self, node: ast.Call, scope: Scope) -> ExprType | None:
        if scope.aggregates is Aggregates.RECOGNIZE and node.func in RECOGNIZE_CALLS:
            return self._recognize_call(node, node.func, scope)
        if node.func is F.IS_NULL:
            self.error(node.pos, "IS NULL is for MATCH_RECOGNIZE; a value here is never NULL")
            return None
        kinds = [self.expr(arg, scope) for arg in node.args]
        function = lookup_function(node.name)
        if function is None:
            pure = [f.name for f in FUNCTIONS.values() if f.pure]
            self.error(node.pos, f"unknown function '{node.name}'{_suggest(node.name, pure)}")
            return None
        if not function.pure:
            self.error(node.pos, f"function {node.name}() is not pure: queries may only call "
                                 "pure functions")
            return None
        if len(node.args) != len(function.params):
            self.error(node.pos, f"function {node.name}() takes {len(function.params)} "
                                 f"argument{'s' if len(function.params) != 1 else ''}, "
                                 f"got {len(node.args)}")
            return None
        ok = True
        for number, (arg, kind, param) in enumerate(zip(node.args, kinds, function.params), 1):
            if kind is None:
                ok = False
            elif not param.accepts(kind):
                self.error(_start(arg), f"argument {number} of {node.name}() must be a "
                                        f"{param}, not {kind}")
                ok = False
        if not ok:
            return function.result
        return function.result_type(kinds)

    def visit_Aggregate(self, node: ast.Aggregate, scope: Scope) -> ExprType | None:
        if scope.aggregates is None:
            self.error(node.pos, f"aggregates are not allowed in {scope.name}")
            return None
        if node.offset and scope.aggregates is not Aggregates.RECOGNIZE:
            self.error(node.pos, f"{node.func.value}(..., {node.offset}): an offset is for "
                                 "MATCH_RECOGNIZE only")
            return None
        arg_kind = _AGGREGATE_ARGS[scope.aggregates](self, node, scope)
        if arg_kind is _INVALID:
            return None
        if scope.aggregates is Aggregates.RECOGNIZE and node.func is A.AVG:
            return arg_kind  # Flink: AVG of an INT column is an INT
        return self._aggregate_type(node.func, arg_kind, node.arg.pos if node.arg else node.pos)

    def _aggregate_type(self, func: ast.AggFunc, arg_kind: ExprType | None,
                        pos: ast.Pos) -> ExprType | None:
        """The result type of an aggregate over values of `arg_kind` (None: no attribute,
        or an unknown one)."""
        if func in (A.SUM, A.AVG) and arg_kind is not None and arg_kind not in NUMERIC:
            self.error(pos, f"{func.value} takes numbers, not {arg_kind}")
            return None
        if func in (A.MIN, A.MAX) and arg_kind is not None and \
                arg_kind not in (*NUMERIC, T.STRING):
            self.error(pos, f"{func.value} takes numbers or strings, not {arg_kind}")
            return None
        fixed = {A.COUNT: T.INT, A.AVG: T.FLOAT, A.DELTA: T.INT, A.COLLECT: T.LIST}
        return fixed.get(func, arg_kind)

    def _match_aggregate_arg(self, node: ast.Aggregate, scope: Scope) -> _ArgKind:
        """MATCH: over the match so far; `Count()` or an attribute of the current stream."""
        arg = node.arg
        if node.func is A.COLLECT and scope.aggregates is not Aggregates.MATCH_EMIT:
            self.error(node.pos, "Collect() builds a list for EMIT; it is not allowed in "
                                 f"{scope.name}")
            return _INVALID
        if arg is None:
            return None
        if arg.var is not None:
            if node.func is A.COUNT:
                self.error(arg.pos, "Count() in MATCH counts the events of the match and "
                                    "takes no argument")
            else:
                self.error(arg.pos, f"aggregates in MATCH are over the match, which has no "
                                    f"variables: write {node.func.value}({arg.name})")
            return _INVALID
        arg_kind = self.types[arg] = self.attribute_type(arg.name, arg.pos)
        if node.func is A.DELTA and arg_kind is not None and arg.name != self.schema.time:
            self.error(arg.pos, f"Delta takes the time attribute '{self.schema.time}', "
                                f"not '{arg.name}'")
            return _INVALID
        return arg_kind

    def _kleene_aggregate_arg(self, node: ast.Aggregate, scope: Scope) -> _ArgKind:
        """SEQ: over the events bound to a Kleene variable (`avg(dup.price)`, `count(dup)`)."""
        arg = node.arg
        if node.func in (A.DELTA, A.COLLECT):
            self.error(node.pos, f"{node.func.value} is a MATCH aggregate; over a Kleene "
                                 "variable use count, sum, min, max, avg, first or last")
            return _INVALID
        if arg is None or arg.var is None:
            kleene = _example_var(scope, kleene=True)
            example = (f"count({kleene})" if node.func is A.COUNT or arg is None  # count(*)
                       else f"{node.func.value}({kleene}.{arg.name})")
            self.error(node.pos, f"an aggregate in a SEQ pattern is over a Kleene variable, "
                                 f"as in {example}")
            return _INVALID
        var = self.variable(arg.var, arg.pos, scope)
        if var is None:
            return _INVALID
        if not var.kleene:
            self.error(arg.pos, f"'{arg.var}' is not a Kleene variable: aggregates in a SEQ "
                                "pattern are over KLEENE steps (one or more events)")
            return _INVALID
        if arg.name == "":  # count(dup)
            self.types[arg] = T.LIST
            return None
        if node.func is A.COUNT:
            self.error(node.pos, f"count over a Kleene variable counts its events: write "
                                 f"count({arg.var})")
            return _INVALID
        kind = self.types[arg] = self.attribute_type(arg.name, arg.pos)
        return kind

    def _window_aggregate_arg(self, node: ast.Aggregate, scope: Scope) -> _ArgKind:
        """WINDOW: over the group's events in the window; `count(*)`, `count(attr)`,
        `sum/min/max/avg(attr)`."""
        arg = node.arg
        if node.func not in WINDOW_AGGREGATES:
            self.error(node.pos, f"{node.func.value} is not a WINDOW aggregate (use count, "
                                 "sum, min, max or avg)")
            return _INVALID
        if arg is None:
            return None
        if node.func is A.COUNT and arg.name == "":  # count(price): Attr(name="", var="price")
            assert arg.var is not None
            kind = self.types[arg] = self.attribute_type(arg.var, arg.pos)
            return kind
        if arg.var is not None:
            self.error(arg.pos, _NO_VARS_WINDOW.format(var=arg.var, name=arg.name))
            return _INVALID
        kind = self.types[arg] = self.attribute_type(arg.name, arg.pos)
        return kind

    def _recognize_aggregate_arg(self, node: ast.Aggregate, scope: Scope) -> _ArgKind:
        """MATCH_RECOGNIZE: over the rows of one variable (`AVG(B.price)`) or of the whole
        match (`COUNT(*)`, `SUM(price)`)."""
        arg = node.arg
        if node.func in (A.DELTA, A.COLLECT):
            self.error(node.pos, f"{node.func.value}(...) is not a MATCH_RECOGNIZE function "
                                 "here (use FIRST, LAST, COUNT, SUM, AVG, MIN or MAX)")
            return _INVALID
        if arg is None:
            return None
        if node.func is A.COUNT and arg.name == "":  # COUNT(price) arrives as var="price"
            self.types[arg] = self.attribute_type(arg.var or "", arg.pos)
            return None
        if arg.var is not None:
            self.variable(arg.var, arg.pos, scope)
        kind = self.types[arg] = self.attribute_type(arg.name, arg.pos)
        return kind

    def visit_WindowAggregate(self, node: ast.WindowAggregate, scope: Scope) -> ExprType | None:
        if not scope.window_aggregates:
            self.error(node.pos, f"a window aggregate (... WITHIN w FROM x) is not allowed in "
                                 f"{scope.name}; it belongs in WHERE or EMIT of a SEQ pattern")
            return None
        self.event_type(node.event_type, node.pos)
        self.duration(node.within)
        anchor = self.variable(node.anchor, node.pos, scope)
        if anchor is not None and (anchor.negated or anchor.kleene):
            self.error(node.pos, f"a window aggregate is measured FROM '{node.anchor}', which "
                                 "must be bound to one event (not a NOT or KLEENE step)")
        if node.filter is not None:
            self.condition(node.filter, replace(WINDOW_AGGREGATE_FILTER,
                                                variables=scope.variables),
                           "a window aggregate's filter")
        arg_kind = self.attribute_type(node.attr, node.pos) if node.attr else None
        if node.attr and arg_kind is None:
            return None
        return self._aggregate_type(node.func, arg_kind, node.pos)


class _Invalid(Enum):
    INVALID = "invalid"  # an aggregate argument that was reported as wrong


_INVALID = _Invalid.INVALID
_ArgKind = ExprType | _Invalid | None  # an aggregate argument's type (None: no argument)

_AGGREGATE_ARGS = {
    Aggregates.MATCH: _QueryChecker._match_aggregate_arg,
    Aggregates.MATCH_EMIT: _QueryChecker._match_aggregate_arg,
    Aggregates.KLEENE: _QueryChecker._kleene_aggregate_arg,
    Aggregates.WINDOW: _QueryChecker._window_aggregate_arg,
    Aggregates.RECOGNIZE: _QueryChecker._recognize_aggregate_arg,
}
RECOGNIZE_CALLS = frozenset({F.PREV, F.NEXT, F.MATCH_ROWTIME, F.MATCH_PROCTIME, F.COALESCE,
                             F.IS_NULL, F.CLASSIFIER, F.MATCH_NUMBER})
# The fields a MATCH_RECOGNIZE's composite event has beside its PARTITION BY and MEASURES
_COMPOSITE_NAMES = {"query": "the query's name", "key": "the partition key",
                    "seq": "the seq of the match's last row",
                    "start_seq": "the seq of its first row"}
# What Flink 2.3's MATCH_RECOGNIZE refuses though SQL:2016 has it (its own words quoted)
_FLINK_LACKS = {
    F.CLASSIFIER: "Flink 2.3 refuses it when it plans the query (\"Unsupported call: "
                  "CLASSIFIER()\"), in MEASURES and in DEFINE",
    F.MATCH_NUMBER: "Flink 2.3 has no such function (\"No match found for function "
                    "signature MATCH_NUMBER()\")",
}


# ---------------------------------------------------------------- small helpers


def _kind(value_type: ExprType) -> ExprType:
    """Types that compare with each other: numbers (all as FLOAT), strings, bools, lists."""
    return T.FLOAT if value_type in NUMERIC else value_type


def _start(expr: ast.Expression) -> ast.Pos:
    """Where an expression begins in the text (the leftmost position of its nodes)."""
    located = [node.pos for node in expr.find_all(ast.Expression) if node.pos.line > 0]
    return min(located, key=lambda p: (p.line, p.column), default=expr.pos)


def _members(item: ast.SeqItem) -> list[ast.Step]:
    return item.steps if isinstance(item, ast.AndGroup) else [item]


def _is_negated(item: ast.SeqItem) -> bool:
    return isinstance(item, ast.Step) and item.kind is ast.StepKind.NEGATED


def _conjuncts(expr: ast.Expr) -> list[ast.Expr]:
    if isinstance(expr, ast.Binary) and expr.op is ast.BinaryOp.AND:
        return _conjuncts(expr.left) + _conjuncts(expr.right)
    return [expr]


def _mentions(expr: ast.Expr) -> list[tuple[str, ast.Pos]]:
    """The variables an expression reads, with where, in source order."""
    found = []
    for node in expr.find_all(ast.Attr, ast.WindowAggregate):
        if isinstance(node, ast.Attr) and node.var is not None:
            found.append((node.var, node.pos))
        elif isinstance(node, ast.WindowAggregate):
            found.append((node.anchor, node.pos))
    return found


def _reads_aggregates(expr: ast.Expr) -> bool:
    return expr.find(ast.Aggregate) is not None


def _example_var(scope: Scope, kleene: bool = False) -> str:
    for name, var in (scope.variables or {}).items():
        if not var.negated and var.kleene == kleene:
            return name
    return "x"


def _show(d: ast.Duration) -> str:
    return f"{d.amount} {d.unit}"


def _as_units(d: ast.Duration, time_unit: TimeUnit) -> str:
    """`: 300000` — the duration as a number in the time unit, when it is a whole one."""
    try:
        return f": {d.in_time_units(time_unit)}"
    except ValueError:
        return ""


def _milliseconds(d: ast.Duration, time_unit: TimeUnit) -> float | None:
    if d.unit is not ast.DurationUnit.TICKS:
        return d.amount * ast.Duration.UNIT_MS[d.unit]
    if time_unit is TimeUnit.TICKS:
        return None
    return d.amount * NANOS_PER_UNIT[time_unit] / NANOS_PER_UNIT[TimeUnit.MS]


def _suggest(name: str, candidates: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(candidates), n=1)
    return f"; did you mean '{close[0]}'?" if close else ""
