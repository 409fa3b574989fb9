"""jaxrl.rewards imports no CLI code (`jaxrl.commands`) and has no import cycle among its modules, counting
imports inside functions too."""

import ast
from pathlib import Path

import jaxrl.rewards

PACKAGE = Path(jaxrl.rewards.__file__).parent


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at top level or inside a function."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def test_rewards_never_import_the_cli():
    for path in PACKAGE.glob("*.py"):
        bad = sorted(m for m in _imports(path) if m == "jaxrl.commands" or m.startswith("jaxrl.commands."))
        assert not bad, f"{path.name} imports {bad}"


def test_no_import_cycle_inside_rewards():
    modules = {f"jaxrl.rewards.{p.stem}": p for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    graph = {m: {i for i in _imports(p) if i in modules} for m, p in modules.items()}
    assert graph["jaxrl.rewards.model_reward"] == {"jaxrl.rewards.imports"}  # the cycle of issue 12 is gone

    def visit(m, stack):
        assert m not in stack, "import cycle: " + " -> ".join([*stack, m])
        for n in graph[m]:
            visit(n, [*stack, m])

    for m in graph:
        visit(m, [])
