"""The kit's import graph, parsed from every module (function-level and ``TYPE_CHECKING`` imports included): no
cycle between its subpackages. ``lint-imports`` checks the layer order; this checks what it cannot see."""

from __future__ import annotations

import ast
import configparser
import importlib
import importlib.util
import sys
import textwrap
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def _load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("import_graph", ROOT / "scripts" / "import_graph.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["import_graph"] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


graph_tool = _load_script()


def test_no_cycle_between_subpackages() -> None:
    graph = graph_tool.build_graph(ROOT)
    assert graph_tool.mutual_pairs(graph) == []
    assert graph_tool.subpackage_cycles(graph) == []


def test_every_import_statement_is_an_edge(tmp_path: Path) -> None:
    """A module-level, a function-level, a ``TYPE_CHECKING``, a relative and a ``from package import module``
    import each make one edge, marked as such; imports of other packages make none."""
    package = tmp_path / "trtllm_kit"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "leaf.py").write_text("")
    (package / "errors.py").write_text("")
    (package / "layout.py").write_text("")
    (package / "top.py").write_text(textwrap.dedent("""
        from typing import TYPE_CHECKING
        import json
        from trtllm_kit.errors import KitError
        from .sub import leaf
        if TYPE_CHECKING:
            from trtllm_kit import layout
        def late():
            import trtllm_kit.sub
            return 1
        x: dict[str, Any] = {}
        """))
    graph = graph_tool.build_graph(tmp_path)
    edges = {(e.target, e.lazy, e.type_only) for e in graph.edges if e.source == "trtllm_kit.top"}
    assert edges == {("trtllm_kit.errors", False, False), ("trtllm_kit.sub.leaf", False, False),
                     ("trtllm_kit.layout", False, True), ("trtllm_kit.sub", True, False)}
    assert graph.any_dicts == 1
    assert graph.lines["trtllm_kit.top"] == len((package / "top.py").read_text().splitlines())


def test_a_cycle_is_found(tmp_path: Path) -> None:
    package = tmp_path / "trtllm_kit"
    for name in ("a", "b"):
        (package / name).mkdir(parents=True)
        (package / name / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "a" / "x.py").write_text("from trtllm_kit.b import y\n")
    (package / "b" / "y.py").write_text("def f():\n    from trtllm_kit.a import x\n")
    graph = graph_tool.build_graph(tmp_path)
    assert graph_tool.subpackage_cycles(graph) == [["a", "b"]]
    assert graph_tool.module_cycles(graph) == [["trtllm_kit.a.x", "trtllm_kit.b.y"]]


def test_the_graph_covers_every_module() -> None:
    graph = graph_tool.build_graph(ROOT)
    on_disk = {graph_tool.module_name(p, ROOT) for p in (ROOT / "trtllm_kit").rglob("*.py")}
    assert set(graph.lines) == on_disk


def test_every_subpackage_is_on_a_floor() -> None:
    """The layers contract in setup.cfg names every module and subpackage of the kit, so none escapes it."""
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    layers = config["importlinter:contract:layers"]["layers"]
    named = {name.strip().removeprefix("trtllm_kit.") for line in layers.splitlines() for name in line.split("|")}
    graph = graph_tool.build_graph(ROOT)
    assert {graph_tool.subpackage(m) for m in graph.lines} - {"trtllm_kit"} == named - {""}


def _own_imports(path: Path) -> set[str]:
    """Every ``trtllm_kit`` module that ``path`` names in an absolute import, function-level ones included, and
    every ``module:name`` it takes from one of them."""
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module)
            names.update(f"{node.module}:{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {name for name in names if name == "trtllm_kit" or name.startswith(("trtllm_kit.", "trtllm_kit:"))}


def _resolves(name: str) -> bool:
    """Whether an imported module, or a name taken from one (``module:name``: an attribute or a submodule), exists."""
    module, _, attribute = name.partition(":")
    if importlib.util.find_spec(module) is None:
        return False
    if not attribute:
        return True
    parent = importlib.import_module(module)
    return hasattr(parent, attribute) or \
        (hasattr(parent, "__path__") and importlib.util.find_spec(f"{module}.{attribute}") is not None)


def test_every_own_import_names_a_module_that_exists() -> None:
    """A moved module leaves no import of its old place behind: in the package, its tests, benchmarks and
    scripts (mypy, told to ignore missing imports for the untyped third-party packages, does not see this)."""
    files = [p for folder in ("trtllm_kit", "tests", "benchmarks", "scripts") for p in (ROOT / folder).rglob("*.py")]
    missing = sorted({f"{path.relative_to(ROOT)}: {name}" for path in files for name in _own_imports(path)
                      if path.name != "test_import_graph.py" and not _resolves(name)})
    assert missing == []
