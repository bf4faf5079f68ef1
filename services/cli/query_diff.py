"""`cep query diff NEW_QUERY_FILE --events FILE [--name NAME] [--old OLD_FILE]`: before
`cep query update`, run the new version of a query over a recorded stretch of the stream
and compare its composite events with the live version's (cep_core/query_diff.py).

The old version is the query of that name live on the control topic (as `cep query`
reads the live set), or the query of --old FILE. Prints a summary line, then the differing
composite events as JSON lines, `-` only in the old version, `+` only in the new one.
Exits 0 when both give the same composite events, 1 when they differ, 2 on trouble
(like diff).
"""

from __future__ import annotations

# Deferred imports: the engines, the reader and Kafka load when `cep query diff` runs: the CLI
# imports this module (for its options) with every command.

import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import orjson
import typer

if TYPE_CHECKING:
    from cep_core.query_diff import QueryDiff

DiffEvents = Annotated[Path | None, typer.Option(
    "--events", "-e", metavar="FILE", help="diff: recorded events (.jsonl, .csv, .parquet) "
    "both versions run over.")]
DiffOld = Annotated[Path | None, typer.Option(
    "--old", metavar="FILE", help="diff: the old version's query file (default: the live "
    "version on the control topic).")]


def query_diff(cli_error: Callable[[str, int], Exception], target: str | None, name: str | None,
               events: Path | None, old: Path | None, bootstrap: str, control: str,
               topic_prefix: str,
               kafka_config: Path | None, schema: list[Path] | None) -> None:
    """The body of `cep query diff`; every error exits 2 (1 means: they differ)."""
    def error(message: str, code: int = 2) -> Exception:
        return cli_error(message, 2)

    from cep_service.cli.common import export_schema_paths

    export_schema_paths(schema, error)
    if not target:
        raise error("cep query diff needs the new version's query file")
    if events is None:
        raise error("cep query diff needs --events FILE: the recorded events both versions "
                    "run over")
    new_path = Path(target)
    if not new_path.is_file():
        raise error(f"{new_path}: no such file")

    from cep_core.errors import QueryError, QueryErrors
    from cep_core.event_io import InputError
    from cep_core.query_diff import QueryDiffError, diff_query
    from cep_core.schema import SchemaError, SchemaRegistry

    new_text = new_path.read_text()
    try:
        if old is not None:
            if not old.is_file():
                raise error(f"{old}: no such file")
            registry, old_text, old_source = SchemaRegistry(), old.read_text(), str(old)
        else:
            registry, old_text, old_source, name = _live_version(
                error, new_text, str(new_path), name, bootstrap, control, topic_prefix,
                kafka_config)
        diff = diff_query(old_text, new_text, str(events), registry, name=name,
                          old_source=old_source, new_source=str(new_path))
    except QueryErrors as e:
        raise error("\n".join(str(err) for err in e.errors)) from None
    except (QueryError, QueryDiffError, InputError, SchemaError) as e:
        raise error(str(e)) from None
    except OSError as e:
        raise error(f"{e.filename or events}: {e.strerror or e}") from None
    print(diff.summary())
    for line in diff.lines():
        print(line)
    _notes(diff)
    if not diff.identical:
        raise typer.Exit(1)


def _live_version(error: Callable[[str], Exception], new_text: str, new_source: str,
                  name: str | None, bootstrap: str, control: str, topic_prefix: str,
                  kafka_config: Path | None) -> tuple:
    """(registry, text, source, name) of the version of the query live on the control
    topic: the registry holds the topic's streams too."""
    from cep_core.checker import load_query_text
    from cep_core.control_message import replayed
    from cep_core.query_diff import pick_query
    from cep_service.cli.common import kafka_settings
    from cep_service.errors import BrokerUnreachable
    from cep_service.stream.control import control_log
    from cep_service.stream.kafka import Topics

    settings = kafka_settings(bootstrap, kafka_config)
    control_topic = Topics("", control=control, prefix=topic_prefix).control
    client_log = logging.getLogger("librdkafka")
    quiet, client_log.disabled = client_log.disabled, True  # a line per retry: the error
    try:                                                    # below says it once
        records = control_log(settings, control_topic)
    except BrokerUnreachable as e:
        raise error(f"cannot read the live version of the query from {control_topic} ({e}); "
                    "give the old version with --old FILE") from None
    finally:
        client_log.disabled = quiet
    view = replayed(records)
    new = pick_query(load_query_text(new_text, view.registry, new_source), name, new_source)
    live = view.live.get(new.name)
    if live is None:
        held = ", ".join(sorted(view.live)) or "none"
        raise error(f"no query {new.name!r} is live on {control_topic} (live: {held}); "
                    "give the old version with --old FILE")
    return view.registry, live.text, f"<live {new.name}>", new.name


def _notes(diff: QueryDiff) -> None:
    """Bad records and events an engine rejected, on stderr (the composite events alone
    are compared)."""
    if diff.dead_letters:
        first = diff.dead_letters[0]
        print(f"{len(diff.dead_letters)} bad record{'s' if len(diff.dead_letters) != 1 else ''}"
              f" skipped: first {first.where()}: {first.reason}", file=sys.stderr)
    for version, rejected in (("old", diff.old_rejected), ("new", diff.new_rejected)):
        if rejected:
            print(f"the {version} version rejected {len(rejected)} events: first "
                  f"{orjson.dumps(rejected[0].to_json()).decode()}", file=sys.stderr)
