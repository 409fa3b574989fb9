"""pytest plugin (`-p account_plugin`): writes the process's compile record at session end, for xdist workers,
which exit without running `atexit` (tests/compile_report/sitecustomize.py)."""

import sitecustomize


def pytest_sessionfinish(session, exitstatus):
    if hasattr(sitecustomize, "write_record"):
        sitecustomize.write_record()
