"""docs/architecture.md draws the package tree: it must name every module there is, and no other.

A folder whose modules the tree lists (``amqp/``, ``consumer/``, ``parking/moving/`` …) must
list all of them, its subfolders included; a folder drawn as one line (``spark/``, ``cli/`` …)
must exist. Run on every test run, so the
map cannot drift from the code.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "delayed_retry"
DOC = ROOT / "docs" / "architecture.md"

_ENTRY = re.compile(r"^(?P<indent>(?:│   |    )*)(?:├──|└──) (?P<name>\S+)")


def drawn_tree(text: str) -> dict[str, set[str]]:
    """{folder ("" for the package itself, "parking/moving" for a nested one): names drawn
    in it} from the doc's package tree."""
    block = text.split("## The package", 1)[1].split("```", 2)[1]
    tree: dict[str, set[str]] = {"": set()}
    folders: list[str] = []  # the folder open at each depth
    for line in block.splitlines():
        match = _ENTRY.match(line)
        if match is None:
            continue
        depth = len(match["indent"]) // 4
        name = match["name"]
        if depth > len(folders):
            continue  # under a folder drawn as one line
        del folders[depth:]
        parent = "/".join(folders)
        tree.setdefault(parent, set()).add(name)
        if name.endswith("/"):
            folders.append(name.rstrip("/"))
    return tree


def test_the_tree_in_the_architecture_doc_matches_the_package() -> None:
    tree = drawn_tree(DOC.read_text())
    top = {p.name for p in PACKAGE.glob("*.py")} | {
        f"{p.name}/" for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()
    }
    assert tree[""] == top, (
        f"docs/architecture.md lacks {sorted(top - tree[''])} and draws "
        f"{sorted(tree[''] - top)} that do not exist"
    )
    for folder, names in tree.items():
        if not folder:
            continue
        path = PACKAGE / folder
        modules = {p.name for p in path.glob("*.py")} - {"__init__.py"}
        modules |= {f"{p.name}/" for p in path.iterdir() if (p / "__init__.py").exists()}
        assert names == modules, (
            f"docs/architecture.md draws {folder}/ with {sorted(names - modules)} that do not "
            f"exist and without {sorted(modules - names)}"
        )


def test_the_check_reads_nested_entries() -> None:
    lines = ["src/x/", "├── a.py  x", "├── sub/", "│   ├── b.py", "│   └── c.py", "└── d/"]
    text = "## The package\n```\n" + "\n".join(lines) + "\n```\n"
    assert drawn_tree(text) == {"": {"a.py", "sub/", "d/"}, "sub": {"b.py", "c.py"}}


def test_the_check_reads_nested_folders() -> None:
    lines = [
        "src/x/",
        "├── sub/",
        "│   ├── b.py",
        "│   ├── deep/",
        "│   │   ├── e.py",
        "│   │   └── f.py",
        "│   └── c.py",
        "└── d.py",
    ]
    text = "## The package\n```\n" + "\n".join(lines) + "\n```\n"
    assert drawn_tree(text) == {
        "": {"sub/", "d.py"},
        "sub": {"b.py", "deep/", "c.py"},
        "sub/deep": {"e.py", "f.py"},
    }
