"""The suite's two outputs from the sections' own numbers: `summarize` (results.json, with every ratio derived
from two numbers of the same run) and `markdown` (results.md, one table)."""

from __future__ import annotations

import dataclasses
import math

from sections import GIB, TRAIN_CONFIG, Settings

_DECODE_SIDES = (("jaxrl", "decode_jaxrl"), ("hf", "decode_hf"), ("hf_static", "decode_hf_static"))


def summarize(raw: dict[str, dict], mode: str, s: Settings) -> dict:
    """{task: section JSON} -> the results JSON, grouped by measurement; only sections that finished count."""
    ok = {task: r for task, r in raw.items() if r.get("status") == "ok"}
    dev = ok.get("device", {})
    decode, update, memory = {}, {}, []
    for shape in s.shapes:
        d = {side: ok[f"{name}:{shape}"] for side, name in _DECODE_SIDES if f"{name}:{shape}" in ok}
        jx, hf = d.get("jaxrl"), d.get("hf")
        if jx and hf:
            d["jaxrl_vs_hf"] = jx["decode_tokens_per_s"] / hf["decode_tokens_per_s"]
            d["jaxrl_vs_hf_total"] = jx["tokens_per_s"] / hf["tokens_per_s"]
        if jx and dev:  # the least a decode step reads, at the copy bandwidth measured in this run
            step_bytes = jx["weight_bytes"] + jx["kv_bytes"]
            roof_s = step_bytes / (dev["copy_gb_s"] * 1e9)
            d["roofline"] = dict(bytes_per_step=step_bytes, bandwidth_gb_s=dev["copy_gb_s"], step_s=roof_s,
                                 jaxrl_fraction=roof_s / jx["step_s"])
            if hf:
                d["roofline"]["hf_fraction"] = roof_s / hf["step_s"]
        if d:
            decode[shape] = d
        if f"update:{shape}" in ok:
            u = update[shape] = dict(ok[f"update:{shape}"])
            if dev:
                u["mfu_vs_measured_matmul"] = u["model_tflops"] / dev["matmul_tflops"]
                if dev.get("spec_bf16_tflops"):
                    u["mfu_vs_spec"] = u["model_tflops"] / dev["spec_bf16_tflops"]
            memory.append(_memory_row(f"update:{shape}", u))
    if ok.get("train_cli", {}).get("plan_peak_bytes"):  # None: no peak row found in `jaxrl plan`'s output
        memory.append(_memory_row("train_cli", ok["train_cli"]))
    sections = {task: {k: r[k] for k in ("status", "wall_s", "error") if k in r} for task, r in raw.items()}
    return dict(mode=mode, settings=dataclasses.asdict(s), device=dev, decode=decode, update=update,
                train_cli=ok.get("train_cli", {}), memory=memory, sections=sections)


def _memory_row(what: str, r: dict) -> dict:
    return dict(what=what, plan_peak_bytes=r["plan_peak_bytes"], measured_peak_bytes=r["peak_bytes"],
                measured_source=r["peak_source"], measured_over_plan=r["peak_bytes"] / r["plan_peak_bytes"])


def _n(x, unit: str = "", scale: float = 1.0) -> str:
    """x·scale to 3 significant digits with its unit; n/a for a missing or non-finite number."""
    if x is None or not math.isfinite(x):
        return "n/a"
    return f"{x * scale:,.3g}{unit}"


def _step_times(st: dict) -> str:
    """'1.2 s: generation 0.5 s, update 0.6 s' from one step's timings (this tree's keys or earlier ones)."""
    pick = lambda *keys: next((st[k] for k in keys if k in st), None)  # noqa: E731
    total = pick("time/step") or sum(v for k, v in st.items() if k.startswith("timing/"))
    gen, upd = pick("time/generation", "timing/rollout_s"), pick("time/update", "timing/update_s")
    return f"{_n(total, ' s')}: generation {_n(gen, ' s')}, update {_n(upd, ' s')}"


def _rows(res: dict) -> list[tuple[str, ...]]:
    """(measurement, shape, jaxrl, reference, jaxrl / reference) of every measurement that finished."""
    s, dev, rows = res["settings"], res["device"], []
    spec, peak = dev.get("spec_bf16_tflops"), dev.get("matmul_tflops")
    for shape, d in res["decode"].items():
        jx, hf, roof = d.get("jaxrl", {}), d.get("hf", {}), d.get("roofline", {})
        rows += [
            (f"decode tokens/s, B={s['decode_batch']}, T={s['new_tokens']}, bf16", shape,
             _n(jx.get("decode_tokens_per_s")), f"transformers generate {_n(hf.get('decode_tokens_per_s'))}",
             _n(d.get("jaxrl_vs_hf"), "x")),
            ("decode step vs HBM roofline", shape, _n(jx.get("step_s"), " ms", 1e3),
             f"roofline {_n(roof.get('step_s'), ' ms', 1e3)} ({_n(roof.get('bytes_per_step'), ' GB', 1e-9)})",
             f"{_n(roof.get('jaxrl_fraction'), '%', 100)} "
             f"(transformers {_n(roof.get('hf_fraction'), '%', 100)})"),
            ("TTFT; total time of T tokens", shape,
             f"{_n(jx.get('ttft_s'), ' ms', 1e3)}; {_n(jx.get('total_s'), ' s')}",
             f"{_n(hf.get('ttft_s'), ' ms', 1e3)}; {_n(hf.get('total_s'), ' s')}",
             f"{_n(d.get('jaxrl_vs_hf_total'), 'x')} tokens/s")]
        if "hf_static" in d:
            static = d["hf_static"]["tokens_per_s"]
            rows.append(("tokens/s vs transformers with a static cache", shape, _n(jx.get("tokens_per_s")),
                         _n(static), _n(jx.get("tokens_per_s", math.nan) / static, "x")))
    for shape, u in res["update"].items():
        rows.append((f"GRPO update, {u['rows']} x ({u['prompt']} + {u['completion']}) tokens, bf16 over "
                     f"fp32, grad_accum {u['grad_accum']}", shape,
                     f"{_n(u['model_tflops'], ' TFLOP/s')}, {_n(u['step_s'], ' s')}/step",
                     f"peak: spec {_n(spec)}, measured matmul {_n(peak)} TFLOP/s",
                     f"MFU {_n(u.get('mfu_vs_spec'), '%', 100)} / "
                     f"{_n(u.get('mfu_vs_measured_matmul'), '%', 100)}"))
    steps = res["train_cli"].get("steps", [])
    if steps:
        sets = dict(o.split("=", 1) for o in res["train_cli"]["overrides"])
        rows.append((f"`jaxrl train` {TRAIN_CONFIG.name}, step {len(steps)}",
                     f"{sets.get('model.preset', 'smollm2_135m')} preset, random init",
                     _step_times(steps[-1]), f"step 1 (compiles): {_step_times(steps[0])}", ""))
    for m in res["memory"]:
        rows.append((f"peak memory ({m['measured_source']}) vs `jaxrl plan`", m["what"],
                     _n(m["measured_peak_bytes"], " GiB", 1 / GIB),
                     f"plan {_n(m['plan_peak_bytes'], ' GiB', 1 / GIB)}",
                     _n(m["measured_over_plan"], "x")))
    return rows


def markdown(res: dict) -> str:
    dev = res["device"]
    lines = [f"# jaxrl accelerator suite: {dev.get('device_kind', '?')} ({res['mode']})", "",
             f"{res['date']}, jax {dev.get('jax_version', '?')}, {res['wall_s']:.0f} s in all. Measured "
             f"ceilings: copy {_n(dev.get('copy_gb_s'), ' GB/s')} (read + write), read stream "
             f"{_n(dev.get('read_gb_s'), ' GB/s')}, bf16 matmul {_n(dev.get('matmul_tflops'), ' TFLOP/s')} "
             f"(spec {_n(dev.get('spec_bf16_tflops'))}).",
             "", "| measurement | shape | jaxrl | reference | jaxrl / reference |", "|---|---|---|---|---|"]
    lines += ["| " + " | ".join(row) + " |" for row in _rows(res)]
    lines += ["", "Sections: " + ", ".join(f"{t} {r['status']} ({r.get('wall_s', 0):.0f} s)"
                                           for t, r in res["sections"].items())]
    lines += [f"* {t}: {r['error']}" for t, r in res["sections"].items() if r["status"] != "ok"]
    return "\n".join(lines) + "\n"
