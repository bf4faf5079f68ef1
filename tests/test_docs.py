"""The documentation stands on its own, and every example in it is run by a test.

README.md and docs/*.md are read with markdown-it, fenced and indented code blocks alike.
Every code block is one of:

- A query block (a line starting with QUERY): parsed and checked against schemas/. A block
  with `-- error: MESSAGE` lines is intentionally bad: checking it must fail with one error
  per such line, in order, each containing its MESSAGE.
- A command block: lines `cep ...` or `.venv/bin/cep ...` (after an optional `$ `), and
  `make TARGET` / `.venv/bin/python SCRIPT` (the target and the script must exist).
  - Executed (EXECUTED below): `cep check`, `cep schemas`, `cep explain`, `cep run` with
    the reference engine, `cep gen` (its --out sent to a temporary directory; the query
    file it writes is then checked). `$ command` followed by lines quotes its output:
    stdout and stderr together must be exactly those lines. Quoting the output of a
    command that is not executed is an error.
  - Parsed, not run (they need a broker, Spark, a GPU, Yosys, or minutes: `broker`, `serve`,
    `query`, `demo`, `bench`, `backfill`, `gpu`, `fpga`, `run --engine jit`): a concrete
    command line is parsed by the CLI's own parser (sub-command, arguments, option names,
    types and choices); a synopsis with placeholders (`QUERY_FILE`, `HOST:PORT`, `a|b`) has
    its sub-command and option names checked. Optional parts `[--flag X]` are tried both
    with and without.
- A Python block (a fence marked `python`): every Python block of a doc runs, in order, in
  one namespace, from the repository root; functions it defines named `test_*` are then
  called (the pytest examples of docs/python.md). A sketch that cannot run stands in
  NOT_EXAMPLES.
- The output table of `cep fpga resources` (docs/fpga.md): Yosys takes minutes per circuit,
  so LUT and flip-flop counts are not measured again, but the table must be what the
  command's `format_table` prints for those figures, with the state counts the code computes.
- Anything else (diagrams, JSON shapes, a Python sketch) is listed in NOT_EXAMPLES, so a new
  block has to be classified.

Besides: inline `cep ...` code spans name real sub-commands and options; links and images
resolve to files in the repository (and anchors to headings); code spans naming repository
paths (`cep_core/grammar.lark`) exist; no doc, docstring or help text refers to a file
outside the repository.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import click
import pytest
import typer
from markdown_it import MarkdownIt

from cep_core.checker import load_query_text
from cep_core.errors import QueryError, QueryErrors

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
CEP = Path(sys.executable).with_name("cep")
MARKDOWN = MarkdownIt("commonmark")

# Code blocks that are neither queries nor commands: (file, first line).
NOT_EXAMPLES = {
    ("architecture.md", "producers ──> trades (source topic, any number of partitions)"),
    ("architecture.md", "services/cli          the `cep` command line "
                        "(top: imports what it offers)"),
    ("backfill.md", "inputs --count records per split (JVM)--> decode splits (Arrow tasks) "
                    "--seq check--> events"),
    ("fpga.md", "byte  0         4         8                                           16"),
    ("fpga.md", "byte 0        1        2                 4                 6                 8"),
    ("fpga.md", "byte 0          2          4                     8                    12     "
                "             16"),
    ("queries.md", '{"query": "mshape", "key": "IBM", "seq": 41, "start_seq": 12, '
                   '"symbol": "IBM", "count": 9}'),
    ("reliability.md", "# 5000 small JSON messages/s, keyed, into a 4-partition topic, "
                       "50 every 10 ms"),
    ("scaling.md", "spark-submit --master yarn --deploy-mode client \\"),
    ("spark_streaming.md", "source (cep_kafka | cep_files)"),
}
FPGA_RESOURCES = "(0|1)*1(0|1)^i: NFA vs powerset DFA (6-input LUTs, flip-flops)"
# Sub-commands the test runs; every other one is only parsed.
EXECUTED = {("check",), ("schemas",), ("run",), ("gen",), ("explain",)}


@dataclass
class Block:
    doc: Path
    line: int  # 1-based, of the block's first content line
    text: str
    info: str = ""  # a fence's language ("python")

    @property
    def id(self) -> str:
        return f"{self.doc.name}:{self.line}"

    @property
    def first_line(self) -> str:
        return self.text.splitlines()[0] if self.text else ""


def _tokens(doc: Path):
    return MARKDOWN.parse(doc.read_text())


def _blocks() -> list[Block]:
    blocks = []
    for doc in DOCS:
        for token in _tokens(doc):
            if token.type in ("fence", "code_block"):
                first = token.map[0] + (2 if token.type == "fence" else 1)
                blocks.append(Block(doc, first, token.content, token.info.strip()))
    return blocks


def _inline_code(doc: Path):
    for token in _tokens(doc):
        if token.type == "inline":
            for child in token.children:
                if child.type == "code_inline":
                    yield token.map[0] + 1, child.content


BLOCKS = _blocks()
QUERY_LINE = re.compile(r"^\s*QUERY\s+\w", re.IGNORECASE | re.MULTILINE)
FRAGMENT_LINE = re.compile(r"^\s*(PATTERN|DEFINE|SELECT|DETECT)\b", re.MULTILINE)
COMMAND_LINE = re.compile(r"^(\$ )?([A-Z_][A-Z0-9_]*=\S*\s+)*"
                          r"(\.venv/bin/cep|cep|make|\.venv/bin/python) ", re.MULTILINE)


def _kind(block: Block) -> str:
    if block.info == "python" and (block.doc.name, block.first_line) not in NOT_EXAMPLES:
        return "python"
    if COMMAND_LINE.search(block.text.replace("\\\n", " ")):
        return "commands"
    if QUERY_LINE.search(block.text):
        return "query"
    if block.first_line == FPGA_RESOURCES:
        return "fpga-resources"
    return "other"


def _of_kind(kind: str) -> list:
    chosen = [b for b in BLOCKS if _kind(b) == kind]
    return [pytest.param(b, id=b.id) for b in chosen]


def test_the_docs_have_examples():
    kinds = [_kind(b) for b in BLOCKS]
    assert kinds.count("query") >= 12 and kinds.count("commands") >= 6


@pytest.mark.parametrize("block", [pytest.param(b, id=b.id) for b in BLOCKS])
def test_every_block_is_classified(block):
    kind = _kind(block)
    if kind == "other":
        assert not FRAGMENT_LINE.search(block.text), (
            "a query fragment: show the whole query (QUERY name FROM stream ...) so that it "
            "is checked")
        assert (block.doc.name, block.first_line) in NOT_EXAMPLES, (
            "neither a query nor a cep command: add it to NOT_EXAMPLES if it is not an "
            "example to run")


# ---------------------------------------------------------------- queries


@pytest.mark.parametrize("block", _of_kind("query"))
def test_documented_query_checks(block):
    expected = re.findall(r"^\s*-- error: (.*?)\s*$", block.text, re.MULTILINE)
    try:
        checked = load_query_text(block.text, path=str(block.doc.relative_to(ROOT)))
    except QueryErrors as e:
        messages = [err.message for err in e.errors]
    except QueryError as e:
        messages = [e.message]
    else:
        assert not expected, f"marked bad ({expected}) but it checks"
        assert checked
        return
    assert expected, f"the query does not check: {messages}"
    assert len(messages) == len(expected), messages
    for message, quoted in zip(messages, expected):
        assert quoted in message


# ---------------------------------------------------------------- commands


@dataclass
class Command:
    words: list[str]  # after `cep`, as written (optional parts kept, brackets removed)
    minimal: list[str]  # without the optional parts
    output: list[str] | None  # quoted output (`$ command` followed by lines)


PLACEHOLDER = re.compile(r"^\[?[A-Z][A-Z0-9_]*(:[A-Z]+)?(\.\w+)?\]?$|\||\.\.\.")


def _optional(text: str, keep: bool) -> str:
    """`a [--b C] d` -> `a --b C d` (keep) or `a  d`: an optional part starts with `[` at
    the start of a word (so the brackets of `local[*]` are kept) and may nest."""
    out, stack = [], []  # stack: True for an optional part's bracket
    for i, ch in enumerate(text):
        if ch == "[":
            optional = i == 0 or text[i - 1].isspace() or text[i - 1] == "["
            stack.append(optional)
            if optional:
                continue
        elif ch == "]" and stack and stack.pop():
            continue
        if keep or not any(stack):
            out.append(ch)
    return "".join(out)


def _words(line: str) -> list[str] | None:
    """The words after `cep` of one command, or None when it is not a cep command."""
    words = shlex.split(line)
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):  # VAR=value cep ...
        words.pop(0)
    if words and words[-1] == "&":
        words.pop()
    if not words or words[0] not in ("cep", ".venv/bin/cep"):
        return None
    return words[1:]


def _commands(block: Block) -> tuple[list[Command], list[str]]:
    """The cep commands of a block, and its other lines that name a make target or a
    script."""
    lines = block.text.replace("\\\n", " ").splitlines()
    commands: list[Command] = []
    others: list[str] = []
    for line in lines:
        quoted = line.startswith("$ ")
        if not quoted and not COMMAND_LINE.match(line) and commands and \
                commands[-1].output is not None:
            commands[-1].output.append(line)
            continue
        line = re.sub(r"(^|\s)#(\s.*)?$", "", line.removeprefix("$ "))  # a comment
        for part in re.split(r";|&&", line):
            part = part.strip()
            full = _words(_optional(part, keep=True)) if part else None
            if full is None:
                if part.startswith(("make ", ".venv/bin/python ")):
                    others.append(part)
                continue
            minimal = _words(_optional(part, keep=False))
            commands.append(Command(full, minimal, [] if quoted else None))
    return commands, others


def _cli():
    from typer.main import get_command

    from cep_service.cli.main import app
    return get_command(app)


def _resolve(words: list[str]):
    """The click command a command line names, its path and its remaining words."""
    command, path, rest = _cli(), [], list(words)
    while hasattr(command, "commands"):  # a group
        if rest and rest[0].startswith("-"):  # the group's own option (cep --version)
            break
        name = rest.pop(0) if rest else None
        sub = command.commands.get(name)
        assert sub is not None, f"no command 'cep {' '.join(path + [str(name)])}'"
        command, path = sub, path + [name]
    return command, tuple(path), rest


def _check_parses(words: list[str]) -> None:
    command, path, rest = _resolve(words)
    try:
        command.make_context("cep " + " ".join(path), list(rest))
    except (click.exceptions.Exit, typer.Exit) as e:  # an eager option that exits (--version)
        assert e.exit_code == 0, f"cep {' '.join(words)}: exit code {e.exit_code}"
    except Exception as e:  # click's own errors (its classes depend on the typer version)
        message = e.format_message() if hasattr(e, "format_message") else str(e)
        raise AssertionError(f"cep {' '.join(words)}: {message}") from None


def _check_options(words: list[str]) -> None:
    command, path, _rest = _resolve([w.strip("[]") for w in words])
    known = {name for p in command.params for name in (*p.opts, *p.secondary_opts)}
    for word in words:
        flag = word.strip("[]").split("=", 1)[0]
        if flag.startswith("-") and flag != "-" and not PLACEHOLDER.search(flag):
            assert flag in known | {"--help"}, f"cep {' '.join(path)} has no option {flag}"


def _synopsis(words) -> bool:
    """Placeholders: only the sub-command and the option names can be checked."""
    return any(PLACEHOLDER.search(w) for w in words)


def _executed(words: list[str]) -> bool:
    _command, path, _rest = _resolve(words)
    return path in EXECUTED and "--placement" not in words and not (
        "--engine" in words and words[words.index("--engine") + 1] != "reference")


def cep(*args: str) -> subprocess.CompletedProcess:
    command = [str(CEP)] if CEP.exists() else [sys.executable, "-m", "cep_service.cli.main"]
    env = {k: v for k, v in os.environ.items() if k != "CEP_DEBUG"}
    return subprocess.run(command + list(args), capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=120, check=False)


def _run(words: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    _command, path, _rest = _resolve(words)
    if path == ("gen",):
        for flag in ("--out", "-o"):
            if flag in words:
                words = list(words)
                words[words.index(flag) + 1] = str(tmp_path / "gen")
    result = cep(*words)
    if path == ("gen",) and result.returncode == 0:
        written = sorted((tmp_path / "gen").glob("*.cep"))
        assert written, "cep gen wrote no query file"
        checked = cep("check", *map(str, written))
        assert checked.returncode == 0, checked.stderr
    return result


def _lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return lines


@pytest.mark.parametrize("block", _of_kind("commands"))
def test_documented_commands(block, tmp_path):
    """Executed where EXECUTED says, else parsed (see the module docstring)."""
    commands, others = _commands(block)
    assert commands or others
    for command in commands:
        for words in {tuple(command.words), tuple(command.minimal)}:
            if _synopsis(words):
                _check_options(list(words))
            else:
                _check_parses(list(words))
        run = not _synopsis(command.minimal) and _executed(command.minimal)
        if command.output is not None:
            assert run, (
                f"cep {' '.join(command.words)}: quotes an output, but the docs test does "
                "not run this command (add it to EXECUTED if it is quick and needs no broker)")
        if run:
            result = _run(command.minimal, tmp_path)
            if command.output is None:
                assert result.returncode == 0, result.stderr
            else:
                assert _lines(result.stdout + result.stderr) == _lines(
                    "\n".join(command.output))
                failed = any(": error: " in line for line in command.output)
                assert result.returncode == (1 if failed else 0)
    for other in others:
        target_or_script = other.split()[1]
        if other.startswith("make "):
            makefile = (ROOT / "Makefile").read_text()
            assert re.search(rf"^{re.escape(target_or_script)}:", makefile, re.MULTILINE), other
        else:
            assert (ROOT / target_or_script).is_file(), other


INLINE_COMMANDS = [pytest.param(doc, line, text, id=f"{doc.name}:{line}:{text[:40]}")
                   for doc in DOCS for line, text in _inline_code(doc)
                   if re.match(r"(\.venv/bin/)?cep \w", text)]


@pytest.mark.parametrize(("doc", "line", "text"), INLINE_COMMANDS)
def test_inline_commands_name_real_options(doc, line, text):
    words = _words(_optional(text, keep=True))
    path_words = [w for w in words if w != "..."]
    _check_options(path_words)


# ---------------------------------------------------------------- Python


PYTHON_DOCS = sorted({b.doc for b in BLOCKS if _kind(b) == "python"})


@pytest.mark.parametrize("doc", PYTHON_DOCS, ids=lambda d: d.name)
def test_documented_python_runs(doc, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    namespace: dict = {"__name__": f"docs_{doc.stem}"}
    for block in (b for b in BLOCKS if b.doc == doc and _kind(b) == "python"):
        code = compile("\n" * (block.line - 1) + block.text, str(doc), "exec")
        exec(code, namespace)  # the docs' own examples
    tests = [f for name, f in namespace.items() if name.startswith("test_") and callable(f)]
    for test in tests:
        test()
    assert tests or doc.name != "python.md", "docs/python.md shows no pytest example"


# ---------------------------------------------------------------- the fpga resources table


@pytest.mark.parametrize("block", _of_kind("fpga-resources"))
def test_fpga_resources_table_is_what_the_command_prints(block):
    """The figures are Yosys measurements (not repeated here); the layout is the command's
    and the automaton state counts are the code's."""
    from cep_accel.fpga.hdl_automata import binary_automaton, powerset
    from cep_accel.fpga.resources import Resources, Row, format_table

    rows, part = [], None
    for line in block.text.splitlines():
        if line.startswith("stream partitioner"):
            part = "partitioner"
        fields = line.split()
        if not fields or not fields[0].isdigit():
            continue
        if part is None:
            i, nfa_states, nfa_lut, nfa_ff, dfa_states, hot_lut, hot_ff, bin_lut, bin_ff = \
                map(int, fields)
            automaton = binary_automaton(i)
            assert nfa_states == automaton.size + 1, line
            assert dfa_states == len(powerset(automaton).subsets), line
            rows += [Row("automaton", "nfa", i, nfa_states, Resources(nfa_lut, nfa_ff, 0)),
                     Row("automaton", "dfa-onehot", i, dfa_states,
                         Resources(hot_lut, hot_ff, 0)),
                     Row("automaton", "dfa-binary", i, dfa_states,
                         Resources(bin_lut, bin_ff, 0))]
        else:
            depth, luts, ffs = map(int, fields[:3])
            rows.append(Row("partitioner", "partitioner", depth, 0,
                            Resources(luts, ffs, float(fields[5]))))
    assert len(rows) >= 30
    assert format_table(rows) == block.text.rstrip("\n")


# ---------------------------------------------------------------- links and paths


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(doc: Path) -> set[str]:
    tokens = _tokens(doc)
    return {_slug(tokens[i + 1].content) for i, t in enumerate(tokens)
            if t.type == "heading_open"}


def _targets(doc: Path):
    for token in _tokens(doc):
        for child in token.children or []:
            if child.type == "link_open":
                yield token.map[0] + 1, child.attrs["href"]
            elif child.type == "image":
                yield token.map[0] + 1, child.attrs["src"]


LINKS = [pytest.param(doc, line, target, id=f"{doc.name}:{line}:{target}")
         for doc in DOCS for line, target in _targets(doc)
         if not re.match(r"^[a-z]+:", target)]


def test_docs_have_links():
    assert len(LINKS) >= 10


@pytest.mark.parametrize(("doc", "line", "target"), LINKS)
def test_relative_links_resolve_inside_the_repository(doc, line, target):
    path, _, anchor = target.partition("#")
    resolved = (doc.parent / path).resolve() if path else doc
    assert resolved.is_relative_to(ROOT), f"{target} is outside the repository"
    assert resolved.exists(), f"{target}: no such file"
    if anchor:
        assert anchor in _anchors(resolved), f"{target}: no such heading"


TOP_DIRS = sorted(p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith("."))
REPO_PATH = re.compile(rf"^({'|'.join(map(re.escape, TOP_DIRS))})/[\w./-]*$")


def test_code_spans_naming_repository_paths_exist():
    missing = []
    for doc in DOCS:
        for line, text in _inline_code(doc):
            for word in re.split(r"[\s,()]+", text):
                if REPO_PATH.match(word) and not (ROOT / word).exists():
                    missing.append(f"{doc.name}:{line}: {word}")
    assert not missing


TEXT_FILES = [p for p in [*ROOT.glob("*.md"), ROOT / "Makefile", ROOT / "pyproject.toml",
                          ROOT / "Dockerfile", ROOT / "docker-compose.yml",
                          *(f for d in ("cep_core", "services", "accel", "bench", "tests",
                                        "examples", "docs", "schemas")
                            for f in (ROOT / d).rglob("*")
                            if f.suffix in (".py", ".md", ".lark", ".cep", ".json", ".yml"))]
              if p.is_file() and "__pycache__" not in p.parts]
# The developers' checkout has files beside the repository that a user's clone lacks.
OUTSIDE = re.compile(r"\.\./shared\b|\bshared/[A-Z]+\.md|\b(SEMANTICS|BROKER|ARCHITECTURE|"
                     r"STYLE)\.md\b")
MENTIONED_DOC = re.compile(r"\b(docs/[\w-]+\.md|examples/[\w/.-]+\.cep)\b")


def test_nothing_refers_to_files_outside_the_repository():
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
             for p in TEXT_FILES for n, line in enumerate(p.read_text().splitlines(), 1)
             if OUTSIDE.search(line)]
    assert not found


def test_docs_named_in_code_and_help_texts_exist():
    missing = [f"{p.relative_to(ROOT)}:{n}: {m.group(1)}"
               for p in TEXT_FILES if p.suffix == ".py"
               for n, line in enumerate(p.read_text().splitlines(), 1)
               for m in MENTIONED_DOC.finditer(line) if not (ROOT / m.group(1)).exists()]
    assert not missing


def test_no_file_holds_merge_conflict_markers():
    """A merge resolved by hand left `<<<<<<< HEAD` in a doc once; git knows every file."""
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                             check=True).stdout.decode().split("\0")
    marked = []
    for name in filter(None, tracked):
        path = ROOT / name
        if path.is_symlink() or not path.is_file() or path.suffix in (".png", ".parquet"):
            continue
        for number, line in enumerate(path.read_bytes().split(b"\n"), 1):
            if line.startswith((b"<<<<<<< ", b">>>>>>> ")):
                marked.append(f"{name}:{number}")
    assert not marked, marked
