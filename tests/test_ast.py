"""The AST's shape: declared children, parent links, types beside the tree, and every walker
handling every node class it walks."""

from __future__ import annotations

import dataclasses

import pytest

from cep_core import ast
from cep_core.checker import _QueryChecker, load_query_text
from cep_core.compiler.expressions import ExpressionCompiler
from cep_core.compiler.match import _Compiler as MatchCompiler
from cep_core.compiler.window import _TemplateCompiler
from cep_core.parser import parse
from cep_core.reference.expr import Evaluator, evaluate
from tests.test_checker_ok import ALL

EXPRESSIONS = ast.node_classes(ast.Expression)
BODIES = [ast.MatchQuery, ast.SeqQuery, ast.WindowQuery]


def parsed(name: str) -> ast.QueryFile:
    return parse(ALL[name], f"{name}.cep")


def test_node_classes_are_found_by_introspection():
    assert {c.__name__ for c in EXPRESSIONS} == {
        "Literal", "Attr", "Unary", "Binary", "InList", "Call", "Aggregate", "WindowAggregate"}
    assert {c.__name__ for c in ast.node_classes(ast.RegexNode)} == {
        "RSym", "RAny", "REmpty", "RCat", "RAlt", "RRepeat"}
    assert set(BODIES) <= set(ast.node_classes())


@pytest.mark.parametrize("cls", [c for c in ast.node_classes() if c.__module__ == ast.__name__])
def test_child_fields_name_fields_of_the_class(cls):
    fields = {f.name for f in dataclasses.fields(cls)}
    assert set(cls.child_fields) <= fields, cls


@pytest.mark.parametrize("name", sorted(ALL))
def test_every_node_held_by_a_field_is_a_declared_child(name):
    for node in parsed(name).walk():
        for f in dataclasses.fields(node):
            value = getattr(node, f.name)
            values = value if isinstance(value, list) else [value]
            if any(isinstance(v, ast.Node) for v in values):
                assert f.name in node.child_fields, (type(node).__name__, f.name)


@pytest.mark.parametrize("name", sorted(ALL))
def test_parent_links_make_one_tree(name):
    tree = parsed(name)
    assert tree.parent is None
    seen: set[int] = set()
    for node in tree.walk():
        assert id(node) not in seen, "a node is reached twice: the AST is not a tree"
        seen.add(id(node))
        for child in node.children():
            assert child.parent is node
        assert node.root() is tree


def test_a_chained_comparison_copies_its_middle_operand():
    [query] = parse("QUERY q FROM t PATTERN (A) DEFINE A AS 1 < x + 1 < 9").queries
    condition = query.body.defines[0].condition
    first, second = condition.left, condition.right
    assert (first.op, second.op) == ("<", "<")
    assert first.right is not second.left
    assert first.right.parent is first and second.left.parent is second
    assert first.right.pos == second.left.pos
    assert [type(n) for n in first.right.walk()] == [type(n) for n in second.left.walk()]


def test_walk_and_find_all_are_in_source_order():
    [query] = parse("QUERY q FROM t PATTERN (A) DEFINE A AS a + b * c > d").queries
    condition = query.body.defines[0].condition
    assert [n.name for n in condition.find_all(ast.Attr)] == ["a", "b", "c", "d"]
    assert condition.find(ast.Literal) is None
    assert next(condition.walk()) is condition


def test_set_and_copy_keep_parent_links():
    [query] = parse("QUERY q FROM t PATTERN (A) DEFINE A AS x > 1 AND y < 2").queries
    condition = query.body.defines[0].condition
    replacement = condition.right.copy()
    assert replacement.parent is None and replacement is not condition.right
    condition.set("left", replacement)
    assert condition.left is replacement and replacement.parent is condition
    assert all(child.parent is replacement for child in replacement.children())
    condition.set("right", None)
    assert condition.children() == [replacement]
    with pytest.raises(AttributeError, match="not a child field"):
        condition.set("op", "OR")


@pytest.mark.parametrize("name", sorted(ALL))
def test_checking_writes_nothing_into_the_tree(name):
    for checked in load_query_text(ALL[name], path=f"{name}.cep"):
        nodes = list(checked.query.walk())
        assert not any("type" in vars(node) for node in nodes)
        expressions = [n for n in nodes if isinstance(n, ast.Expression)]
        assert set(checked.types) == set(expressions)


def test_the_same_file_checked_twice_has_two_type_maps():
    text = ALL["tesla_r4"]
    [first], [second] = load_query_text(text), load_query_text(text)
    assert first.types is not second.types
    assert first.query is not second.query
    assert not set(first.types) & set(second.types)


@pytest.mark.parametrize("walker", [_QueryChecker, ExpressionCompiler, MatchCompiler,
                                    _TemplateCompiler, Evaluator])
def test_every_expression_class_has_a_handler_in_every_walker(walker):
    missing = [c.__name__ for c in EXPRESSIONS if c not in walker.handles()]
    assert missing == [], f"{walker.__name__} has no visit_ method for {missing}"


def test_the_checker_handles_every_query_body():
    assert set(BODIES) <= _QueryChecker.handles()
    assert {type(q.body) for q in parse(";\n".join(ALL.values())).queries} == set(BODIES)


def test_a_visit_method_naming_no_node_class_is_refused():
    with pytest.raises(TypeError, match="no node class Literl"):
        class Misspelt(ast.Visitor):
            def visit_Literl(self, node):
                return node


def test_a_node_without_a_handler_is_an_error():
    with pytest.raises(TypeError, match="Evaluator has no handler for RSym"):
        evaluate(ast.RSym("A"), None)


def test_a_subtree_moved_from_another_checked_query_keeps_its_types():
    [q0], [q3] = load_query_text(ALL["ticks"]), load_query_text(ALL["ticks"])
    moved = q0.query.body.items[1].expr
    assert moved not in q3.types
    assert q3.types[moved] == q0.types[moved] == "float"
    with pytest.raises(KeyError):
        q3.types[ast.Attr("price")]


def test_a_call_names_its_function_whatever_the_case():
    from cep_core.functions import FUNCTIONS
    assert {ast.Builtin.named(name) for name in FUNCTIONS} <= set(ast.Builtin)
    assert None not in {ast.Builtin.named(name) for name in FUNCTIONS}
    call = ast.Call("Prev", [ast.Attr("price")])
    assert call.func is ast.Builtin.PREV and call.name == "Prev"  # messages quote the text
    assert ast.Call("median", []).func is None  # the checker refuses it by its name
    assert dataclasses.replace(call, name="abs").func is ast.Builtin.ABS


def test_durations_and_time_units_are_enums_that_read_as_their_text():
    from cep_core.schema import TIME_UNITS, StreamSchema, TimeUnit
    within = parse("QUERY r FROM abc DETECT C c, LAST A a WITHIN 5 minutes FROM c",
                   "q.cep").queries[0].body.steps[0].within
    assert within.unit is ast.DurationUnit.MIN and f"{within.amount} {within.unit}" == "5 min"
    assert ast.Duration(3, "ticks").unit is ast.DurationUnit.TICKS
    schema = StreamSchema("s", {"ts": "timestamp"}, "ts", "us")
    assert schema.time_unit is TimeUnit.US and schema.to_dict()["time_unit"] == "us"
    assert type(schema.to_dict()["time_unit"]) is str  # a schema file's text
    assert TIME_UNITS == ("ms", "s", "us", "ns", "ticks")
    assert ast.Duration(2, "s").in_time_units(TimeUnit.US) == 2_000_000
