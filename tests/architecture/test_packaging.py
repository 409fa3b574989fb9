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


def test_the_train_path_with_the_builtin_tokenizer_does_not_import_torch():
    """torch is a test/interop dependency, never a runtime one: `transformers.AutoTokenizer`'s import pulls it
    in when it is installed (about 2 s in every CLI process), so `jaxrl.io.tokenizer` imports it only where a
    tokenizer directory is read; tensorboardX (which tries `import torch` at import) is imported with torch
    seen as absent (`jaxrl.runtime.trackers.summary_writer_class`)."""
    import subprocess
    import sys

    code = ("import sys; from jaxrl import cli; from jaxrl.io import tokenizer; from jaxrl.rl import loop; "
            "tokenizer.load_tokenizer('builtin'); "
            "from jaxrl.runtime.trackers import summary_writer_class; summary_writer_class(); "
            "print(sorted(m for m in ('torch', 'transformers.models.auto') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout
