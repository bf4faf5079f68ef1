"""`cep gpu ...`: the GPU adapter's commands (registered by services/cli/main.py)."""


# Deferred imports: numba.cuda, the GPU engines, the reference interpreter and the event reader load
# when a GPU command runs: `cep` registers these commands for every invocation, `cep --help`
# included.

from pathlib import Path
from typing import Annotated, Any

import typer

from cep_service.cli import common as cli

gpu_app = typer.Typer(help="The GPU adapter: SEQ (CDP) and MATCH (per-key NFA) kernels on "
                      "numba's CUDA target (the CUDA simulator where no GPU exists).",
                      no_args_is_help=True)


@gpu_app.command()
def verify(
    query_file: Annotated[Path, typer.Argument(help="The query file.")],
    events: Annotated[Path, typer.Option("--events", "--input", "-e", "-i", metavar="FILE",
                                         help="Events: .jsonl, .csv or .parquet.")],
    schema: Annotated[list[Path] | None, typer.Option(
        "--schema", "-s", metavar="FILE|DIR",
        help="A schema file or directory (repeatable).")] = None,
    batch_size: Annotated[int, typer.Option(min=1, help="Events per batch.")] = 64,
    memory_budget: Annotated[int | None, typer.Option(
        metavar="BYTES",
        help="Device memory budget in bytes (small: host-resident columns).")] = None,
) -> None:
    """Run the stream through the GPU path and the reference interpreter; print whether they
    agree (exit 0 only if they do)."""
    def body() -> None:
        from cep_accel.gpu import device
        from cep_accel.gpu import placement as placed
        from cep_core import reference
        from cep_core.event_io import InputError, read_events

        target = device.use_simulator_if_no_gpu()
        queries = cli.load_query_file(query_file, cli.schema_registry(schema))
        try:
            simple, _ = read_events(events, queries[0].schema)
        except InputError as e:
            raise cli.CliError(str(e)) from None
        cli.stdout.print(f"target: {device.name()} ({target})", markup=False)
        options: dict[str, Any] = {} if memory_budget is None else \
            {"device_memory_budget": memory_budget}
        disagree = 0
        for q in queries:
            report: list = []
            got_dead: list = []
            failures: list = []
            got = placed.run([q], simple, placement="gpu", batch_size=batch_size,
                             rejected=got_dead, report=report, failures=failures, **options)
            dead_ref: list = []
            expected = reference.run([q], simple, rejected=dead_ref)
            same = not failures and got == expected and \
                sorted(s for _, s, _ in got_dead) == sorted(e.seq for _, e, _ in dead_ref)
            disagree += not same
            verdict = "agree" if same else "DISAGREE"
            cli.stdout.print(f"{verdict}: {report[0].line()}; {len(got)} composite events "
                             f"(reference {len(expected)})", markup=False)
            for failure in failures:
                cli.stdout.print(f"  {failure}", markup=False)
        if disagree:
            raise cli.CliError(f"{disagree} of {len(queries)} queries disagree with the "
                               "reference interpreter")
        cli.stdout.print(f"all {len(queries)} queries agree with the reference interpreter",
                         markup=False)

    cli.guard(body)
