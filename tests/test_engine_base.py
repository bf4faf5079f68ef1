"""The Engine base class: `process` and `process_columns` each default to the other, so an
engine must implement one of them; one that implements neither is refused when made
instead of recursing forever on its first batch."""

import pytest

from cep_core.batch import StringDictionary
from cep_core.checker import load_query_text
from cep_core.engine.base import Engine
from cep_core.engine.match import MatchEngine
from cep_core.engine_factory import create_engine

QUERY = """QUERY rises FROM trades INTO out PARTITION BY symbol
PATTERN ( . rise rise ) DEFINE rise AS price > Last(price)
EMIT symbol = symbol;"""


class NeitherEngine(Engine):
    def state(self):
        return {}, {}

    def load_state(self, meta, arrays):
        pass


class RowsEngine(NeitherEngine):
    def process(self, batch):
        return []


def _checked():
    (checked,) = load_query_text(QUERY)
    return checked


def test_an_engine_with_neither_process_method_is_refused_when_made():
    with pytest.raises(TypeError, match="NeitherEngine implements neither process nor"):
        NeitherEngine(_checked(), StringDictionary())


def test_an_engine_with_one_process_method_gets_the_other():
    engine = RowsEngine(_checked(), StringDictionary())
    assert engine.process_columns(None) == []


def test_the_real_engines_are_made():
    engine = create_engine(_checked(), StringDictionary())
    assert isinstance(engine, MatchEngine)
