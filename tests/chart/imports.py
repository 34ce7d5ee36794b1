"""Which third-party distributions a component's code imports: the import closure of its command module,
followed through `flotilla.*` imports (function-level ones included), read from the source with `ast`."""

from __future__ import annotations

import ast
import sys
from importlib.metadata import packages_distributions
from pathlib import Path


def _module_file(src: Path, module: str) -> Path | None:
    base = src.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def _imports(path: Path, module: str) -> set[str]:
    names: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{node.module}" if node.module else parent
            else:
                base = node.module or ""
            names.add(base)
            names.update(f"{base}.{a.name}" for a in node.names)  # `from pkg import submodule`
    return names


def third_party_distributions(src: Path, entry: str) -> set[str]:
    """Distribution names (lower case) imported by `entry` and every flotilla module it reaches."""
    seen: set[str] = set()
    todo = [entry]
    top_level: set[str] = set()
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        path = _module_file(src, module)
        if path is None:
            continue
        parts = module.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))  # parent packages run first
        for name in _imports(path, module):
            if name.split(".")[0] == "flotilla":
                todo.append(name)
            else:
                top_level.add(name.split(".")[0])
    dists = packages_distributions()
    found = set()
    for name in top_level - set(sys.stdlib_module_names) - {"__future__"}:
        found.update(d.lower() for d in dists.get(name, [name]))
    return found
