"""`cep explain QUERY_FILE`: what each query compiled to (cep_core/explain.py), as text, as
Graphviz's language, as an SVG drawing or as JSON."""

# Deferred imports: cep_core.explain (and through it the compilers) load when the command
# runs, not when `cep --help` builds the command list.

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import orjson
import typer

from cep_service.cli.common import (
    CliError,
    SchemaOption,
    guard,
    load_query_file,
    schema_registry,
    stdout,
)


class ExplainFormat(StrEnum):
    text = "text"
    dot = "dot"
    svg = "svg"
    json = "json"


def explain_command(
    query_file: Annotated[Path, typer.Argument(help="A query file.")],
    schema: SchemaOption = None,
    name: Annotated[str | None, typer.Option(
        "--name", help="Only this query of the file.")] = None,
    fmt: Annotated[ExplainFormat, typer.Option(
        "--format", "-f", help="text (default), dot (Graphviz), svg (drawn by Graphviz's "
        "dot) or json.")] = ExplainFormat.text,
    out: Annotated[Path | None, typer.Option(
        "--out", "-o", metavar="FILE", help="Write here instead of standard output (svg, "
        "dot: one file per query, NAME inserted before the suffix when the file holds "
        "several).")] = None,
) -> None:
    """What each query compiled to: the MATCH automaton, the SEQ plan and its algorithm,
    the WINDOW panes; the partition key, the horizon and the state per key."""

    def body() -> None:
        from cep_core.explain import explain

        queries = load_query_file(query_file, schema_registry(schema))
        if name is not None:
            queries = [q for q in queries if q.name == name]
            if not queries:
                raise CliError(f"{query_file}: no query named {name!r}")
        explained = [explain(q) for q in queries]
        if fmt is ExplainFormat.text:
            texts = ["\n".join(e.text() for e in explained)]
        elif fmt is ExplainFormat.json:
            texts = ["\n".join(orjson.dumps(e.to_json()).decode() for e in explained)]
        else:
            try:
                texts = [e.dot() if fmt is ExplainFormat.dot else e.svg() for e in explained]
            except RuntimeError as e:
                raise CliError(str(e)) from None
        if out is None:
            for text in texts:
                stdout.print(text.rstrip("\n"), markup=False, highlight=False)
            return
        paths = [out] if len(texts) == 1 else [
            out.with_name(f"{out.stem}.{e.name}{out.suffix}") for e in explained]
        for path, text in zip(paths, texts):
            try:
                path.write_text(text)
            except OSError as e:
                raise CliError(f"{path}: {e.strerror or e}") from None
            stdout.print(f"wrote {path}", markup=False)

    guard(body)
