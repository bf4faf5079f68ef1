"""Query text -> AST, with the grammar in `grammar.lark` (lark, LALR).

Syntax errors and malformed constructs become `QueryError`s at file:line:col.
Semantic checks (names, types, ranges) are in `cep_core.checker`.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
import tempfile
from functools import lru_cache
from pathlib import Path
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, cast

import lark
from lark import Token, Transformer, v_args
from lark.tree import Meta

from cep_core import ast
from cep_core.errors import QueryError
from cep_core.home import cache_dir
from cep_core.query_limits import check_text_size

GRAMMAR = Path(__file__).with_name("grammar.lark")

_U = ast.DurationUnit
DURATION_UNITS: dict[str, ast.DurationUnit] = {
    **dict.fromkeys(("ms", "millisecond", "milliseconds", "msec"), _U.MS),
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), _U.S),
    **dict.fromkeys(("min", "mins", "minute", "minutes"), _U.MIN),
    **dict.fromkeys(("h", "hr", "hour", "hours"), _U.H),
    **dict.fromkeys(("d", "day", "days"), _U.D),
    **dict.fromkeys(("tick", "ticks"), _U.TICKS),
}

AGGREGATES = {
    "count": ast.AggFunc.COUNT, "first": ast.AggFunc.FIRST, "last": ast.AggFunc.LAST,
    "max": ast.AggFunc.MAX, "min": ast.AggFunc.MIN, "sum": ast.AggFunc.SUM,
    "avg": ast.AggFunc.AVG, "average": ast.AggFunc.AVG, "delta": ast.AggFunc.DELTA,
    "collect": ast.AggFunc.COLLECT,
}

# Readable names for the grammar's terminals, used in "expected ..." messages.
TERMINAL_NAMES = {
    "NAME": "a name", "INT": "an integer", "DECIMAL": "a number", "STRING": "a string",
    "LPAR": "'('", "RPAR": "')'", "COMMA": "','", "SEMICOLON": "';'", "DOT": "'.'",
    "LSQB": "'['", "RSQB": "']'", "LBRACE": "'{'", "RBRACE": "'}'", "STAR": "'*'",
    "VBAR": "'|'", "EQUAL": "'='", "MINUS": "'-'", "PLUS": "'+'", "REPEAT": "'*', '+' or '?'",
    "COMP_OP": "a comparison", "ADD_OP": "'+' or '-'", "MUL_OP": "'*', '/' or '%'",
    "POLICY": "EACH, LAST or FIRST", "STRATEGY": "a selection strategy",
    "TRUE": "TRUE", "FALSE": "FALSE", "NOT_IN": "NOT IN", "$END": "end of file",
}


LARK_OPTIONS = {"parser": "lalr", "propagate_positions": True, "maybe_placeholders": True}


@lru_cache(maxsize=1)
def _lark() -> lark.Lark:
    """The parser: built from the grammar once, then loaded from a cache file (building
    the LALR tables takes ~0.1-0.25 s, loading them ~7 ms). The file is named by a hash of
    the grammar, the options and the lark and Python versions, so a changed grammar or
    lark gets its own; it lives beside the kernel cache (`parser_cache_path`). Any
    problem with the cache (unwritable, unreadable, corrupt) only means building."""
    text = GRAMMAR.read_text()
    path = parser_cache_path(text)
    if path is not None:
        try:
            with path.open("rb") as f:
                return lark.Lark.load(f)
        except FileNotFoundError:
            pass
        except Exception:  # a corrupt or foreign file: build and replace it
            pass
    parser = lark.Lark(text, **LARK_OPTIONS)
    if path is not None:
        _save(parser, path)
    return parser


def parser_cache_path(text: str) -> Path | None:
    """Where the parser of grammar `text` is cached: `parser/lark-<hash>.pickle` under the
    cache root (cep_core.home; ~/.cache/cep/parser by default); None when that folder
    cannot be made."""
    key = "\0".join([text, repr(sorted(LARK_OPTIONS.items())), lark.__version__,
                     sys.version.split()[0]])
    try:
        folder = cache_dir("parser")
    except OSError:
        return None
    return folder / f"lark-{hashlib.sha256(key.encode()).hexdigest()[:24]}.pickle"


def _save(parser: lark.Lark, path: Path) -> None:
    """Write the parser's tables atomically (a concurrent reader never sees half a file)."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                parser.save(f)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        pass


def parse(text: str, path: str = "<query>") -> ast.QueryFile:
    """Parse query text into an unchecked `QueryFile` (a text over the size limit of
    `cep_core.query_limits` is refused before it is read)."""
    check_text_size(text, path)
    try:
        tree = _lark().parse(text)
    except lark.UnexpectedInput as e:
        raise _syntax_error(e, text, path) from None
    _check_depth(tree, path, text)
    try:
        queries = _ToAst(path).transform(tree)
    except lark.exceptions.VisitError as e:
        if isinstance(e.orig_exc, QueryError):
            raise e.orig_exc.with_source(text) from None
        raise
    for query in queries:
        _check_ast_depth(query, text)
        member = query.find(_CallMember)
        if member is not None:
            raise QueryError("'.attribute' after a call is only for window aggregates, as "
                             "in avg(Temp(area = s.area).value WITHIN 5 minutes FROM s)",
                             member.pos, text)
    return ast.QueryFile(path, queries)


MAX_TREE_DEPTH = 100  # parse-tree levels; every later pass recurses over the tree


def _check_depth(tree: lark.Tree[Token], path: str, text: str) -> None:
    """A QueryError where the parse tree first gets deeper than MAX_TREE_DEPTH (deeply nested
    parentheses or very long operator chains), found without recursion."""
    stack = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_TREE_DEPTH:
            line = getattr(node.meta, "line", 1) if not node.meta.empty else 1
            column = getattr(node.meta, "column", 1) if not node.meta.empty else 1
            raise QueryError(f"the query is nested too deeply (more than {MAX_TREE_DEPTH} "
                             "levels of parentheses and operators)", ast.Pos(path, line, column),
                             text)
        stack.extend((child, depth + 1) for child in node.children
                     if isinstance(child, lark.Tree))


def _check_ast_depth(query: ast.Query, text: str) -> None:
    """The same bound on the AST, where operator chains (`a + b + c ...`) nest."""
    stack: list[tuple[ast.Node, int]] = [(query, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_TREE_DEPTH:
            raise QueryError(f"the query is nested too deeply (more than {MAX_TREE_DEPTH} "
                             "levels of parentheses and operators)",
                             getattr(node, "pos", query.pos), text)  # ast.Node declares no pos
        stack.extend((child, depth + 1) for child in node.children())


def parse_file(path: str | Path) -> ast.QueryFile:
    return parse(Path(path).read_text(), str(path))


def _syntax_error(e: lark.UnexpectedInput, text: str, path: str) -> QueryError:
    """The QueryError of a lark error: a missing ')' where one is missing (see
    `_missing_paren`), else what lark found and expected where it stopped."""
    missing = _missing_paren(text, path, _error_offset(e, text))
    if missing is not None:
        return missing
    if isinstance(e, lark.UnexpectedCharacters):
        return QueryError(f"unexpected character {text[_known(e.pos_in_stream)]!r}",
                          ast.Pos(path, e.line, e.column), text)
    if isinstance(e, lark.UnexpectedToken):
        return QueryError(_unexpected_token_message(e), _token_pos(path, e.token, text), text)
    return QueryError("unexpected end of file", _end_pos(path, text), text)


def _known(position: int | None) -> int:
    """A position lark types as Optional but sets on every token its lexer makes and on
    every UnexpectedCharacters."""
    return cast(int, position)


def _error_offset(e: lark.UnexpectedInput, text: str) -> int:
    """Where in the text lark stopped (its length at the end of the text)."""
    if isinstance(e, lark.UnexpectedCharacters):
        return _known(e.pos_in_stream)
    token: Token | None = getattr(e, "token", None)
    if token is None or token.type == "$END" or token.start_pos is None:
        return len(text)
    return token.start_pos


# Words that begin a clause or a query, and ';': a '(' still open before one of them
# lacks its ')' (most often the pattern's: `PATTERN ( a b` and DEFINE on the next line).
_CLAUSE_STARTS = {"DEFINE", "WHERE", "WITHIN", "USING", "ORDER", "EMIT", "ON", "FROM", "INTO",
                  "PARTITION", "GROUP", "QUERY", "SEMICOLON"}
_MAX_REPAIRS = 16


def _missing_paren(text: str, path: str, offset: int) -> QueryError | None:
    """A QueryError at the end of the token after which a ')' is missing, or None.

    Where lark stops is often well after the missing ')': in `PATTERN ( a b` the words of
    the next line (`DEFINE a AS price`) read as more pattern symbols, and lark stops at
    `>`. So: with a '(' still open where lark stopped, a ')' is tried after the token
    before each clause word (and before where lark stopped) since that '('; the first
    place where the text then parses, or parses further than before, is where it is
    missing."""
    tokens, stopped_at = [], None  # the tokens before where lark stopped, the one there
    try:
        for token in _lark().lex(text):
            if _known(token.start_pos) >= offset:
                stopped_at = token
                break
            tokens.append(token)
    except lark.UnexpectedInput:  # a character no token starts with, where lark stopped
        pass
    opened: list[int] = []  # indexes of the '(' not closed yet
    for i, token in enumerate(tokens):
        if token.type == "LPAR":
            opened.append(i)
        elif token.type == "RPAR" and opened:
            opened.pop()
    if not opened:
        return None
    first = opened[-1]
    before = [i for i in range(first + 1, len(tokens)) if tokens[i].type in _CLAUSE_STARTS]
    for i in [*before, len(tokens)][:_MAX_REPAIRS]:
        previous = tokens[i - 1]
        at = _known(previous.end_pos)
        if not _parses_past(text[:at] + ")" + text[at:], at, offset):
            continue
        found = tokens[i] if i < len(tokens) else stopped_at
        where = repr(str(found)) if found is not None else repr(text[offset]) \
            if offset < len(text) else "the end of the file"
        paren = tokens[first]
        opener = tokens[first - 1].type if first else ""
        what = {"PATTERN": "the '(' of PATTERN", "SEQ": "the '(' of PATTERN SEQ"}.get(
            opener, "the '('")
        return QueryError(f"expected ')' before {where} to close {what} at line "
                          f"{paren.line}, column {paren.column}",
                          ast.Pos(path, _known(previous.end_line),
                                  _known(previous.end_column)), text)
    return None


def _parses_past(text: str, inserted: int, offset: int) -> bool:
    """Whether `text` (the query text with one character inserted at `inserted`) parses,
    or stops after `offset` of the text before the insertion."""
    try:
        _lark().parse(text)
        return True
    except lark.UnexpectedInput as e:
        stopped = _error_offset(e, text)
        return (stopped - 1 if stopped > inserted else stopped) > offset


def _unexpected_token_message(e: lark.UnexpectedToken) -> str:
    token = e.token
    found = "end of file" if token.type == "$END" else repr(str(token))
    expected = sorted({_describe_terminal(t) for t in e.expected if not t.startswith("_")})
    if len(expected) > 8:
        return f"unexpected {found}"
    return f"unexpected {found}; expected {', '.join(expected)}"


def _describe_terminal(name: str) -> str:
    if name in TERMINAL_NAMES:
        return TERMINAL_NAMES[name]
    pattern = _lark().get_terminal(name).pattern
    if isinstance(pattern, lark.lexer.PatternStr):
        return pattern.value.upper()
    return name.lower()


def _token_pos(path: str, token: Token, text: str) -> ast.Pos:
    if token.type == "$END" or token.line is None:
        return _end_pos(path, text)
    return ast.Pos(path, token.line, _known(token.column))


def _end_pos(path: str, text: str) -> ast.Pos:
    lines = text.rstrip().splitlines() or [""]
    return ast.Pos(path, len(lines), len(lines[-1]) + 1)


@v_args(meta=True, inline=True)
class _ToAst(Transformer[Token, list[ast.Query]]):
    def __init__(self, path: str):
        super().__init__()
        self.path = path

    def _pos(self, meta_or_token: Meta | Token) -> ast.Pos:
        return ast.Pos(self.path, getattr(meta_or_token, "line", 0) or 0,
                       getattr(meta_or_token, "column", 0) or 0)

    # ------------------------------------------------------------ file and query
    @v_args(meta=True, inline=False)
    def start(self, meta: Meta, queries: list[ast.Query]) -> list[ast.Query]:
        return queries

    def recognize_statement(self, meta: Meta, recognize: _Recognize) -> ast.Query:
        """A MATCH_RECOGNIZE statement without QUERY: named after its alias (`... AS T`),
        else `match_recognize`."""
        body = recognize.body
        return ast.Query(body.alias or "match_recognize", recognize.stream, body.alias or
                         "match_recognize", recognize.partition, body, self._pos(meta))

    @v_args(meta=True, inline=False)
    def query(self, meta: Meta, children: list[Any]) -> ast.Query:
        name, *headers, body = children
        clauses: dict[_Clause, tuple[Any, ast.Pos]] = {}
        for kind, value, pos in headers:
            if kind in clauses:
                raise QueryError(f"{kind} given twice in query '{name}'", pos)
            clauses[kind] = (value, pos)
        stream = clauses[_Clause.FROM][0] if _Clause.FROM in clauses else None
        if isinstance(body, _Recognize):
            return self._recognize_query(str(name), clauses, body, self._pos(meta))
        if isinstance(body, ast.WindowQuery):
            if stream is not None and stream != body.stream:
                raise QueryError(f"query reads '{stream}' in its header but '{body.stream}' "
                                 "in SELECT ... FROM", clauses[_Clause.FROM][1])
            stream = body.stream
            if _Clause.PARTITION in clauses:
                raise QueryError("a WINDOW query groups with GROUP BY, not PARTITION BY",
                                 clauses[_Clause.PARTITION][1])
        elif stream is None:
            raise QueryError(f"query '{name}' names no input stream (FROM stream)",
                             self._pos(name))
        output = clauses[_Clause.INTO][0] if _Clause.INTO in clauses else str(name)
        partition = clauses[_Clause.PARTITION][0] if _Clause.PARTITION in clauses else []
        return ast.Query(str(name), stream, output, partition, body, self._pos(meta))

    def _recognize_query(self, name: str, clauses: dict[_Clause, tuple[Any, ast.Pos]],
                         recognize: _Recognize, pos: ast.Pos) -> ast.Query:
        for kind in (_Clause.FROM, _Clause.PARTITION):
            if kind in clauses:
                raise QueryError(f"a MATCH_RECOGNIZE query says {kind} inside "
                                 "its statement, not in the QUERY header", clauses[kind][1])
        output = clauses[_Clause.INTO][0] if _Clause.INTO in clauses else name
        return ast.Query(name, recognize.stream, output, recognize.partition, recognize.body,
                         pos)

    def from_stream(self, meta: Meta, name: Token) -> _ClauseItem:
        return (_Clause.FROM, str(name), self._pos(meta))

    def into_topic(self, meta: Meta, name: str) -> _ClauseItem:
        return (_Clause.INTO, name, self._pos(meta))

    @v_args(meta=True, inline=False)
    def topic(self, meta: Meta, parts: list[Token]) -> str:
        if len(parts) == 1 and parts[0].type == "STRING":
            name = parts[0][1:-1]
            if not re.fullmatch(r"[A-Za-z0-9._-]{1,249}", name):
                raise QueryError(f"'{name}' is not a Kafka topic name (letters, digits, '.', "
                                 "'_' and '-', at most 249)", self._pos(parts[0]))
            return name
        return ".".join(str(p) for p in parts)

    def partition_by(self, meta: Meta, attrs: list[ast.Attr]) -> _ClauseItem:
        return (_Clause.PARTITION, attrs, self._pos(meta))

    @v_args(meta=True, inline=False)
    def attr_list(self, meta: Meta, attrs: list[ast.Attr]) -> list[ast.Attr]:
        return attrs

    # ------------------------------------------------------------ MATCH
    @v_args(meta=True, inline=False)
    def match_body(self, meta: Meta, children: list[Any]) -> ast.MatchQuery:
        regex, *rest = children
        emit = rest.pop() if rest and isinstance(rest[-1], list) else []
        if rest and rest[-1] is None:
            rest.pop()
        return ast.MatchQuery(regex, rest, emit or [], self._pos(meta))

    def define(self, meta: Meta, name: Token, expr: ast.Expr) -> ast.Define:
        return ast.Define(str(name), expr, self._pos(name))

    @v_args(meta=True, inline=False)
    def regex_alt(self, meta: Meta, options: list[ast.Regex]) -> ast.Regex:
        return self._alternatives(meta, options)

    @v_args(meta=True, inline=False)
    def regex_cat(self, meta: Meta, items: list[ast.Regex]) -> ast.Regex:
        return self._sequence(meta, items)

    def _alternatives(self, meta: Meta, options: list[ast.Regex]) -> ast.Regex:
        if len(options) == 1:
            return options[0]
        return ast.RAlt(options, self._pos(meta))

    def _sequence(self, meta: Meta, items: list[ast.Regex]) -> ast.Regex:
        if not items:
            return ast.REmpty(self._pos(meta))
        if len(items) == 1:
            return items[0]
        return ast.RCat(items, self._pos(meta))

    @v_args(meta=True, inline=False)
    def regex_rep(self, meta: Meta, children: list[Any]) -> ast.Regex:
        item: ast.Regex = children[0]
        for mark in children[1:]:
            low, high = {"*": (0, None), "+": (1, None), "?": (0, 1)}[str(mark)]
            item = ast.RRepeat(item, low, high, self._pos(mark))
        return item

    def regex_sym(self, meta: Meta, name: Token) -> ast.RSym:
        return ast.RSym(str(name), self._pos(name))

    def regex_any(self, meta: Meta) -> ast.RAny:
        return ast.RAny(self._pos(meta))

    @v_args(meta=True, inline=False)
    def emit(self, meta: Meta, items: list[ast.EmitItem]) -> list[ast.EmitItem]:
        return items

    def emit_item(self, meta: Meta, name: Token, expr: ast.Expr) -> ast.EmitItem:
        return ast.EmitItem(str(name), expr, self._pos(name))

    # ------------------------------------------------------------ SEQ
    @v_args(meta=True, inline=False)
    def seq_body(self, meta: Meta, children: list[Any]) -> ast.SeqQuery:
        items = [c for c in children if not isinstance(c, tuple)]
        clauses = [c for c in children if isinstance(c, tuple)]
        return self._seq_query(items, clauses, tesla=False, pos=self._pos(meta))

    def _seq_query(self, items: list[ast.SeqItem], clauses: list[_ClauseItem], tesla: bool,
                   pos: ast.Pos) -> ast.SeqQuery:
        found: dict[_Clause, Any] = {}
        for kind, value, cpos in clauses:
            if kind in found:
                raise QueryError(f"{kind} given twice", cpos)
            found[kind] = value
        return ast.SeqQuery(
            steps=items,
            where=found.get(_Clause.WHERE),
            within=found.get(_Clause.WITHIN),
            strategy=found.get(_Clause.STRATEGY, ast.Strategy.SKIP_TILL_ANY_MATCH),
            order_by=found.get(_Clause.ORDER),
            emit=found.get(_Clause.EMIT, []),
            tesla=tesla,
            pos=pos,
            emit_timeouts=_Clause.TIMEOUTS in found,
            timeouts_pos=found.get(_Clause.TIMEOUTS, ast.NOPOS),
        )

    @v_args(meta=True, inline=False)
    def and_group(self, meta: Meta, steps: list[ast.Step]) -> ast.AndGroup:
        return ast.AndGroup(steps, self._pos(meta))

    def event_step(self, meta: Meta, policy: Token | None, event_type: Token, plus: Token | None,
                   var: Token, flt: ast.Expr | None) -> ast.Step:
        kind = ast.StepKind.KLEENE if plus is not None else ast.StepKind.EVENT
        return ast.Step(kind, str(event_type), str(var), flt,
                        ast.Policy(str(policy).lower()) if policy else None,
                        pos=self._pos(event_type if policy is None else policy))

    def negated_step(self, meta: Meta, event_type: Token, var: Token,
                     flt: ast.Expr | None) -> ast.Step:
        return ast.Step(ast.StepKind.NEGATED, str(event_type), str(var), flt,
                        pos=self._pos(meta))

    def kleene_step(self, meta: Meta, event_type: Token, var: Token, flt: ast.Expr | None,
                    bounds: _Bounds | None) -> ast.Step:
        low, high = bounds if bounds is not None else (1, None)
        return ast.Step(ast.StepKind.KLEENE, str(event_type), str(var), flt,
                        min=low, max=high, pos=self._pos(meta))

    def step_filter(self, meta: Meta, expr: ast.Expr) -> ast.Expr:
        return expr

    def bounds_exact(self, meta: Meta, n: Token) -> _Bounds:
        return (int(n), int(n))

    def bounds_range(self, meta: Meta, low: Token, high: Token | None) -> _Bounds:
        return (int(low), int(high) if high is not None else None)

    def bounds_upto(self, meta: Meta, high: Token) -> _Bounds:
        return (0, int(high))

    def where_clause(self, meta: Meta, expr: ast.Expr) -> _ClauseItem:
        return (_Clause.WHERE, expr, self._pos(meta))

    def within_clause(self, meta: Meta, duration: ast.Duration) -> _ClauseItem:
        return (_Clause.WITHIN, duration, self._pos(meta))

    def strategy_clause(self, meta: Meta, token: Token) -> _ClauseItem:
        name = str(token).lower().replace("_", "-")
        return (_Clause.STRATEGY, ast.Strategy(name), self._pos(meta))

    def order_clause(self, meta: Meta, name: Token) -> _ClauseItem:
        # "seq" keeps stream order; any other name must be the time attribute (checker).
        if str(name).lower() == "seq":
            return (_Clause.ORDER, None, self._pos(meta))
        return (_Clause.ORDER, ast.Attr(str(name), None, self._pos(name)), self._pos(meta))

    def emit_clause(self, meta: Meta, items: list[ast.EmitItem]) -> _ClauseItem:
        return (_Clause.EMIT, items, self._pos(meta))

    def timeout_clause(self, meta: Meta) -> _ClauseItem:
        return (_Clause.TIMEOUTS, self._pos(meta), self._pos(meta))

    # ------------------------------------------------------------ TESLA
    @v_args(meta=True, inline=False)
    def tesla_body(self, meta: Meta, children: list[Any]) -> ast.SeqQuery:
        terminator, *rest = children
        steps = [c for c in rest if isinstance(c, ast.Step)]
        clauses = [c for c in rest if isinstance(c, tuple)]
        # TESLA lists the terminator first and then goes back in time; SEQ order is reversed.
        return self._seq_query(list(reversed(steps)) + [terminator], clauses, tesla=True,
                               pos=self._pos(meta))

    def tesla_terminator(self, meta: Meta, event_type: Token, var: Token,
                         flt: ast.Expr | None) -> ast.Step:
        return ast.Step(ast.StepKind.EVENT, str(event_type), str(var), flt,
                        pos=self._pos(event_type))

    def tesla_step(self, meta: Meta, policy: Token, event_type: Token, var: Token,
                   flt: ast.Expr | None, duration: ast.Duration, anchor: Token) -> ast.Step:
        return ast.Step(ast.StepKind.EVENT, str(event_type), str(var), flt,
                        ast.Policy(str(policy).lower()), duration, str(anchor),
                        pos=self._pos(policy))

    # ------------------------------------------------------------ WINDOW
    @v_args(meta=True, inline=False)
    def window_body(self, meta: Meta, children: list[Any]) -> ast.WindowQuery:
        star = next((c for c in children if isinstance(c, _SelectStar)), None)
        if star is not None:
            raise QueryError("SELECT * is for MATCH_RECOGNIZE; a WINDOW query selects "
                             "aggregates and GROUP BY attributes", star.pos)
        items = [c for c in children if isinstance(c, ast.SelectItem)]
        rest = [c for c in children if not isinstance(c, ast.SelectItem)]
        stream, window, where, group_by = rest
        return ast.WindowQuery(items, str(stream), window, where, group_by or [],
                               self._pos(meta))

    def select_item(self, meta: Meta, expr: ast.Expr, alias: Token | None) -> ast.SelectItem:
        return ast.SelectItem(expr, str(alias) if alias is not None else None, self._pos(meta))

    def select_star(self, meta: Meta) -> _SelectStar:
        return _SelectStar(self._pos(meta))

    def time_window(self, meta: Meta, rng: ast.Duration, slide: ast.Duration,
                    attr: Token | None) -> ast.TimeWindow:
        return ast.TimeWindow(rng, slide, str(attr) if attr is not None else None,
                              self._pos(meta))

    def row_window(self, meta: Meta, rows: Token, slide: Token) -> ast.RowWindow:
        return ast.RowWindow(int(rows), int(slide), self._pos(meta))

    def window_where(self, meta: Meta, expr: ast.Expr) -> ast.Expr:
        return expr

    def group_by(self, meta: Meta, attrs: list[ast.Attr]) -> list[ast.Attr]:
        return attrs

    # ------------------------------------------------------------ MATCH_RECOGNIZE
    @v_args(meta=True, inline=False)
    def recognize_body(self, meta: Meta, children: list[Any]) -> _Recognize:
        """-> _Recognize(body, stream, partition). The order of the clauses is the grammar's;
        optional ones are None here (maybe_placeholders)."""
        select = [c for c in children if isinstance(c, (ast.SelectItem, _SelectStar))]
        (stream, partition, order_by, measures, rows, skip, pattern, within, *defines,
         alias) = children[len(select):]
        (order_by, order_desc), *then = order_by
        body = ast.RecognizeQuery(
            select=self._recognize_select(select), order_by=order_by, measures=measures or [],
            skip=skip[0] if skip else ast.SkipTo.NEXT_ROW,  # Flink's (Calcite's) default
            skip_var=skip[1] if skip else None, pattern=pattern, within=within,
            defines=defines, alias=alias, pos=self._pos(meta),
            all_rows_pos=rows if isinstance(rows, ast.Pos) else None,
            then_by=[attr for attr, _ in then], then_desc=[desc is not None for _, desc in then],
            order_desc_pos=order_desc)
        return _Recognize(body, str(stream), partition or [])

    def _recognize_select(self, items: list[ast.SelectItem | _SelectStar]) -> list[ast.Attr] | None:
        if len(items) == 1 and isinstance(items[0], _SelectStar):
            return None
        names = []
        for item in items:
            if isinstance(item, _SelectStar):
                raise QueryError("SELECT * stands alone", item.pos)
            if not isinstance(item.expr, ast.Attr) or item.expr.var is not None or \
                    item.alias is not None:
                raise QueryError("SELECT of a MATCH_RECOGNIZE query names its output "
                                 "columns (PARTITION BY attributes and MEASURES), or is *; "
                                 "compute values in MEASURES", item.pos)
            names.append(item.expr)
        return names

    def mr_partition(self, meta: Meta, attrs: list[ast.Attr]) -> list[ast.Attr]:
        return attrs

    @v_args(meta=True, inline=False)
    def mr_order(self, meta: Meta, keys: list[_SortKey]) -> list[_SortKey]:
        return keys

    def mr_sort_key(self, meta: Meta, name: Token, direction: Token | None) -> _SortKey:
        """-> (Attr, the position of DESC or None)."""
        desc = direction if direction is not None and str(direction).lower() == "desc" else None
        return ast.Attr(str(name), None, self._pos(name)), self._pos(desc) if desc else None

    def set_quantifier(self, meta: Meta, word: Token) -> None:
        if str(word).lower() == "distinct":
            raise QueryError("DISTINCT in an aggregate: Flink 2.3 refuses it in "
                             "MATCH_RECOGNIZE (\"DISTINCT/ALL not allowed with ... "
                             "function\"), and no query here takes it", self._pos(word))
        return None  # ALL: SQL's default

    @v_args(meta=True, inline=False)
    def mr_measures(self, meta: Meta, items: list[ast.EmitItem]) -> list[ast.EmitItem]:
        return items

    def mr_measure(self, meta: Meta, expr: ast.Expr, name: Token) -> ast.EmitItem:
        return ast.EmitItem(str(name), expr, self._pos(name))

    def one_row(self, meta: Meta) -> None:
        return None

    def all_rows(self, meta: Meta) -> ast.Pos:
        return self._pos(meta)

    def skip_past(self, meta: Meta, last: Token) -> _Skip:
        if str(last).lower() != "last":
            raise QueryError(f"expected AFTER MATCH SKIP PAST LAST ROW, not PAST {last}",
                             self._pos(last))
        return (ast.SkipTo.PAST_LAST_ROW, None)

    def skip_next(self, meta: Meta) -> _Skip:
        return (ast.SkipTo.NEXT_ROW, None)

    def skip_to(self, meta: Meta, which: Token, var: Token) -> _Skip:
        if str(which).lower() == "each":
            raise QueryError("expected AFTER MATCH SKIP TO FIRST var or TO LAST var",
                             self._pos(which))
        kind = ast.SkipTo.FIRST if str(which).lower() == "first" else ast.SkipTo.LAST
        return (kind, str(var))

    def mr_within(self, meta: Meta, amount: Token, unit: Token) -> ast.Duration:
        """`WITHIN INTERVAL '10' SECOND` -> a Duration (Flink's units, singular or plural)."""
        text = amount[1:-1].strip()
        if not text.isdigit():
            raise QueryError(f"WITHIN INTERVAL takes a whole number in quotes, as in "
                             f"INTERVAL '10' SECOND, not {amount}", self._pos(amount))
        canonical = DURATION_UNITS.get(str(unit).lower())
        if canonical is None or canonical is ast.DurationUnit.TICKS:
            raise QueryError(f"unknown interval unit '{unit}' (use MILLISECOND, SECOND, "
                             "MINUTE, HOUR or DAY)", self._pos(unit))
        return ast.Duration(int(text), canonical, self._pos(meta))

    def mr_alias(self, meta: Meta, name: Token) -> str:
        return str(name)

    @v_args(meta=True, inline=False)
    def mr_alt(self, meta: Meta, options: list[ast.Regex]) -> ast.Regex:
        return self._alternatives(meta, options)

    @v_args(meta=True, inline=False)
    def mr_cat(self, meta: Meta, items: list[ast.Regex]) -> ast.Regex:
        return self._sequence(meta, items)

    @v_args(meta=True, inline=False)
    def mr_factor(self, meta: Meta, children: list[Any]) -> ast.Regex:
        """`B`, `B+`, `B{2,}`, `B*?` ...: one quantifier, optionally made reluctant by a
        `?` after it."""
        item: ast.Regex = children[0]
        marks = children[1:]
        if not marks:
            return item
        first, *rest = marks
        if isinstance(first, tuple):
            low, high = first
            pos = self._pos(meta)
        else:
            low, high = {"*": (0, None), "+": (1, None), "?": (0, 1)}[str(first)]
            pos = self._pos(first)
        reluctant = bool(rest) and not isinstance(rest[0], tuple) and str(rest[0]) == "?"
        if len(rest) > int(reluctant):
            extra = rest[int(reluctant)]
            raise QueryError("a quantifier cannot follow another (only '?' after one, which "
                             "makes it reluctant)",
                             self._pos(extra) if not isinstance(extra, tuple) else pos)
        return ast.RRepeat(item, low, high, pos, reluctant=reluctant)

    # ------------------------------------------------------------ shared
    def duration(self, meta: Meta, amount: Token, unit: Token | None) -> ast.Duration:
        if unit is None:
            return ast.Duration(int(amount), ast.DurationUnit.TICKS, self._pos(meta))
        canonical = DURATION_UNITS.get(str(unit).lower())
        if canonical is None:
            raise QueryError(f"unknown time unit '{unit}' (use ms, seconds, minutes, hours, "
                             "days or ticks)", self._pos(unit))
        return ast.Duration(int(amount), canonical, self._pos(meta))

    @v_args(meta=True, inline=False)
    def or_(self, meta: Meta, operands: list[ast.Expr]) -> ast.Expr:
        return self._fold(ast.BinaryOp.OR, operands)

    @v_args(meta=True, inline=False)
    def and_(self, meta: Meta, operands: list[ast.Expr]) -> ast.Expr:
        return self._fold(ast.BinaryOp.AND, operands)

    def _fold(self, op: ast.BinaryOp, operands: list[ast.Expr]) -> ast.Expr:
        result = operands[0]
        for operand in operands[1:]:
            result = ast.Binary(op, result, operand, _pos_of(result))
        return result

    def not_(self, meta: Meta, operand: ast.Expr) -> ast.Unary:
        return ast.Unary(ast.UnaryOp.NOT, operand, self._pos(meta))

    @v_args(meta=True, inline=False)
    def compare(self, meta: Meta, children: list[Any]) -> ast.Expr:
        # `a = b = c` means `a = b AND b = c` (TESLA writes `a.p = b.p = c.p`).
        result: ast.Binary | None = None
        left: ast.Expr = children[0]
        for i in range(1, len(children), 2):
            text, right = str(children[i]), children[i + 1]
            op = ast.BinaryOp.NE if text == "<>" else ast.BinaryOp(text)
            comparison = ast.Binary(op, left, right, self._pos(children[i]))
            result = comparison if result is None else ast.Binary(
                ast.BinaryOp.AND, result, comparison, comparison.pos)
            left = right.copy()  # `b` of `a = b = c` in the second comparison too
        return result if result is not None else left  # one child: no comparison

    @v_args(meta=True, inline=False)
    def in_list(self, meta: Meta, children: list[ast.Expr]) -> ast.InList:
        operand, *options = children
        return ast.InList(operand, options, False, self._pos(meta))

    def is_null(self, meta: Meta, operand: ast.Expr, negated: Token | None) -> ast.Expr:
        """`x IS [NOT] NULL` (MATCH_RECOGNIZE): the call IS_NULL, which only its checker
        takes."""
        test = ast.Call(ast.Builtin.IS_NULL, [operand], self._pos(meta))
        return ast.Unary(ast.UnaryOp.NOT, test, self._pos(meta)) if negated else test

    @v_args(meta=True, inline=False)
    def not_in_list(self, meta: Meta, children: list[Any]) -> ast.InList:
        operand, _not_in, *options = children
        return ast.InList(operand, options, True, self._pos(meta))

    @v_args(meta=True, inline=False)
    def arith(self, meta: Meta, children: list[Any]) -> ast.Expr:
        result: ast.Expr = children[0]
        for i in range(1, len(children), 2):
            result = ast.Binary(ast.BinaryOp(str(children[i])), result, children[i + 1],
                                self._pos(children[i]))
        return result

    def neg(self, meta: Meta, operand: ast.Expr) -> ast.Expr:
        if isinstance(operand, ast.Literal) and not isinstance(operand.value, (str, bool)) \
                and operand.duration is None:
            return ast.Literal(-operand.value, self._pos(meta))
        return ast.Unary(ast.UnaryOp.NEG, operand, self._pos(meta))

    def duration_lit(self, meta: Meta, amount: Token, unit: Token) -> ast.Literal:
        # `Delta(ts) <= 5 minutes`: the checker gives it its value in the stream's time unit.
        if str(unit).lower() not in DURATION_UNITS:
            raise QueryError(f"unexpected '{unit}' after {amount} (a duration's unit is ms, "
                             "seconds, minutes, hours, days or ticks)", self._pos(unit))
        return ast.Literal(int(amount), self._pos(amount),
                           duration=self.duration(meta, amount, unit))

    def int_lit(self, meta: Meta, token: Token) -> ast.Literal:
        return ast.Literal(int(token), self._pos(token))

    def float_lit(self, meta: Meta, token: Token) -> ast.Literal:
        return ast.Literal(float(token), self._pos(token))

    def string_lit(self, meta: Meta, token: Token) -> ast.Literal:
        quote = token[0]
        return ast.Literal(token[1:-1].replace(quote * 2, quote), self._pos(token))

    def true_lit(self, meta: Meta, token: Token) -> ast.Literal:
        return ast.Literal(True, self._pos(token))

    def false_lit(self, meta: Meta, token: Token) -> ast.Literal:
        return ast.Literal(False, self._pos(token))

    def bare_attr(self, meta: Meta, name: Token) -> ast.Attr:
        return ast.Attr(str(name), None, self._pos(name))

    def var_attr(self, meta: Meta, var: Token, name: Token) -> ast.Attr:
        return ast.Attr(str(name), str(var), self._pos(var))

    def func_name(self, meta: Meta, token: Token) -> Token:
        return token

    def star(self, meta: Meta) -> _Star:
        return _STAR

    def call_window(self, meta: Meta, duration: ast.Duration, anchor: Token) -> _CallWindow:
        return _CallWindow(duration, str(anchor))

    @v_args(meta=True, inline=False)
    def call(self, meta: Meta, children: list[Any]) -> ast.Expr:
        name, *args = children
        window = args.pop() if args and isinstance(args[-1], (_CallWindow, type(None))) else None
        args = [a for a in args if a is not None]
        pos = self._pos(name)
        lname = str(name).lower()
        if window is not None:
            return self._window_aggregate(lname, args, window, pos)
        if lname in AGGREGATES:
            return self._aggregate(AGGREGATES[lname], args, pos)
        if any(a is _STAR for a in args):
            raise QueryError(f"'*' is an argument of count only, not of {name}", pos)
        return ast.Call(str(name), args, pos)

    def _aggregate(self, func: ast.AggFunc, args: list[Any], pos: ast.Pos) -> ast.Aggregate:
        if func in (ast.AggFunc.FIRST, ast.AggFunc.LAST) and args and \
                isinstance(args[0], ast.Call) and args[0].func in _NAVIGATION:
            raise QueryError(f"{func.value.upper()}({args[0].func}(...)): Flink refuses "
                             "it (\"Cannot nest PREV/NEXT under LAST/FIRST\"); PREV reads the "
                             "row before the current one, LAST(B.price, 1) the row before B's "
                             "last", pos)
        if func is ast.AggFunc.COUNT:
            if not args or args == [_STAR]:
                return ast.Aggregate(func, None, pos)
            if len(args) == 1 and isinstance(args[0], ast.Attr) and args[0].var is None:
                # count(dup): the number of events bound to a Kleene variable.
                return ast.Aggregate(func, ast.Attr("", args[0].name, args[0].pos), pos)
            if len(args) == 1 and isinstance(args[0], ast.Attr):
                # MATCH_RECOGNIZE's COUNT(B.price): B's rows whose price is not NULL
                return ast.Aggregate(func, args[0], pos)
            raise QueryError("count takes no argument, '*' or a variable", pos)
        if func in (ast.AggFunc.FIRST, ast.AggFunc.LAST) and len(args) == 2 and \
                isinstance(args[0], ast.Attr) and isinstance(args[1], ast.Literal) and \
                type(args[1].value) is int and args[1].value >= 0:
            # MATCH_RECOGNIZE's logical offset: LAST(B.price, 1), FIRST(B.price, 2)
            return ast.Aggregate(func, args[0], pos, offset=args[1].value)
        if len(args) != 1 or not isinstance(args[0], ast.Attr):
            raise QueryError(f"{func.value} takes one attribute, as in {func.value}(price)", pos)
        return ast.Aggregate(func, args[0], pos)

    def _window_aggregate(self, lname: str, args: list[Any], window: _CallWindow,
                          pos: ast.Pos) -> ast.WindowAggregate:
        func = AGGREGATES.get(lname)
        if func is None or func in (ast.AggFunc.DELTA, ast.AggFunc.COLLECT):
            raise QueryError(f"'{lname}' is not an aggregate over a time window "
                             "(use count, sum, min, max, avg, first or last)", pos)
        if len(args) != 1:
            raise QueryError("a window aggregate takes one argument, as in "
                             "avg(Temp(area = s.area).value WITHIN 5 minutes FROM s)", pos)
        arg = args[0]
        event_type, flt, attr = None, None, None
        if isinstance(arg, ast.Attr) and arg.var is None:  # count(Temp WITHIN ...)
            event_type = arg.name
        elif isinstance(arg, ast.Attr):  # avg(Temp.value WITHIN ...)
            event_type, attr = arg.var, arg.name
        elif isinstance(arg, _CallMember):  # avg(Temp(cond).value WITHIN ...)
            event_type, flt, attr = arg.call_name, arg.filter, arg.member
        elif isinstance(arg, ast.Call) and len(arg.args) == 1:  # (`call` refused a '*')
            # count(Temp(cond) WITHIN ...)
            event_type, flt = arg.name, arg.args[0]
        if event_type is None:
            raise QueryError("expected Type, Type.attr or Type(condition).attr before WITHIN",
                             pos)
        if attr is None and func is not ast.AggFunc.COUNT:
            raise QueryError(f"{func.value} over a window needs an attribute, as in "
                             f"{func.value}({event_type}.value WITHIN ...)", pos)
        return ast.WindowAggregate(func, event_type, flt, attr, window.duration,
                                   window.anchor, pos)

    @v_args(meta=True, inline=False)
    def call_member(self, meta: Meta, children: list[Any]) -> _CallMember:
        call, member = children
        if not isinstance(call, ast.Call) or len(call.args) != 1:
            raise QueryError("'.attribute' after a call is only for window aggregates, as in "
                             "avg(Temp(area = s.area).value WITHIN 5 minutes FROM s)",
                             self._pos(meta))
        return _CallMember(call.name, call.args[0], str(member), self._pos(meta))


class _Star:
    """The `*` of `count(*)`."""


class _SelectStar:
    """`SELECT *` (MATCH_RECOGNIZE); never left in the AST."""

    def __init__(self, pos: ast.Pos):
        self.pos = pos


@dataclass(frozen=True)
class _Recognize:
    """A MATCH_RECOGNIZE statement on its way to its `ast.Query` (which holds its stream
    and PARTITION BY)."""

    body: ast.RecognizeQuery
    stream: str
    partition: list[ast.Attr]


_STAR = _Star()
_NAVIGATION = (ast.Builtin.PREV, ast.Builtin.NEXT)  # MATCH_RECOGNIZE's physical offsets


@dataclass(frozen=True)
class _CallWindow:
    duration: ast.Duration
    anchor: str


class _CallMember(ast.Node):
    """`Temp(cond).value` inside a window aggregate; never left in the AST."""

    child_fields = ("filter",)

    def __init__(self, call_name: str, flt: ast.Expr, member: str, pos: ast.Pos):
        self.call_name, self.filter, self.member, self.pos = call_name, flt, member, pos
        self.__post_init__()


class _Clause(StrEnum):
    """A clause of a query's header or of a SEQ query, by the words that begin it."""

    FROM = "FROM"
    INTO = "INTO"
    PARTITION = "PARTITION BY"
    WHERE = "WHERE"
    WITHIN = "WITHIN"
    STRATEGY = "USING"
    ORDER = "ORDER BY"
    EMIT = "EMIT"
    TIMEOUTS = "ON TIMEOUT EMIT PARTIAL"


_ClauseItem = tuple[_Clause, Any, ast.Pos]  # a clause's value: what its rule made
_Bounds = tuple[int, int | None]  # a Kleene step's {low, high}
_SortKey = tuple[ast.Attr, ast.Pos | None]  # an ORDER BY column and where DESC is
_Skip = tuple[ast.SkipTo, str | None]  # AFTER MATCH SKIP's target and variable


def _pos_of(node: object) -> ast.Pos:
    pos: ast.Pos = getattr(node, "pos", ast.NOPOS)
    return pos
