"""A user multi-agent system in one file (docs/DESIGN.md, "Adding a plug-in"): draft, then revise.

Name it in a config, no registration needed:

    multi_agent:
      system: docs/multi_agent_user_system.py:DraftRevise     # "path/file.py:Class" or "package.module:Class"
      params: {train_roles: [reviser]}

Two roles played by the one policy: the drafter answers the record's question once; the reviser sees the
question and the draft and answers G times. The run's rewards score the reviser's answers (any dataset
field, e.g. `answer` of `data.source: arithmetic`, reaches them), and the trained roles' rows go into one
rollout, one role segment each (`jaxrl.multi_agent.joint_rollout`), so the RL step normalises within a role
and never across. The drafter's rows, when trained, get the reward of their best revision. There are no
warm-start demonstrations here (`demonstration_env` refuses): run it with `sft_warmup.steps: 0`, or add a
`demonstration_env` as `jaxrl.multi_agent.march.MarchDemoEnv` does.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import jax
import numpy as np

from jaxrl.envs import prompt_ids
from jaxrl.multi_agent import joint_rollout, role_metrics, role_rows
from jaxrl.rewards import score_rows
from jaxrl.sampling import generate_from_state

ROLE_IDS = {"drafter": 0, "reviser": 1}


class DraftRevise:
    """The `jaxrl.rl.collect.System` protocol: what setup reads, and `collect`."""

    name = "draft_revise"
    max_turns = 1
    max_total_tokens = None
    adapter_roles = tuple(ROLE_IDS)
    adapter_aliases: dict[str, str] = {}
    update_phases: tuple[int, ...] = ()  # one joint update of the trained roles

    def __init__(self, tokenizer, train_roles: Sequence[str] = ("reviser",)):
        unknown = sorted(set(train_roles) - set(ROLE_IDS))
        if unknown or not train_roles:
            raise ValueError(f"train_roles={list(train_roles)}: allowed roles are {list(ROLE_IDS)}")
        self.tokenizer, self.train_roles = tokenizer, tuple(train_roles)

    def group_sizes(self, group_size: int) -> dict[str, int]:
        return {role: (1 if role == "drafter" else int(group_size)) for role in self.train_roles}

    def check_records(self, records, split: str) -> None:
        del records, split  # any question will do

    def demonstration_env(self, tokenizer):
        raise ValueError("DraftRevise has no warm-start demonstrations: set sft_warmup.steps: 0")

    def state_json(self) -> Any:
        return None

    def load_state(self, data) -> None:
        del data

    def _generate(self, role: str, graphdef, params, texts: list[str], spec, samples: int, key):
        ids = [prompt_ids(self.tokenizer, [{"role": "user", "content": t}]) for t in texts]
        spec = dataclasses.replace(spec, num_samples=samples)
        tok = self.tokenizer
        gen = generate_from_state(graphdef, params, ids, spec, eos_ids=(int(tok.eos_token_id),), seed=key,
                                  pad_id=int(tok.pad_token_id))
        return role_rows(role, ids, gen, samples, tok, spec.prompt_buckets)

    def collect(self, graphdef, params, records: Sequence[Mapping[str, Any]], rewards, spec, key, *,
                train: bool = True):
        g = spec.num_samples
        k_draft, k_revise = jax.random.split(key)
        questions = [str(r["prompt"]) for r in records]
        drafts = self._generate("drafter", graphdef, params, questions, spec, 1, k_draft)
        revise = [f"{q}\nA draft answer: {d.strip()}\nYour answer:" for q, d in zip(questions, drafts.completions)]
        revised = self._generate("reviser", graphdef, params, revise, spec, g, k_revise)
        rep = [dict(r) for r in records for _ in range(g)]
        r_BR, info = score_rows(rewards, [revise[i // g] for i in range(len(rep))], revised.completions, rep,
                                revised.lengths_B)
        parts, sizes = [], []
        if train and "drafter" in self.train_roles:  # a draft is as good as its best revision
            best = np.nanmax(r_BR.reshape(len(records), g, -1), axis=1)
            parts.append((drafts, [dict(r) for r in records], best))
            sizes.append(1)
        if not train or "reviser" in self.train_roles:
            parts.append((revised, rep, r_BR))
            sizes.append(g)
        total = (np.nan_to_num(r_BR) * np.asarray(info.weights_R)[None]).sum(1)
        metrics = {**info.metrics, **role_metrics("reviser", total, revised.lengths_B),
                   **role_metrics("drafter", np.full((len(records),), np.nan), drafts.lengths_B)}
        return joint_rollout(parts, role_ids=ROLE_IDS, reward_names=tuple(info.names),
                             weights_R=np.asarray(info.weights_R, np.float32), pad_id=int(self.tokenizer.pad_token_id),
                             metrics=metrics, score_infos=(info,), group_sizes=sizes)
