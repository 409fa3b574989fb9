"""jaxrl.rewards.judges: the rewards that load and run a model, apart from the text verifiers of `jaxrl.rewards`.

  model_reward    a trained reward model's scalar score, or a pairwise comparison of a group's completions
  local_judge     a local generative judge (any jaxrl / HF model) behind one text-generation function
  openrs_judge    OpenRS's pairwise rubric judge (arXiv:2602.14069)
  proxy_grm       Proxy-GRM's reward from a generative reward model's rubric (arXiv:2603.16600)
  evpv_gate       EVPV-gated process-reward-model steps (a PRM scores each step; docs/rewards.md)

The text verifiers (`answers`, `countdown`, `arithmetic_steps`, `gym`, `shaping`) import none of these, nor any
model code (`tests/rewards/test_reward_layering.py`): scoring a completion by its text needs no weights.
"""
