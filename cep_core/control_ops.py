"""What a control message does (`Op`) and to what (`Kind`): the values of its `op` and
of its key's first part on the wire; and what became of it (`Outcome`). A module of its
own, light, so that a CLI command names them without loading the control messages'
checking (jsonschema, the grammar)."""

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


class Outcome(StrEnum):
    """What became of a change: its `outcome` in status records and in the answers of
    the CLI and the HTTP API."""

    APPLIED = "applied"  # the splitter applied it and the coordinator saw it everywhere
    REFUSED = "refused"  # the splitter refused it (its `reason`)
    QUEUED = "queued"  # no pipeline of its stream is up: it waits on the control topic
    TIMED_OUT = "timed_out"  # no outcome in time (`missing`: who did not report)
    SENT = "sent"  # published, not waited for
    INVALID = "invalid"  # refused before it was sent: nothing was written
