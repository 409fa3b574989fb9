"""Proxy-GRM reward: answer accuracy, proxy accuracy given the generated rubric, and format.

"Proxy-guided rubric critique for VLM reward models" (Proxy-GRM), arXiv:2603.16600 (reference:
Qwen-Applications/Proxy-GRM, ``verl/verl/utils/reward_score/grm_reward_with_instruct.py::compute_score``).

With r_acc ∈ {+1, −1} (the generative RM named the preferred response), r_proxy ∈ {+1, −1, 0} (a frozen
proxy VLM given only the rubric picks correctly / wrongly / the HTTP call failed) and r_fmt ∈ {0, 1}::

    R = r'_acc + r'_proxy + 0.5 · r_fmt              (use_proxy; without it R = r_acc + 0.5 · r_fmt)

``use_fb`` rewrites (r_acc, r_proxy) → (r'_acc, r'_proxy):

    0: unchanged
    1: acc ∧ proxy=−1 → r'_acc = −1;  ¬acc ∧ proxy=+1 → r'_acc = −1, r'_proxy = −1
    2: acc ∧ proxy=−1 → r'_acc = −1;  r'_proxy = 0
    3..10: r'_acc from the table below (columns: proxy = +1 / proxy ≠ +1); fb 7..10 also set r'_proxy = 0
         fb 3/7:  acc → 1.5 / 0.5   ¬acc → −1  / −1
         fb 4/8:  acc → 1.5 / 0.5   ¬acc → −1.5 / −1
         fb 5/9:  acc → 1.5 / 0.5   ¬acc → −1.5 / −2
         fb 6/10: acc → 1.0 / 0.5   ¬acc → −1  / −1

Deviations from the reference:
- Array function of the three already-computed components (the answer parsing, proxy HTTP call and format
  regex are string work outside the loss library); ``use_fb`` is an argument, not an environment variable.
"""

import chex
import jax
import jax.numpy as jnp

# use_fb -> ((acc & proxy=+1, acc & proxy!=+1), (~acc & proxy=+1, ~acc & proxy!=+1)), zero_proxy
_TABLE = {
    3: (((1.5, 0.5), (-1.0, -1.0)), False),
    4: (((1.5, 0.5), (-1.5, -1.0)), False),
    5: (((1.5, 0.5), (-1.5, -2.0)), False),
    6: (((1.0, 0.5), (-1.0, -1.0)), False),
    7: (((1.5, 0.5), (-1.0, -1.0)), True),
    8: (((1.5, 0.5), (-1.5, -1.0)), True),
    9: (((1.5, 0.5), (-1.5, -2.0)), True),
    10: (((1.0, 0.5), (-1.0, -1.0)), True),
}


def couple_rewards(acc_B: jax.Array, proxy_B: jax.Array, *, use_fb: int = 0) -> tuple[jax.Array, jax.Array]:
    """(r'_acc, r'_proxy) after the ``use_fb`` coupling; inputs r_acc ∈ {±1}, r_proxy ∈ {±1, 0}."""
    if use_fb not in range(11):
        raise ValueError(f"proxy_grm use_fb={use_fb}; allowed: 0..10")
    chex.assert_equal_shape([acc_B, proxy_B])
    acc_B, proxy_B = acc_B.astype(jnp.float32), proxy_B.astype(jnp.float32)
    ok_B, proxy_ok_B, proxy_bad_B = acc_B == 1, proxy_B == 1, proxy_B == -1
    if use_fb == 0:
        return acc_B, proxy_B
    if use_fb == 1:
        flip_B = ~ok_B & proxy_ok_B
        acc_B = jnp.where((ok_B & proxy_bad_B) | flip_B, -1.0, acc_B)
        return acc_B, jnp.where(flip_B, -1.0, proxy_B)
    if use_fb == 2:
        return jnp.where(ok_B & proxy_bad_B, -1.0, acc_B), jnp.zeros_like(proxy_B)
    ((a_pp, a_pn), (n_pp, n_pn)), zero_proxy = _TABLE[use_fb]
    acc_B = jnp.where(ok_B, jnp.where(proxy_ok_B, a_pp, a_pn), jnp.where(proxy_ok_B, n_pp, n_pn))
    return acc_B, jnp.zeros_like(proxy_B) if zero_proxy else proxy_B


def proxy_grm_reward(
    acc_B: jax.Array,
    proxy_B: jax.Array,
    fmt_B: jax.Array,
    *,
    use_fb: int = 0,
    use_proxy: bool = True,
    format_weight: float = 0.5,
) -> jax.Array:
    """R = r'_acc + r'_proxy + format_weight · r_fmt (see the module docstring); float32 ``[B]`` or scalar."""
    acc_B, proxy_B, fmt_B = jnp.asarray(acc_B), jnp.asarray(proxy_B), jnp.asarray(fmt_B)
    chex.assert_equal_shape([acc_B, proxy_B, fmt_B])
    fmt_B = format_weight * fmt_B.astype(jnp.float32)
    if not use_proxy:
        return acc_B.astype(jnp.float32) + fmt_B
    acc_B, proxy_B = couple_rewards(acc_B, proxy_B, use_fb=use_fb)
    return acc_B + proxy_B + fmt_B
