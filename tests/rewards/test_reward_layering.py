"""jaxrl.rewards imports no CLI code (`jaxrl.commands`) and has no import cycle among its modules, counting
imports inside functions too; its text verifiers import no model-loading code (`jaxrl.rewards.judges`, model
weights, the sampler)."""

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


def _module(path: Path) -> str:
    rel = path.relative_to(PACKAGE).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join(["jaxrl.rewards", *parts])


def test_rewards_never_import_the_cli():
    for path in PACKAGE.rglob("*.py"):
        bad = sorted(m for m in _imports(path) if m == "jaxrl.commands" or m.startswith("jaxrl.commands."))
        assert not bad, f"{path.name} imports {bad}"


def test_no_import_cycle_inside_rewards():
    modules = {_module(p): p for p in PACKAGE.rglob("*.py") if p.stem != "__init__"}
    graph = {m: {i for i in _imports(p) if i in modules} for m, p in modules.items()}
    assert graph["jaxrl.rewards.judges.model_reward"] == {"jaxrl.rewards.imports"}  # the cycle of issue 12 is gone

    def visit(m, stack):
        assert m not in stack, "import cycle: " + " -> ".join([*stack, m])
        for n in graph[m]:
            visit(n, [*stack, m])

    for m in graph:
        visit(m, [])


# A text verifier scores a completion from its text (and the record): it needs no weights.
TEXT_VERIFIERS = ("answers", "countdown", "arithmetic_steps", "gym", "shaping")
MODEL_CODE = ("jaxrl.rewards.judges", "jaxrl.models", "jaxrl.io", "jaxrl.sampling", "jaxrl.reward_model", "flax")


def test_text_verifiers_import_no_model_code():
    for name in TEXT_VERIFIERS:
        found = _imports(PACKAGE / f"{name}.py")
        bad = sorted(m for m in found if any(m == c or m.startswith(c + ".") for c in MODEL_CODE))
        assert not bad, f"{name}.py imports {bad}"
    judges = {_module(p) for p in (PACKAGE / "judges").glob("*.py") if p.stem != "__init__"}
    assert "jaxrl.rewards.judges.model_reward" in judges and len(judges) == 5
    assert "jaxrl.io.model_io" in _imports(PACKAGE / "judges" / "model_reward.py")  # the check sees such imports
