"""The repository's code folders and the names they install and import under. setup.py's
FOLDERS is the one place that maps them (the wheel owns its names, so no generic `services`,
`accel` or `bench` lands in a user's site-packages); this module reads it for the tests, and
`python -m tests.layout DEST` builds the tree of links under the installed names that mypy
checks (`make lint`)."""

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _folders() -> dict[str, str]:
    """setup.py's FOLDERS (installed name -> folder), read without running setup.py."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "FOLDERS" for t in node.targets):
            return ast.literal_eval(node.value)
    raise LookupError("setup.py defines no FOLDERS")


FOLDERS = _folders()
PACKAGES = {folder: name for name, folder in FOLDERS.items()}  # folder -> installed name


def module_name(path: Path) -> str:
    """The name a file of the repository imports under (`services/cli/main.py` is
    `cep_service.cli.main`, a package's `__init__.py` the package)."""
    parts = list(path.resolve().relative_to(ROOT).with_suffix("").parts)
    parts[0] = PACKAGES.get(parts[0], parts[0])
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def link_tree(dest: Path) -> None:
    """Links under `dest` laid out as the packages install: a folder whose package holds
    another mapped one (services/ holds bench/ as cep_service.bench) becomes a real folder of
    links to its entries, so the nested link lands in the tree, not in the repository."""
    names = sorted(FOLDERS, key=lambda n: n.count("."))
    for name in names:
        target = dest.joinpath(*name.split("."))
        source = ROOT / FOLDERS[name]
        if any(other.startswith(name + ".") for other in names):
            target.mkdir(parents=True)
            for entry in source.iterdir():
                (target / entry.name).symlink_to(entry)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(source)


if __name__ == "__main__":
    link_tree(Path(sys.argv[1]))
