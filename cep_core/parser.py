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
from typing import cast

import lark
from lark import Token, Transformer, v_args

from cep_core import ast
from cep_core.errors import QueryError
from cep_core.home import cache_dir
from cep_core.query_limits import check_text_size

GRAMMAR = Path(__file__).with_name("grammar.lark")

DURATION_UNITS = {
    "ms": "ms", "millisecond": "ms", "milliseconds": "ms", "msec": "ms",
    "s": "s", "sec": "s", "secs": "s", "second": "s", "seconds": "s",
    "min": "min", "mins": "min", "minute": "min", "minutes": "min",
    "h": "h", "hr": "h", "hour": "h", "hours": "h",
    "d": "d", "day": "d", "days": "d",
    "tick": "ticks", "ticks": "ticks",
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


def _check_depth(tree: lark.Tree, path: str, text: str) -> None:
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
    token = getattr(e, "token", None)
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
class _ToAst(Transformer):
    def __init__(self, path: str):
        super().__init__()
        self.path = path

    def _pos(self, meta_or_token) -> ast.Pos:
        return ast.Pos(self.path, getattr(meta_or_token, "line", 0) or 0,
                       getattr(meta_or_token, "column", 0) or 0)

    # ------------------------------------------------------------ file and query
    @v_args(meta=True, inline=False)
    def start(self, meta, queries):
        return queries

    def recognize_statement(self, meta, recognize):
        """A MATCH_RECOGNIZE statement without QUERY: named after its alias (`... AS T`),
        else `match_recognize`."""
        body, stream, partition = recognize
        return ast.Query(body.alias or "match_recognize", stream, body.alias or
                         "match_recognize", partition, body, self._pos(meta))

    @v_args(meta=True, inline=False)
    def query(self, meta, children):
        name, *headers, body = children
        clauses: dict[str, tuple] = {}
        for kind, value, pos in headers:
            if kind in clauses:
                raise QueryError(f"{_HEADER_WORDS[kind]} given twice in query '{name}'", pos)
            clauses[kind] = (value, pos)
        stream = clauses.get("from", (None, None))[0]
        if isinstance(body, _Recognize):
            return self._recognize_query(str(name), clauses, body, self._pos(meta))
        if isinstance(body, ast.WindowQuery):
            if stream is not None and stream != body.stream:
                raise QueryError(f"query reads '{stream}' in its header but '{body.stream}' "
                                 "in SELECT ... FROM", clauses["from"][1])
            stream = body.stream
            if "partition" in clauses:
                raise QueryError("a WINDOW query groups with GROUP BY, not PARTITION BY",
                                 clauses["partition"][1])
        elif stream is None:
            raise QueryError(f"query '{name}' names no input stream (FROM stream)",
                             self._pos(name))
        output = clauses.get("into", (f"{name}",))[0]
        partition = clauses.get("partition", ([],))[0]
        return ast.Query(str(name), stream, output, partition, body, self._pos(meta))

    def _recognize_query(self, name, clauses, recognize, pos):
        body, stream, partition = recognize
        for kind in ("from", "partition"):
            if kind in clauses:
                raise QueryError(f"a MATCH_RECOGNIZE query says {_HEADER_WORDS[kind]} inside "
                                 "its statement, not in the QUERY header", clauses[kind][1])
        output = clauses.get("into", (name,))[0]
        return ast.Query(name, stream, output, partition, body, pos)

    def from_stream(self, meta, name):
        return ("from", str(name), self._pos(meta))

    def into_topic(self, meta, name):
        return ("into", name, self._pos(meta))

    @v_args(meta=True, inline=False)
    def topic(self, meta, parts):
        if len(parts) == 1 and parts[0].type == "STRING":
            name = parts[0][1:-1]
            if not re.fullmatch(r"[A-Za-z0-9._-]{1,249}", name):
                raise QueryError(f"'{name}' is not a Kafka topic name (letters, digits, '.', "
                                 "'_' and '-', at most 249)", self._pos(parts[0]))
            return name
        return ".".join(str(p) for p in parts)

    def partition_by(self, meta, attrs):
        return ("partition", attrs, self._pos(meta))

    @v_args(meta=True, inline=False)
    def attr_list(self, meta, attrs):
        return attrs

    # ------------------------------------------------------------ MATCH
    @v_args(meta=True, inline=False)
    def match_body(self, meta, children):
        regex, *rest = children
        emit = rest.pop() if rest and isinstance(rest[-1], list) else []
        if rest and rest[-1] is None:
            rest.pop()
        return ast.MatchQuery(regex, rest, emit or [], self._pos(meta))

    def define(self, meta, name, expr):
        return ast.Define(str(name), expr, self._pos(name))

    @v_args(meta=True, inline=False)
    def regex_alt(self, meta, options):
        if len(options) == 1:
            return options[0]
        return ast.RAlt(options, self._pos(meta))

    @v_args(meta=True, inline=False)
    def regex_cat(self, meta, items):
        if not items:
            return ast.REmpty(self._pos(meta))
        if len(items) == 1:
            return items[0]
        return ast.RCat(items, self._pos(meta))

    @v_args(meta=True, inline=False)
    def regex_rep(self, meta, children):
        item, *marks = children
        for mark in marks:
            low, high = {"*": (0, None), "+": (1, None), "?": (0, 1)}[str(mark)]
            item = ast.RRepeat(item, low, high, self._pos(mark))
        return item

    def regex_sym(self, meta, name):
        return ast.RSym(str(name), self._pos(name))

    def regex_any(self, meta):
        return ast.RAny(self._pos(meta))

    @v_args(meta=True, inline=False)
    def emit(self, meta, items):
        return items

    def emit_item(self, meta, name, expr):
        return ast.EmitItem(str(name), expr, self._pos(name))

    # ------------------------------------------------------------ SEQ
    @v_args(meta=True, inline=False)
    def seq_body(self, meta, children):
        items = [c for c in children if not isinstance(c, tuple)]
        clauses = [c for c in children if isinstance(c, tuple)]
        return self._seq_query(items, clauses, tesla=False, pos=self._pos(meta))

    def _seq_query(self, items, clauses, tesla, pos):
        found: dict[str, object] = {}
        for kind, value, cpos in clauses:
            if kind in found:
                raise QueryError(f"{_CLAUSE_WORDS[kind]} given twice", cpos)
            found[kind] = value
        return ast.SeqQuery(
            steps=items,
            where=found.get("where"),
            within=found.get("within"),
            strategy=found.get("strategy", ast.Strategy.SKIP_TILL_ANY_MATCH),
            order_by=found.get("order"),
            emit=found.get("emit", []),
            tesla=tesla,
            pos=pos,
            emit_timeouts="timeouts" in found,
            timeouts_pos=found.get("timeouts", ast.NOPOS),
        )

    @v_args(meta=True, inline=False)
    def and_group(self, meta, steps):
        return ast.AndGroup(steps, self._pos(meta))

    def event_step(self, meta, policy, event_type, plus, var, flt):
        kind = ast.StepKind.KLEENE if plus is not None else ast.StepKind.EVENT
        return ast.Step(kind, str(event_type), str(var), flt,
                        ast.Policy(str(policy).lower()) if policy else None,
                        pos=self._pos(event_type if policy is None else policy))

    def negated_step(self, meta, event_type, var, flt):
        return ast.Step(ast.StepKind.NEGATED, str(event_type), str(var), flt,
                        pos=self._pos(meta))

    def kleene_step(self, meta, event_type, var, flt, bounds):
        low, high = bounds if bounds is not None else (1, None)
        return ast.Step(ast.StepKind.KLEENE, str(event_type), str(var), flt,
                        min=low, max=high, pos=self._pos(meta))

    def step_filter(self, meta, expr):
        return expr

    def bounds_exact(self, meta, n):
        return (int(n), int(n))

    def bounds_range(self, meta, low, high):
        return (int(low), int(high) if high is not None else None)

    def bounds_upto(self, meta, high):
        return (0, int(high))

    def where_clause(self, meta, expr):
        return ("where", expr, self._pos(meta))

    def within_clause(self, meta, duration):
        return ("within", duration, self._pos(meta))

    def strategy_clause(self, meta, token):
        name = str(token).lower().replace("_", "-")
        return ("strategy", ast.Strategy(name), self._pos(meta))

    def order_clause(self, meta, name):
        # "seq" keeps stream order; any other name must be the time attribute (checker).
        if str(name).lower() == "seq":
            return ("order", None, self._pos(meta))
        return ("order", ast.Attr(str(name), None, self._pos(name)), self._pos(meta))

    def emit_clause(self, meta, items):
        return ("emit", items, self._pos(meta))

    def timeout_clause(self, meta):
        return ("timeouts", self._pos(meta), self._pos(meta))

    # ------------------------------------------------------------ TESLA
    @v_args(meta=True, inline=False)
    def tesla_body(self, meta, children):
        terminator, *rest = children
        steps = [c for c in rest if isinstance(c, ast.Step)]
        clauses = [c for c in rest if isinstance(c, tuple)]
        # TESLA lists the terminator first and then goes back in time; SEQ order is reversed.
        return self._seq_query(list(reversed(steps)) + [terminator], clauses, tesla=True,
                               pos=self._pos(meta))

    def tesla_terminator(self, meta, event_type, var, flt):
        return ast.Step(ast.StepKind.EVENT, str(event_type), str(var), flt,
                        pos=self._pos(event_type))

    def tesla_step(self, meta, policy, event_type, var, flt, duration, anchor):
        return ast.Step(ast.StepKind.EVENT, str(event_type), str(var), flt,
                        ast.Policy(str(policy).lower()), duration, str(anchor),
                        pos=self._pos(policy))

    # ------------------------------------------------------------ WINDOW
    @v_args(meta=True, inline=False)
    def window_body(self, meta, children):
        star = next((c for c in children if isinstance(c, _SelectStar)), None)
        if star is not None:
            raise QueryError("SELECT * is for MATCH_RECOGNIZE; a WINDOW query selects "
                             "aggregates and GROUP BY attributes", star.pos)
        items = [c for c in children if isinstance(c, ast.SelectItem)]
        rest = [c for c in children if not isinstance(c, ast.SelectItem)]
        stream, window, where, group_by = rest
        return ast.WindowQuery(items, str(stream), window, where, group_by or [],
                               self._pos(meta))

    def select_item(self, meta, expr, alias):
        return ast.SelectItem(expr, str(alias) if alias is not None else None, self._pos(meta))

    def select_star(self, meta):
        return _SelectStar(self._pos(meta))

    def time_window(self, meta, rng, slide, attr):
        return ast.TimeWindow(rng, slide, str(attr) if attr is not None else None,
                              self._pos(meta))

    def row_window(self, meta, rows, slide):
        return ast.RowWindow(int(rows), int(slide), self._pos(meta))

    def window_where(self, meta, expr):
        return expr

    def group_by(self, meta, attrs):
        return attrs

    # ------------------------------------------------------------ MATCH_RECOGNIZE
    @v_args(meta=True, inline=False)
    def recognize_body(self, meta, children):
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

    def _recognize_select(self, items) -> list[ast.Attr] | None:
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

    def mr_partition(self, meta, attrs):
        return attrs

    @v_args(meta=True, inline=False)
    def mr_order(self, meta, keys):
        return keys

    def mr_sort_key(self, meta, name, direction):
        """-> (Attr, the position of DESC or None)."""
        desc = direction is not None and str(direction).lower() == "desc"
        return ast.Attr(str(name), None, self._pos(name)), self._pos(direction) if desc else None

    def set_quantifier(self, meta, word):
        if str(word).lower() == "distinct":
            raise QueryError("DISTINCT in an aggregate: Flink 2.3 refuses it in "
                             "MATCH_RECOGNIZE (\"DISTINCT/ALL not allowed with ... "
                             "function\"), and no query here takes it", self._pos(word))
        return None  # ALL: SQL's default

    @v_args(meta=True, inline=False)
    def mr_measures(self, meta, items):
        return items

    def mr_measure(self, meta, expr, name):
        return ast.EmitItem(str(name), expr, self._pos(name))

    def one_row(self, meta):
        return None

    def all_rows(self, meta):
        return self._pos(meta)

    def skip_past(self, meta, last):
        if str(last).lower() != "last":
            raise QueryError(f"expected AFTER MATCH SKIP PAST LAST ROW, not PAST {last}",
                             self._pos(last))
        return (ast.SkipTo.PAST_LAST_ROW, None)

    def skip_next(self, meta):
        return (ast.SkipTo.NEXT_ROW, None)

    def skip_to(self, meta, which, var):
        if str(which).lower() == "each":
            raise QueryError("expected AFTER MATCH SKIP TO FIRST var or TO LAST var",
                             self._pos(which))
        kind = ast.SkipTo.FIRST if str(which).lower() == "first" else ast.SkipTo.LAST
        return (kind, str(var))

    def mr_within(self, meta, amount, unit):
        """`WITHIN INTERVAL '10' SECOND` -> a Duration (Flink's units, singular or plural)."""
        text = amount[1:-1].strip()
        if not text.isdigit():
            raise QueryError(f"WITHIN INTERVAL takes a whole number in quotes, as in "
                             f"INTERVAL '10' SECOND, not {amount}", self._pos(amount))
        canonical = DURATION_UNITS.get(str(unit).lower())
        if canonical is None or canonical == "ticks":
            raise QueryError(f"unknown interval unit '{unit}' (use MILLISECOND, SECOND, "
                             "MINUTE, HOUR or DAY)", self._pos(unit))
        return ast.Duration(int(text), canonical, self._pos(meta))

    def mr_alias(self, meta, name):
        return str(name)

    @v_args(meta=True, inline=False)
    def mr_alt(self, meta, options):
        return self.regex_alt(meta, options)

    @v_args(meta=True, inline=False)
    def mr_cat(self, meta, items):
        return self.regex_cat(meta, items)

    @v_args(meta=True, inline=False)
    def mr_factor(self, meta, children):
        """`B`, `B+`, `B{2,}`, `B*?` ...: one quantifier, optionally made reluctant by a
        `?` after it."""
        item, *marks = children
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
    def duration(self, meta, amount, unit):
        if unit is None:
            return ast.Duration(int(amount), "ticks", self._pos(meta))
        canonical = DURATION_UNITS.get(str(unit).lower())
        if canonical is None:
            raise QueryError(f"unknown time unit '{unit}' (use ms, seconds, minutes, hours, "
                             "days or ticks)", self._pos(unit))
        return ast.Duration(int(amount), canonical, self._pos(meta))

    @v_args(meta=True, inline=False)
    def or_(self, meta, operands):
        return self._fold("OR", operands, meta)

    @v_args(meta=True, inline=False)
    def and_(self, meta, operands):
        return self._fold("AND", operands, meta)

    def _fold(self, op, operands, meta):
        result = operands[0]
        for operand in operands[1:]:
            result = ast.Binary(op, result, operand, _pos_of(result))
        return result

    def not_(self, meta, operand):
        return ast.Unary("NOT", operand, self._pos(meta))

    @v_args(meta=True, inline=False)
    def compare(self, meta, children):
        if len(children) == 1:
            return children[0]
        # `a = b = c` means `a = b AND b = c` (TESLA writes `a.p = b.p = c.p`).
        result = None
        left = children[0]
        for i in range(1, len(children), 2):
            op, right = str(children[i]), children[i + 1]
            op = "!=" if op == "<>" else op
            comparison = ast.Binary(op, left, right, self._pos(children[i]))
            result = comparison if result is None else ast.Binary(
                "AND", result, comparison, comparison.pos)
            left = right.copy()  # `b` of `a = b = c` in the second comparison too
        return result

    @v_args(meta=True, inline=False)
    def in_list(self, meta, children):
        operand, *options = children
        return ast.InList(operand, options, False, self._pos(meta))

    def is_null(self, meta, operand, negated):
        """`x IS [NOT] NULL` (MATCH_RECOGNIZE): the call IS_NULL, which only its checker
        takes."""
        test = ast.Call("IS_NULL", [operand], self._pos(meta))
        return ast.Unary(ast.UnaryOp.NOT, test, self._pos(meta)) if negated else test

    @v_args(meta=True, inline=False)
    def not_in_list(self, meta, children):
        operand, _not_in, *options = children
        return ast.InList(operand, options, True, self._pos(meta))

    @v_args(meta=True, inline=False)
    def arith(self, meta, children):
        result = children[0]
        for i in range(1, len(children), 2):
            result = ast.Binary(str(children[i]), result, children[i + 1],
                                self._pos(children[i]))
        return result

    def neg(self, meta, operand):
        if isinstance(operand, ast.Literal) and not isinstance(operand.value, (str, bool)) \
                and operand.duration is None:
            return ast.Literal(-operand.value, self._pos(meta))
        return ast.Unary("-", operand, self._pos(meta))

    def duration_lit(self, meta, amount, unit):
        # `Delta(ts) <= 5 minutes`: the checker gives it its value in the stream's time unit.
        if str(unit).lower() not in DURATION_UNITS:
            raise QueryError(f"unexpected '{unit}' after {amount} (a duration's unit is ms, "
                             "seconds, minutes, hours, days or ticks)", self._pos(unit))
        return ast.Literal(int(amount), self._pos(amount),
                           duration=self.duration(meta, amount, unit))

    def int_lit(self, meta, token):
        return ast.Literal(int(token), self._pos(token))

    def float_lit(self, meta, token):
        return ast.Literal(float(token), self._pos(token))

    def string_lit(self, meta, token):
        quote = token[0]
        return ast.Literal(token[1:-1].replace(quote * 2, quote), self._pos(token))

    def true_lit(self, meta, token):
        return ast.Literal(True, self._pos(token))

    def false_lit(self, meta, token):
        return ast.Literal(False, self._pos(token))

    def bare_attr(self, meta, name):
        return ast.Attr(str(name), None, self._pos(name))

    def var_attr(self, meta, var, name):
        return ast.Attr(str(name), str(var), self._pos(var))

    def func_name(self, meta, token):
        return token

    def star(self, meta):
        return _STAR

    def call_window(self, meta, duration, anchor):
        return _CallWindow(duration, str(anchor))

    @v_args(meta=True, inline=False)
    def call(self, meta, children):
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

    def _aggregate(self, func, args, pos):
        if func in (ast.AggFunc.FIRST, ast.AggFunc.LAST) and args and \
                isinstance(args[0], ast.Call) and args[0].name.upper() in ("PREV", "NEXT"):
            raise QueryError(f"{func.value.upper()}({args[0].name.upper()}(...)): Flink refuses "
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

    def _window_aggregate(self, lname, args, window, pos):
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
        elif isinstance(arg, ast.Call) and len(arg.args) == 1 and arg.args[0] is not _STAR:
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
    def call_member(self, meta, children):
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

    def __init__(self, pos):
        self.pos = pos


class _Recognize:
    """A MATCH_RECOGNIZE statement on its way to its `ast.Query` (which holds its stream
    and PARTITION BY)."""

    def __init__(self, body, stream, partition):
        self.body, self.stream, self.partition = body, stream, partition

    def __iter__(self):
        return iter((self.body, self.stream, self.partition))


_STAR = _Star()


class _CallWindow:
    def __init__(self, duration, anchor):
        self.duration, self.anchor = duration, anchor


class _CallMember(ast.Node):
    """`Temp(cond).value` inside a window aggregate; never left in the AST."""

    child_fields = ("filter",)

    def __init__(self, call_name, flt, member, pos):
        self.call_name, self.filter, self.member, self.pos = call_name, flt, member, pos
        self.__post_init__()


_HEADER_WORDS = {"from": "FROM", "into": "INTO", "partition": "PARTITION BY"}
_CLAUSE_WORDS = {"where": "WHERE", "within": "WITHIN", "strategy": "USING", "order": "ORDER BY",
                 "emit": "EMIT", "timeouts": "ON TIMEOUT EMIT PARTIAL"}


def _pos_of(node) -> ast.Pos:
    return getattr(node, "pos", ast.NOPOS)
