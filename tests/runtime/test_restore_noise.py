"""A corrupt newest checkpoint step falls back to the previous one with ONE warning line on stderr (orbax's
failed restore used to leave one "Future exception was never retrieved" + tensorstore spec per array and
"Event loop is closed" tracebacks: 16-45 KB for a small model)."""

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import logging, sys
    import numpy as np
    import jax.numpy as jnp
    from jaxrl.io.checkpoint import Checkpointer
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s", force=True)
    if len(sys.argv) > 3:  # the old behaviour, to see the noise this test guards against
        import jaxrl.io.checkpoint as c; c.quiet_restore_noise = lambda: None
    params = {f"w{i}": jnp.full((16, 8), float(i)) for i in range(12)}
    opt = {"m": jnp.zeros((3,))}
    if sys.argv[2] == "save":
        ck = Checkpointer(sys.argv[1], every=1, keep=3, async_save=False)
        for step in (1, 2):
            ck.save(step, {k: v + step for k, v in params.items()}, opt, {"data_state": None})
        ck.close()
    else:
        ck = Checkpointer(sys.argv[1], every=1, keep=3, async_save=False)
        r = ck.restore_latest(params, opt)
        ck.close()
        assert r.step == 1 and float(np.asarray(r.params["w3"])[0, 0]) == 4.0
        print("restored", r.step)
""")


def _python(*args):
    return subprocess.run([sys.executable, "-c", SCRIPT, *args], capture_output=True, text=True, timeout=300,
                          env={"JAX_PLATFORMS": "cpu", "XLA_FLAGS": "", "PATH": "/usr/bin:/bin"})


def test_corrupt_step_fallback_is_one_warning_line(tmp_path):
    ckpt = tmp_path / "checkpoints"
    saved = _python(str(ckpt), "save")
    assert saved.returncode == 0, saved.stderr[-2000:]
    manifests = list((ckpt / "2" / "params").rglob("manifest.ocdbt"))
    assert manifests
    for m in manifests:  # truncated manifests: every array read fails
        m.write_bytes(m.read_bytes()[:5])
    out = _python(str(ckpt), "restore")
    assert out.returncode == 0 and out.stdout.strip() == "restored 1", out.stderr[-2000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, f"{len(out.stderr)} bytes of stderr: {out.stderr[:1500]}"
    assert lines[0].startswith(f"WARNING jaxrl.io.checkpoint: checkpoint step 2 in {ckpt} cannot be restored (")
    assert lines[0].endswith("; using step 1 instead")
    assert [p.name.split("-")[0] for p in ckpt.iterdir() if p.name.startswith("corrupt-")] == ["corrupt"]


def test_noise_filters_drop_only_the_leftover_messages(caplog, capsys, monkeypatch):
    """Deterministic half of the above: the leftovers appear only when garbage collection and tensorstore's
    threads happen to run before exit, so the filters are checked on messages made here."""
    import asyncio
    import gc
    import logging
    import warnings

    import jaxrl.io.orbax_noise
    from jaxrl.io.orbax_noise import quiet_restore_noise

    monkeypatch.setattr(jaxrl.io.orbax_noise, "_noise_filters_installed", False)  # pytest resets warning filters

    def unretrieved_future():
        loop = asyncio.new_event_loop()
        fut = loop.create_future()
        fut.set_exception(ValueError("DATA_LOSS: tensorstore spec ..."))
        del fut
        gc.collect()
        loop.close()

    def unretrieved_task():  # orbax's async_deserialize tasks end this way (seen in CI under load)
        async def fail():
            raise ValueError("DATA_LOSS: tensorstore spec ...")

        loop = asyncio.new_event_loop()
        task = loop.create_task(fail())
        loop.run_until_complete(asyncio.wait([task]))
        del task
        gc.collect()
        loop.close()

    async def _get_array_metadatas():  # orbax's metadata coroutine, left unawaited by a failed restore
        return None

    quiet_restore_noise()
    with warnings.catch_warnings(record=True) as shown:
        unawaited = _get_array_metadatas()
        del unawaited
        gc.collect()
        warnings.warn("some other runtime warning", RuntimeWarning)
    assert [str(w.message) for w in shown] == ["some other runtime warning"]
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        unretrieved_future()
        unretrieved_task()
        logging.getLogger("asyncio").error("some other asyncio error")
    assert [r.getMessage() for r in caplog.records] == ["some other asyncio error"]
    capsys.readouterr()
    sys.excepthook(RuntimeError, RuntimeError("Event loop is closed"), None)
    assert capsys.readouterr().err == ""
    sys.excepthook(RuntimeError, RuntimeError("something else"), None)
    assert "RuntimeError: something else" in capsys.readouterr().err


def test_noise_logged_while_a_restore_is_failing_is_dropped(tmp_path, caplog, monkeypatch):
    """The leftovers can be printed from orbax's threads inside the restore, before it raises (CI under
    load): the filters are on from the first attempt. Other asyncio errors still show."""
    import logging

    import jax.numpy as jnp

    from jaxrl.io.checkpoint import Checkpointer

    params, opt = {"w": jnp.ones((4, 2))}, {"m": jnp.zeros((3,))}
    ck = Checkpointer(str(tmp_path / "ckpt"), every=1, keep=3, async_save=False)
    for step in (1, 2):
        ck.save(step, {"w": params["w"] + step}, opt, {"data_state": None})
    asyncio_log = logging.getLogger("asyncio")
    real_restore = Checkpointer._restore

    def restore_failing_at_2(self, step, params_like, opt_like):
        if step == 2:
            asyncio_log.error("Task exception was never retrieved\nfuture: <Task finished ...>")
            asyncio_log.error("some other asyncio error")
            raise ValueError("DATA_LOSS: truncated manifest")
        return real_restore(self, step, params_like, opt_like)

    monkeypatch.setattr(Checkpointer, "_restore", restore_failing_at_2)
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        restored = ck.restore_latest(params, opt)
    ck.close()
    assert restored.step == 1 and float(restored.params["w"][0, 0]) == 2.0
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == ["some other asyncio error"]
