"""The rooms and which way their imports run (docs/architecture.md): `common` (the shared vocabulary) under all,
talker at the bottom above it, the text front-end and the output side above the talker, the engine (the composition
root and public API) above them, the server on top speaking to the engine (and `common`); the benchmarks may use
anything. No import runs back up, `server/` never imports torch, and no modules import each other in a circle."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ALLOWED = {
    "common": {"common"},
    "talker": {"talker", "common"},
    "frontend": {"frontend", "talker", "common"},
    "output_builder": {"output_builder", "talker", "common"},
    "engine": {"engine", "frontend", "output_builder", "talker", "common"},
    "server": {"server", "engine", "common"},
    "benchmarks": {"benchmarks", "server", "engine", "output_builder", "frontend", "talker", "common"},
}


MODULE_NAME = re.compile(rf"({'|'.join(ALLOWED)})(\.\w+)*\.?")


def modules() -> Iterator[tuple[str, Path]]:
    for room in ALLOWED:
        for path in sorted((ROOT / room).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            yield ".".join(parts[:-1] if parts[-1] == "__init__" else parts), path


def imports(path: Path, module_level_only: bool = False) -> Iterator[str]:
    """Absolute module names imported by `path`; with `module_level_only`, not those inside functions (deliberate
    lazy imports). Those under `if TYPE_CHECKING:` count: a circle the type checker follows is still a circle. So do
    `importlib.import_module(...)` and `__import__(...)`: a constant name is that module; a computed one may be any
    module the file names in a string (`"engine.engine"`, or a prefix such as `"benchmarks."`)."""
    tree = ast.parse(path.read_text())
    nodes = _top_level(tree.body) if module_level_only else ast.walk(tree)
    for node in nodes:
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Call) and _is_dynamic_import(node):
            first = node.args[0] if node.args else None
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                yield first.value
            else:
                yield from _named_modules(tree)


def _is_dynamic_import(call: ast.Call) -> bool:
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    return name in ("import_module", "__import__")


def _named_modules(tree: ast.Module) -> Iterator[str]:
    """Strings in the file that name one of the rooms' modules, or a prefix of their names."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and MODULE_NAME.fullmatch(node.value):
            yield node.value.rstrip(".")


def _top_level(body: list[ast.stmt]) -> Iterator[ast.AST]:
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if isinstance(node, (ast.If, ast.Try)):
            yield from _top_level([*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", []),
                                   *(s for h in getattr(node, "handlers", []) for s in h.body)])
        else:
            yield node


def test_no_import_runs_back_up_a_layer() -> None:
    wrong = [f"{name} imports {target}" for name, path in modules() for target in imports(path)
             if target.split(".")[0] in ALLOWED and target.split(".")[0] not in ALLOWED[name.split(".")[0]]]
    assert not wrong, "\n".join(wrong)


def test_the_server_never_imports_torch() -> None:
    wrong = [name for name, path in modules() if name.startswith("server")
             for target in imports(path) if target.split(".")[0] == "torch"]
    assert not wrong, wrong


def test_no_modules_import_each_other_in_a_circle() -> None:
    known = dict(modules())
    graph = {name: {t for t in imports(path, module_level_only=True) if t in known and t != name}
             for name, path in known.items()}
    for name in graph:  # a package's own __init__ is imported by its modules: not an edge of the cycle kind
        graph[name] = {t for t in graph[name] if not name.startswith(t + ".")}
    cycles: list[list[str]] = []
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*trail[trail.index(nxt):], nxt])
            elif nxt not in state:
                visit(nxt, [*trail, nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def test_the_reader_sees_imports_by_name(tmp_path: Path) -> None:
    """importlib and __import__ count, so a circle through them (the server loading the benchmarks, which load the
    server) is one the tests above see."""
    source = tmp_path / "m.py"
    source.write_text("import importlib\nfrom importlib import import_module\n"
                      "def f(name):\n    importlib.import_module('server.app')\n    __import__('engine.loaded')\n"
                      "    return import_module(PREFIX + name)\nPREFIX = 'benchmarks.'\n")
    assert set(imports(source)) == {"importlib", "importlib.import_module", "server.app", "engine.loaded",
                                    "benchmarks"}
    assert set(imports(source, module_level_only=True)) == {"importlib", "importlib.import_module"}
