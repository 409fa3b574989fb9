"""`make test`'s driver: the whole suite in two phases, then one report of where the time went.

Phase 1 runs every test not marked `serial` on two pytest-xdist workers (`--dist loadfile`: a file's tests,
and its module fixtures, stay on one worker). Phase 2 runs the `serial` tests alone: those whose assertions
read the machine's load (page-fault counts, a lost peer noticed within a heartbeat, wall-clock bounds) and
those that already keep both cores busy (2-process `jax.distributed` groups). Both phases share one
persistent XLA compilation cache (`JAX_COMPILATION_CACHE_DIR`, set by the Makefile), so a program that two
tests (or two CLI subprocesses) compile is compiled once. Nothing is skipped: each test runs in exactly one
phase (`tests/conftest.py` deselects by `JAXRL_TEST_PHASE`).

Usage: python tests/suite.py [PYTEST_ARGS...]; env JAXRL_TEST_WORKERS (default 2; 0 runs phase 1 in-process).
`python tests/suite.py --record-durations` rewrites tests/durations.json (seconds per file, which orders the
parallel phase longest first) from the last run's reports.
Exit code: pytest's; 5 only when neither phase ran a test.
"""

import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REPORTS = REPO / ".cache" / "test-reports"
SLOWEST = 30


def run_phase(phase: str, args: list[str]) -> tuple[int, float]:
    """Runs one phase; returns (pytest exit code, wall seconds)."""
    workers = int(os.environ.get("JAXRL_TEST_WORKERS", "2"))
    # --no-loadscope-reorder: keep conftest's longest-file-first order (xdist would sort files by test count).
    xdist = ["-p", "no:xdist"]
    if phase == "parallel" and workers > 0:
        xdist = ["-n", str(workers), "--dist", "loadfile", "--no-loadscope-reorder"]
    argv = [sys.executable, "-m", "pytest", "-q", *xdist, f"--junitxml={REPORTS / f'{phase}.xml'}", *args]
    print(f"== tests/suite.py: phase {phase}: {' '.join(argv[3:])}", flush=True)
    start = time.monotonic()
    rc = subprocess.call(argv, cwd=REPO, env=dict(os.environ, JAXRL_TEST_PHASE=phase))
    return rc, time.monotonic() - start


def test_id(classname: str, name: str) -> str:
    """`tests/x/test_y.py::Class::test` from JUnit's dotted `tests.x.test_y.Class` and the test's name."""
    parts = classname.split(".")
    for cut in range(len(parts), 0, -1):
        path = "/".join(parts[:cut]) + ".py"
        if (REPO / path).is_file():
            return "::".join([path, *parts[cut:], name])
    return f"{classname}::{name}"


def read_cases(path: Path) -> list[tuple[float, str, str]]:
    """(seconds, test id, outcome) of every test case in a JUnit XML report."""
    if not path.is_file():
        return []
    cases = []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), "passed")
        name = test_id(case.get("classname", ""), case.get("name", ""))
        cases.append((float(case.get("time", 0.0)), name, outcome))
    return cases


def report(walls: dict[str, float]) -> None:
    """Prints the slowest tests of both phases and the totals."""
    cases = {phase: read_cases(REPORTS / f"{phase}.xml") for phase in walls}
    every = sorted(((t, n, o, p) for p, cs in cases.items() for t, n, o in cs), reverse=True)
    print(f"\n== tests/suite.py: the {SLOWEST} slowest tests (seconds, phase)")
    for seconds, name, outcome, phase in every[:SLOWEST]:
        print(f"{seconds:8.1f}  {phase:8s}  {name}" + ("" if outcome == "passed" else f"  [{outcome}]"))
    for phase, wall in walls.items():
        busy = sum(t for t, _, _ in cases[phase])
        print(f"== phase {phase}: {len(cases[phase])} tests, {wall / 60:.1f} min wall, "
              f"{busy / 60:.1f} min in tests")
    print(f"== tests/suite.py: total {sum(walls.values()) / 60:.1f} min wall")


def record_durations() -> int:
    """tests/durations.json from the last run's JUnit reports: seconds per test file, longest first."""
    seconds: dict[str, float] = {}
    for phase in ("parallel", "serial"):
        for t, name, _ in read_cases(REPORTS / f"{phase}.xml"):
            path = name.split("::")[0]
            seconds[path] = seconds.get(path, 0.0) + t
    if not seconds:
        print("tests/suite.py: no reports in .cache/test-reports; run the suite first", file=sys.stderr)
        return 2
    ordered = {k: round(v, 1) for k, v in sorted(seconds.items(), key=lambda kv: -kv[1])}
    (REPO / "tests" / "durations.json").write_text(json.dumps(ordered, indent=0) + "\n")
    return 0


def main(args: list[str]) -> int:
    if args == ["--record-durations"]:
        return record_durations()
    REPORTS.mkdir(parents=True, exist_ok=True)
    for stale in REPORTS.glob("*.xml"):
        stale.unlink()
    rcs, walls = {}, {}
    for phase in ("parallel", "serial"):
        rcs[phase], walls[phase] = run_phase(phase, args)
    report(walls)
    codes = [rc for rc in rcs.values() if rc != 5]  # 5: this phase selected no test
    return max(codes) if codes else 5


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
