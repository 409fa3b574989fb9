"""The package's import graph: no cycles, no upward imports.

Rules (issue "Architecture", item 6):
* no module under `jaxrl/` outside `jaxrl/commands/` and `jaxrl/cli.py` imports `jaxrl.commands` (library code
  never depends on the CLI), lazily or not;
* `sharding/` imports nothing from `jaxrl/` except `jaxrl.errors`, the leaf module of user-facing error classes
  (it imports nothing itself), so mesh mistakes exit 2 like every other config mistake;
* `models/`, `losses/` and `sharding/` import nothing from the trainer side (`jaxrl/` modules other than
  `jaxrl.errors`) either: they are the leaves;
* the import graph has no cycle, counting imports inside functions too (a lazy import that closes a cycle
  only hides it); a package's `__init__` re-exporting its submodules is the only allowed back edge:
  `jaxrl.losses.grpo` importing `jaxrl.losses.aggregation` is fine, importing the package `jaxrl.losses` from
  inside it is a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"jaxrl": ROOT / "jaxrl", "jaxrl.models": ROOT / "models", "jaxrl.losses": ROOT / "losses",
            "jaxrl.sharding": ROOT / "sharding"}
LEAF_ERRORS = "jaxrl.errors"


def _modules() -> dict[str, Path]:
    out = {}
    for pkg, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder).with_suffix("")
            parts = [] if rel.name == "__init__" and len(rel.parts) == 1 else list(rel.parts)
            if parts and parts[-1] == "__init__":
                parts = parts[:-1]
            name = ".".join([pkg, *parts]) if parts else pkg
            if name.startswith("jaxrl.remote_code"):  # files shipped into HF exports, not imported by jaxrl
                continue
            out[name] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    return isinstance(node.test, (ast.Name, ast.Attribute)) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(name: str, path: Path, modules: dict[str, Path]) -> tuple[set[str], set[str]]:
    """(module-level imports, all imports incl. inside functions) of one module, as known module names."""
    tree = ast.parse(path.read_text())
    is_pkg = path.name == "__init__.py"
    top: set[str] = set()
    every: set[str] = set()

    def resolve(node) -> set[str]:
        found = set()
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in modules:
                    found.add(a.name)
        else:
            base = node.module or ""
            if node.level:
                pkg = name if is_pkg else name.rsplit(".", 1)[0]
                for _ in range(node.level - 1):
                    pkg = pkg.rsplit(".", 1)[0]
                base = f"{pkg}.{base}" if base else pkg
            for a in node.names:
                sub = f"{base}.{a.name}"
                if sub in modules:
                    found.add(sub)
                elif base in modules:
                    found.add(base)
        return {m for m in found if m != name}

    def walk(body, level_top: bool):
        for node in body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                got = resolve(node)
                every.update(got)
                if level_top:
                    top.update(got)
            elif isinstance(node, ast.If) and _is_type_checking(node):
                continue
            else:
                for field in ("body", "orelse", "finalbody", "handlers"):
                    inner = getattr(node, field, None)
                    if isinstance(inner, list):
                        nested_top = level_top and not isinstance(
                            node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                        walk(inner, nested_top)

    walk(tree.body, True)
    return top, every


def _graph():
    modules = _modules()
    top, every = {}, {}
    for name, path in modules.items():
        top[name], every[name] = _imports(name, path, modules)
    return modules, top, every


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of size > 1 (Tarjan), ignoring package -> own submodule edges."""
    def allowed(a: str, b: str) -> bool:  # a package's __init__ importing its own submodule
        return b.startswith(a + ".")

    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if allowed(v, w):
                continue
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def test_no_import_cycles():
    _, top, every = _graph()
    assert _cycles(top) == []
    assert _cycles(every) == []


def test_library_code_never_imports_the_cli():
    modules, _, every = _graph()
    cli = lambda m: m == "jaxrl.cli" or m == "jaxrl.commands" or m.startswith("jaxrl.commands.")
    bad = {m: sorted(filter(cli, deps)) for m, deps in every.items() if not cli(m) and any(map(cli, deps))}
    assert bad == {}


def test_leaf_packages_import_nothing_from_the_trainer_side():
    _, _, every = _graph()
    leaves = ("jaxrl.models", "jaxrl.losses", "jaxrl.sharding")
    in_leaf = lambda m: any(m == p or m.startswith(p + ".") for p in leaves)
    bad = {m: sorted(d for d in deps if not in_leaf(d) and d != LEAF_ERRORS)
           for m, deps in every.items() if in_leaf(m)}
    assert {m: d for m, d in bad.items() if d} == {}


def test_the_checker_sees_real_edges():
    """Guards the test itself: known edges are found, so an empty result above is meaningful."""
    _, top, every = _graph()
    assert "jaxrl.losses.aggregation" in top["jaxrl.losses.grpo"]
    assert "jaxrl.rl.run" in top["jaxrl.rl.step"]
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]
    assert _cycles({"p": {"p.x"}, "p.x": set()}) == []


# The layer order (issue 26 item 5), lowest first: a module imports only from its own layer or below, lazily or
# not. Every module of the package is in one layer (`test_every_module_has_a_layer`).
LAYERS = (
    ("jaxrl.errors", "jaxrl._checks", "jaxrl._imports", "jaxrl.types"),  # types: the row model (numpy only)
    ("jaxrl.config", "jaxrl.io", "jaxrl.runtime"),
    ("jaxrl.sampling", "jaxrl.learner", "jaxrl.algorithms", "jaxrl.envs", "jaxrl.rewards", "jaxrl.multi_agent",
     "jaxrl.data", "jaxrl.reward_model"),  # the plug-ins and what they read
    ("jaxrl.rl",),
    ("jaxrl.plan",),  # compiles the run's real programs, as `jaxrl.rl.setup` builds them
    ("jaxrl.commands", "jaxrl.cli"),
)
# Known upward edges, each with its reason; the test fails when one disappears, so the list cannot go stale.
UPWARD_ALLOWED = {
    # `ExperimentConfig` resolves `algorithm.name` through the registry at load, so that a misspelt or
    # incompatible algorithm exits 2 before anything heavy (a lazy import inside `__post_init__`)
    ("jaxrl.config.experiment", "jaxrl.algorithms"),
    # likewise `algorithm.objective.name` through the objectives' registry (and its params against the record's
    # class), and the unset `agg_mode` resolved to the objective's reference aggregation
    ("jaxrl.config.algorithm", "jaxrl.learner.objectives"),
}


def _layer(module: str) -> int | None:
    for i, packages in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in packages):
            return i
    return None


def _upward_edges(every: dict[str, set[str]]) -> set[tuple[str, str]]:
    return {(m, d) for m, deps in every.items() if _layer(m) is not None
            for d in deps if _layer(d) is not None and _layer(d) > _layer(m)}


def test_the_row_model_is_a_leaf():
    """`jaxrl.types` (Rows, Rollout) imports nothing from the package: every layer can use it."""
    _, _, every = _graph()
    assert every["jaxrl.types"] == set()
    assert "jaxrl.types" in every["jaxrl.sampling.rollout_rows"] and "jaxrl.types" in every["jaxrl.envs.episodes"]


def test_every_module_has_a_layer():
    """The flat top level is folded: every module of `jaxrl/` (not the leaf packages models/, losses/,
    sharding/, which have their own rules above) belongs to one layer, so the order constrains all of it."""
    leaves = tuple(p for p in PACKAGES if p != "jaxrl")
    unplaced = sorted(m for m in _modules() if m != "jaxrl" and not m.startswith(leaves) and _layer(m) is None)
    assert unplaced == []
    assert _layer("jaxrl.learner.train_step") == _layer("jaxrl.sampling.engine") < _layer("jaxrl.rl.step")


def test_layers_import_only_downward():
    _, _, every = _graph()
    assert _upward_edges(every) == UPWARD_ALLOWED
    # the checker sees real downward edges and would see an upward one
    assert "jaxrl.runtime.step_time" in every["jaxrl.rl.step"] and _layer("jaxrl.rl.step") == 3
    assert _upward_edges({"jaxrl.runtime.metrics": {"jaxrl.rl.loop"}, "jaxrl.rl.loop": set()}) == {
        ("jaxrl.runtime.metrics", "jaxrl.rl.loop")}
