"""Every folder of the installed package is in pyproject's `packages` (issue 31 item 5): setuptools warned, on
every install, that `jaxrl.remote_code` was not (its modeling files were shipped only as package data), and
`jaxrl.rl` was missing outright, so a wheel install would have lacked the RL plug-ins."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_folder_with_python_files_is_a_declared_package():
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    declared = set(tool["packages"])
    found = set()
    for package, folder in tool["package-dir"].items():
        root = ROOT / folder
        for d in [root, *(p for p in root.rglob("*") if p.is_dir())]:
            if "__pycache__" in d.parts or not any(d.glob("*.py")):
                continue
            name = ".".join([package, *d.relative_to(root).parts])
            if any(name.startswith(f"{p}.") or name == p for p in tool["package-dir"] if p != package
                   and p.startswith(f"{package}.")):
                continue  # mapped from its own folder (jaxrl.models from models/)
            found.add(name)
    assert found <= declared, f"folders with Python files that pyproject's packages lacks: {found - declared}"
    assert {"jaxrl.rl", "jaxrl.remote_code"} <= found
