"""`cep fpga ...`: the FPGA adapter's commands (registered by services/cli/main.py)."""


# Deferred imports: the FPGA modules (planner, adapter, emulator, HDL, simulators), the event reader
# and the string tables load when an FPGA command runs: `cep` registers these commands for every
# invocation, `cep --help` included.

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from cep_service.cli import common as cli
from cep_service.cli.common import CliError

if TYPE_CHECKING:
    from cep_core.checked import CheckedQuery
    from cep_core.events import Event

fpga_app = typer.Typer(help="The FPGA adapter: UDP wire protocol, circuit emulator, "
                       "verification (docs/fpga.md).", no_args_is_help=True)

QueryFile = Annotated[Path, typer.Argument(help="The query file.")]
EventsOption = Annotated[Path, typer.Option("--events", "--input", "-e", "-i", metavar="FILE",
                                            help="Events: .jsonl, .csv or .parquet.")]
SchemaOption = Annotated[list[Path] | None, typer.Option(
    "--schema", "-s", metavar="FILE|DIR", help="A schema file or directory (repeatable).")]
QueryOption = Annotated[str | None, typer.Option(
    "--query", "-q", metavar="NAME", help="Which query of the file (default: the only one).")]
ElementsOption = Annotated[int, typer.Option(min=1, help="Pipeline elements of the stream "
                                             "partitioner.")]
TickOption = Annotated[int, typer.Option(min=1, help="Received tuples per timer tick.")]


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or int(port) > 65535:
        raise CliError(f"{text!r} is not HOST:PORT", 2)
    return host, int(port)


def _queries(query_file: Path, schema: list[Path] | None, name: str | None,
             one: bool) -> "list[CheckedQuery]":
    """The checked queries to run (each compiled for the FPGA, so unsupported ones fail
    here with the construct named)."""
    from cep_accel.fpga.plan import FpgaUnsupported, compile_fpga
    from cep_core.batch import StringDictionary

    queries = cli.load_query_file(query_file, cli.schema_registry(schema))
    if name is not None:
        queries = [q for q in queries if q.name == name]
        if not queries:
            raise cli.CliError(f"{query_file}: no query named {name!r}")
    if one and len(queries) != 1:
        raise cli.CliError(f"{query_file} has {len(queries)} queries; pick one with --query")
    source = query_file.read_text()
    for q in queries:
        try:
            compile_fpga(q, StringDictionary())
        except FpgaUnsupported as e:
            raise cli.CliError(str(e.with_source(source))) from None
    return queries


def _events(path: Path, checked: "CheckedQuery") -> "list[Event]":
    from cep_core.event_io import InputError, read_events

    try:
        simple, dead = read_events(path, checked.schema)
    except InputError as e:
        raise cli.CliError(str(e)) from None
    if dead:
        cli.stderr.print(f"{len(dead)} bad events skipped", markup=False)
    return simple


@fpga_app.command()
def send(
    query_file: QueryFile,
    events: EventsOption,
    device: Annotated[str, typer.Option(metavar="HOST:PORT", help="The device's HOST:PORT.")],
    bind: Annotated[str, typer.Option(metavar="HOST:PORT",
                                      help="Local HOST:PORT (port 0: any).")] = "0.0.0.0:0",
    per_datagram: Annotated[int | None, typer.Option(
        min=1, max=90, help="Tuples per datagram (default: as many as fit).")] = None,
    sync_every: Annotated[int | None, typer.Option(
        min=1, help="Wait for the device after this many datagrams (default: line rate).")]
    = None,
    batch_size: Annotated[int, typer.Option(min=1, help="Events per batch.")] = 65536,
    schema: SchemaOption = None,
    query: QueryOption = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the device.")] = 5.0,
) -> None:
    """Stream events to a device (or `cep fpga emulate`); print its matches as composite
    events (JSON lines)."""
    def body() -> None:
        from cep_accel.fpga.adapter import FpgaAdapter
        from cep_core.event_io import write_composites_jsonl

        [checked] = _queries(query_file, schema, query, one=True)
        simple = _events(events, checked)
        adapter = FpgaAdapter(checked, _address(device), bind=_address(bind),
                              per_datagram=per_datagram, sync_every=sync_every,
                              timeout=timeout)
        found: list[dict] = []
        try:
            for start in range(0, len(simple), batch_size):
                found += adapter.send_events(simple[start:start + batch_size])
            found += adapter.sync()
        finally:
            adapter.close()
        found.sort(key=lambda c: (c["seq"], c["start_seq"]))
        write_composites_jsonl(found)
        counts = adapter.status
        cli.stderr.print(f"sent {adapter.wire_seq} tuples; device: {counts['reports']} "
                         f"matches, {counts['discarded']} discarded, {counts['expired']} "
                         f"expired, {counts['lost_tuples']} lost", markup=False)

    cli.guard(body)


@fpga_app.command()
def emulate(
    query_file: QueryFile,
    listen: Annotated[str, typer.Option(metavar="HOST:PORT", help="HOST:PORT to listen on.")],
    peer: Annotated[str, typer.Option(metavar="HOST:PORT", help="The host adapter's "
                                      "HOST:PORT: the only sender accepted, and where "
                                      "reports go.")],
    elements: ElementsOption = 64,
    tick_tuples: TickOption = 4096,
    duration: Annotated[float | None, typer.Option(help="Stop after this many seconds.")]
    = None,
    schema: SchemaOption = None,
    query: QueryOption = None,
) -> None:
    """Serve the circuit of one query over UDP (a functional emulator of the FPGA)."""
    def body() -> None:
        from cep_accel.fpga.emulator import Circuit, EmulatorServer
        from cep_accel.fpga.plan import CircuitConfig, compile_fpga
        from cep_core.batch import StringDictionary

        [checked] = _queries(query_file, schema, query, one=True)
        circuit = Circuit(compile_fpga(checked, StringDictionary()),
                          CircuitConfig(elements=elements, tick_tuples=tick_tuples))
        server = EmulatorServer(circuit, _address(listen), _address(peer))
        host, port = server.address
        cli.stderr.print(f"emulating query {checked.name} on {host}:{port} for {peer}",
                         markup=False)
        try:
            server.serve(duration)
        except KeyboardInterrupt:
            pass
        finally:
            server.close()
        cli.stderr.print(f"counts: {circuit.counts()}", markup=False)

    cli.guard(body)


@fpga_app.command()
def verify(
    query_file: QueryFile,
    events: EventsOption,
    elements: ElementsOption = 1024,
    tick_tuples: TickOption = 4096,
    schema: SchemaOption = None,
    query: QueryOption = None,
) -> None:
    """Run the stream through adapter + emulator (UDP), every device leg (emulator, HDL
    simulation) and the reference interpreter; print whether all agree (exit 0 only if
    they do)."""
    def body() -> None:
        from cep_accel.fpga.plan import CircuitConfig
        from cep_accel.fpga.verify import verify as run_verify

        queries = _queries(query_file, schema, query, one=False)
        simple = _events(events, queries[0])
        config = CircuitConfig(elements=elements, tick_tuples=tick_tuples)
        agree = True
        for checked in queries:
            verdict = run_verify(checked, simple, config)
            for outcome in verdict.outcomes:
                mark = "agree" if outcome.agrees else "DISAGREE"
                cli.stdout.print(f"{checked.name}: {outcome.name}: {mark} ({outcome.detail})",
                                 markup=False)
            for module in verdict.skipped:
                cli.stdout.print(f"{checked.name}: {module}: not installed, not run",
                                 markup=False)
            agree = agree and verdict.agrees
        cli.stdout.print("all agree" if agree else "paths disagree", markup=False)
        if not agree:
            raise typer.Exit(1)

    cli.guard(body)


@fpga_app.command()
def hdl(
    query_file: QueryFile,
    out: Annotated[Path, typer.Option("--out", "--output", "-o", metavar="DIR",
                                      help="Directory for the Verilog files.")],
    elements: ElementsOption = 64,
    tick_tuples: TickOption = 4096,
    schema: SchemaOption = None,
    query: QueryOption = None,
) -> None:
    """Write the circuit of a query as synthesizable Verilog (predicate decoder, NFA,
    pipelined stream partitioner) and a testbench that reads tuples from a hex file."""
    def body() -> None:
        from cep_accel.fpga.hdl import write_hdl
        from cep_accel.fpga.plan import CircuitConfig, compile_fpga
        from cep_core.batch import StringDictionary

        [checked] = _queries(query_file, schema, query, one=True)
        plan = compile_fpga(checked, StringDictionary())
        files = write_hdl(plan, out, CircuitConfig(elements=elements, tick_tuples=tick_tuples))
        cli.stdout.print(f"{files.circuit}: query {checked.name}: {len(plan.atoms)} "
                         f"comparators, {plan.positions} NFA states, {elements} partitioner "
                         f"elements, {plan.layout.tuple_bits}-bit tuples", markup=False)
        cli.stdout.print(f"{files.testbench}: iverilog -o sim -Ptestbench.N_TUPLES=<n> "
                         f"{files.circuit.name} {files.testbench.name} && vvp sim "
                         "+tuples=<hex file> +reports=<out file>", markup=False)

    cli.guard(body)


@fpga_app.command()
def resources(
    max_i: Annotated[int, typer.Option(min=1, max=16, help="Largest i of "
                                       "(0|1)*1(0|1)^i.")] = 10,
    depths: Annotated[str, typer.Option(help="Partitioner depths, comma separated "
                                        "(empty: skip).")] = "100,200,300,400,500,600,700,800",
    png: Annotated[Path, typer.Option(metavar="FILE", help="Where to write the plot.")]
    = Path("fpga_resources.png"),
) -> None:
    """Synthesize with Yosys and print LUT and flip-flop counts: NFA vs powerset DFA
    (one-hot, binary) of (0|1)*1(0|1)^i, and the stream partitioner by depth (the paper's
    Figures 4 and 9); writes a PNG plot."""
    def body() -> None:
        from cep_accel.fpga import resources as res
        from cep_service.extras import require

        require("matplotlib", "fpga", "cep fpga resources (its plot)")
        try:
            sizes = [int(d) for d in depths.split(",") if d.strip()]
        except ValueError:
            raise cli.CliError(f"--depths {depths!r} is not a comma-separated list of "
                               "integers", 2) from None
        if any(d < 1 for d in sizes):
            raise cli.CliError("partitioner depths must be positive", 2)
        try:
            res.require_yosys()
        except res.YosysMissing as e:
            raise cli.CliError(str(e)) from None

        def progress(row: res.Row) -> None:
            cli.stderr.print(f"synthesized {row.circuit} {row.size}: "
                             f"{row.resources.luts} LUTs, {row.resources.flip_flops} FFs "
                             f"({row.resources.seconds:.1f} s)", markup=False)

        rows = res.automaton_rows(range(1, max_i + 1), progress)
        rows += res.partitioner_rows(sizes, progress)
        cli.stdout.print(res.format_table(rows), markup=False)
        cli.stdout.print(f"plot: {res.plot(rows, png)}", markup=False)

    cli.guard(body)
