"""Claim 2, SiameseNorm vs pre-norm vs post-norm: short LM pretraining with a learning-rate sweep.

Paper (SiameseNorm, arXiv:2602.08064 as cited in docs/DESIGN.md): post-norm diverges at high learning rates,
SiameseNorm does not, and reaches a loss no worse than pre-norm.

Corpus: the documents of the fictional-entity world `jaxrl.data.entities.build_world(0, size)`
("Name\\nName is a city in ... founded in 1412 ..."), character-tokenised with the built-in tokenizer, joined
with EOS and cut into rows of `seq_len` tokens; the last 10% of the rows are held out. Model:
`jaxrl.models.Transformer` (`norm` in pre / post / siamese, everything else equal), trained with plain optax
AdamW at a constant learning rate (no warm-up: warm-up is what usually rescues post-norm, so leaving it out
isolates the placement) and no gradient clipping. All (learning rate, seed) runs of one norm are vmapped into
one compiled step; each seed has its own initialisation and batch order.

Diverged: a non-finite training loss at any step, or a final held-out loss above the corpus's unigram entropy
(the loss of a model that predicts character frequencies only).

Run: python -m experiments.norms [--seeds 0 1 2] [--steps 300] [--lrs 1e-3 3e-3 1e-2 3e-2] [--raw DIR]
(--raw keeps each norm's sweep as DIR/<norm>.npz; --report-only rewrites the table and PNG from them)
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence

import numpy as np

from experiments import common

NORMS = ("pre", "post", "siamese")


def corpus_rows(seq_len: int, *, size: str = "tiny", seed: int = 0) -> tuple[np.ndarray, int]:
    """Token rows [R, seq_len] of the entity world's documents, and the vocabulary size of the tokenizer."""
    from jaxrl.data.entities import build_world
    from jaxrl.io.tokenizer import builtin_tokenizer

    tok = builtin_tokenizer()
    ids: list[int] = []
    for text in build_world(seed, size).contents:
        ids += tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    n = len(ids) // seq_len
    return np.asarray(ids[: n * seq_len], np.int32).reshape(n, seq_len), len(tok)


def unigram_entropy(rows_RL: np.ndarray) -> float:
    """Entropy (nats) of the token frequencies: H = -sum_v p_v log p_v."""
    _, counts = np.unique(rows_RL, return_counts=True)
    p = counts / counts.sum()
    return float(-(p * np.log(p)).sum())


def sweep(norm: str, lrs: Sequence[float], seeds: Sequence[int], *, steps: int, batch: int, seq_len: int,
          layers: int, dim: int, rows_RL: np.ndarray, vocab: int) -> dict[str, np.ndarray]:
    """Trains one model per (lr, seed) for `norm`.

    Returns:
      {"train_CT": [C, T] training loss, "eval_C": [C] final held-out loss}, C = len(lrs) * len(seeds) in
      (lr-major) order.
    """
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from jaxrl.models import Transformer, TransformerConfig

    cfg = TransformerConfig.tiny(vocab_size=max(128, vocab), hidden_size=dim, num_layers=layers, num_heads=4,
                                 num_kv_heads=4, head_dim=dim // 4, mlp_dim=3 * dim, norm=norm,
                                 max_position_embeddings=seq_len)
    configs = [(lr, seed) for lr in lrs for seed in seeds]
    graphdef, _ = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
    states = [nnx.split(Transformer(cfg, rngs=nnx.Rngs(seed)))[1] for _, seed in configs]
    params_C = jax.tree.map(lambda *x: jnp.stack(x), *states)
    tx = optax.inject_hyperparams(optax.adamw)(learning_rate=1e-3, weight_decay=0.0)
    opt_C = jax.vmap(tx.init)(params_C)
    opt_C.hyperparams["learning_rate"] = jnp.asarray([lr for lr, _ in configs], jnp.float32)

    def loss_fn(params, tokens_BL):
        logits_BLV = nnx.merge(graphdef, params)(tokens_BL[:, :-1])
        logp_BLV = jax.nn.log_softmax(logits_BLV.astype(jnp.float32))
        return -jnp.take_along_axis(logp_BLV, tokens_BL[:, 1:, None], axis=-1).mean()

    def step(params, opt, tokens_BL):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens_BL)
        updates, opt = tx.update(grads, opt, params)
        return optax.apply_updates(params, updates), opt, loss

    step_C = jax.jit(jax.vmap(step))
    eval_C = jax.jit(jax.vmap(loss_fn, in_axes=(0, None)))
    n_eval = max(1, len(rows_RL) // 10)
    train_rows, eval_rows = rows_RL[:-n_eval], jnp.asarray(rows_RL[-n_eval:][:256])
    rngs = [np.random.default_rng([seed, 11]) for _, seed in configs]
    curve = np.zeros((len(configs), steps))
    for t in range(steps):
        idx_CB = np.stack([r.integers(0, len(train_rows), batch) for r in rngs])
        params_C, opt_C, loss_C = step_C(params_C, opt_C, jnp.asarray(train_rows[idx_CB]))
        curve[:, t] = np.asarray(loss_C)
    return {"train_CT": curve, "eval_C": np.asarray(eval_C(params_C, eval_rows), np.float64)}


def diverged(train_T: np.ndarray, eval_loss: float, ceiling: float) -> bool:
    """Non-finite training loss at any step, or final held-out loss above `ceiling` (or non-finite)."""
    return bool(not np.all(np.isfinite(train_T)) or not np.isfinite(eval_loss) or eval_loss > ceiling)


def report(results: dict[str, dict], lrs: Sequence[float], seeds: Sequence[int], ceiling: float,
           out_dir: Path, *, seconds: float, setting: str) -> str:
    """Writes norms.png and norms.md; returns the markdown."""
    s = len(seeds)
    rows = []
    for lr_i, lr in enumerate(lrs):
        row = [f"{lr:g}"]
        for norm in results:
            sl = slice(lr_i * s, (lr_i + 1) * s)
            tr, ev = results[norm]["train_CT"][sl], results[norm]["eval_C"][sl]
            div = [diverged(tr[i], ev[i], ceiling) for i in range(s)]
            ok = [ev[i] for i in range(s) if not div[i]]
            loss = common.seed_stats(ok).cell() if ok else "—"
            row += [f"{sum(div)}/{s}", loss]
        rows.append(row)
    header = ["lr"] + [c for n in results for c in (f"{n}: diverged", f"{n}: held-out loss (not diverged)")]
    text = (f"{setting}. Unigram-entropy ceiling {ceiling:.3f} nats. Held-out loss: mean ± std [min, max] "
            f"over the seeds that did not diverge. Wall time {seconds / 60:.1f} min.\n\n"
            + common.markdown_table(header, rows))
    common.write_text(out_dir / "norms.md", text)
    panels = {}
    for lr_i, lr in enumerate(lrs):
        sl = slice(lr_i * s, (lr_i + 1) * s)
        panels[f"lr {lr:g}: training loss"] = {n: np.clip(results[n]["train_CT"][sl], 0, 8) for n in results}
    common.plot_curves(out_dir / "norms.png", panels, xlabel="step",
                       note="line = mean over seeds, band = min..max; losses clipped to [0, 8], NaN = gap")
    return text


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--lrs", type=float, nargs="+", default=[1e-3, 3e-3, 1e-2, 3e-2])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--world", default="tiny")
    p.add_argument("--out", type=Path, default=common.DOCS)
    p.add_argument("--raw", type=Path, default=None, help="keep each norm's finished sweep here as .npz")
    p.add_argument("--report-only", action="store_true", help="report from the sweeps kept in --raw")
    a = p.parse_args(argv)
    timer = common.Timer()
    rows_RL, vocab = corpus_rows(a.seq_len, size=a.world)
    ceiling = unigram_entropy(rows_RL)
    results = {}
    for norm in NORMS:
        path = None if a.raw is None else a.raw / f"{norm}.npz"
        if a.report_only:
            with np.load(path) as f:
                results[norm] = {k: f[k] for k in f.files}
            continue
        results[norm] = sweep(norm, a.lrs, a.seeds, steps=a.steps, batch=a.batch, seq_len=a.seq_len,
                              layers=a.layers, dim=a.dim, rows_RL=rows_RL, vocab=vocab)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            np.savez(path, **results[norm])
        print(f"{norm} done at {timer.elapsed():.0f} s", flush=True)
    setting = (f"{a.layers} layers, D={a.dim}, {a.steps} AdamW steps of {a.batch}x{a.seq_len} tokens, entity "
               f"world '{a.world}' ({len(rows_RL)} rows), seeds {a.seeds}")
    seconds = float("nan") if a.report_only else timer.elapsed()  # the training time is not in --raw
    print(report(results, a.lrs, a.seeds, ceiling, a.out, seconds=seconds, setting=setting))


if __name__ == "__main__":
    main()
