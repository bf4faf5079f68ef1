"""What a control message does (`Op`) and to what (`Kind`): the values of its `op` and
of its key's first part on the wire. A module of its own, light, so that a CLI command
names them without loading the control messages' checking (jsonschema, the grammar)."""

from __future__ import annotations

from enum import StrEnum


# Deliberately like the enums of cep_core/ast.py in shape only: member declarations
class Op(StrEnum):
    """What a control message does (its `op` on the wire)."""

    ADD = "add"
    UPDATE = "update"
    REMOVE = "remove"


class Kind(StrEnum):
    """What a control message changes (the first part of its key)."""

    QUERY = "query"
    STREAM = "stream"
