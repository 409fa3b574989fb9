"""SSP (Search Self-Play) skeleton as a collect stage: Proposer (search -> question) -> RAG check -> Solver.

"Search Self-Play", arXiv:2510.18821 (reference: Alibaba-Quark/SSP, `ssp_ray_trainer.py::fit`); the loop of
spec/multi-agent.md §2 on the fictional-entity world (`jaxrl.data.entities`, BM25 search of
`jaxrl.envs.SearchEnv`). Per answer record (a* with k = its hop count), one step:

    Proposer  n_p search episodes ending in <question>q</question>               (multi-turn, `ProposerEnv`)
    validity  first <question> tag; 10 to 1000 characters and >= min_words words; a* not in q; non-empty
              results; >= min_searches distinct search terms (JSON lists expanded); (`grounded`, not the
              reference's: q names a title of its results) (`jaxrl.multi_agent.ssp_text`); RAG check: a
              verifier answers q from this episode's results mixed with up to 4 other episodes'
              results, and must match a* (spec §2.5; `rag_verifier`, `jaxrl.multi_agent.ssp_verify`:
              the policy greedily, on its own prompt or laid out as the Solver reading a search result,
              `rag_layout`; a rule over the world; or a separate frozen judge)
    Solver    G search episodes per problem (an invalid slot gets a dummy problem, spec §2.6)
    rewards   R_s = losses.research.ssp.solver_reward(exact match, answer-tag counts)
              R_p = proposer_reward(R_s of its problem, "1-acc", valid, format_penalty)

Rows (`jaxrl.multi_agent.roles`): Proposer rows in groups of the `proposer_samples` questions proposed for
one a* (reference: 1, so GRPO's group of one gives A = R, verl's special case), Solver rows in groups of the
G = `rollout.group_size` answers to one problem; each role is its own segment, so no advantage statistic
mixes roles (spec §3.8). The Proposer is updated first, then the Solver from the updated policy (the
reference's sequential schedule; `update: joint` for one update). Curriculum metrics: `ssp/valid_frac`,
`ssp/solver_success`.
Greedy evaluation (`train=False`) runs the Solver on the dataset's own questions (held-out accuracy).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import jax
import numpy as np

from jaxrl.data.entities import check_world_records
from jaxrl.envs.base import encode_text, prompt_ids
from jaxrl.envs.episodes import EpisodeBudget, Episodes, collect_episodes
from jaxrl.envs.search import SearchEnv, exact_match
from jaxrl.losses.research.ssp import answer_tag_counts, proposer_reward, solver_reward
from jaxrl.multi_agent.adapters import role_params
from jaxrl.multi_agent.roles import joint_rollout, role_metrics, role_rows
from jaxrl.multi_agent.ssp_envs import ROLES, ProposerEnv, SspDemoEnv, cached_world
from jaxrl.multi_agent.ssp_pool import ProblemPool
from jaxrl.multi_agent.ssp_text import (ANSWER_TAG, RULES, SHORT_SOLVER_INSTRUCTIONS, Problem, extract_problem,
                                         noisy_materials, verifier_text)
from jaxrl.multi_agent.ssp_verify import make_verifier
from jaxrl.sampling import DEFAULT_GEN_BUCKETS, DEFAULT_PROMPT_BUCKETS, SamplingSpec, generate_from_state
from jaxrl.types import Rollout

ROLE_IDS = {name: i for i, name in enumerate(ROLES)}
DUMMY = "This is a dummy problem; reply with an empty answer."


class SspSystem:
    """SSP on the fictional-entity world.

    Args:
      tokenizer: the policy's tokenizer.
      corpus_seed, corpus_size, top_k: the searched world (as `SearchEnv`).
      max_turns, max_total_tokens: episode budgets of both roles.
      min_words: rule 3, the reference's 10 words (configs/ssp_tiny.yaml: 4, the tiny world's questions are
        shorter).
      leak: rule 4, "substring" (reference) or "word" (a* as a whole word: one-character answers).
      min_searches: rule 6, the reference's 2 distinct search terms whatever the hop count; None: the
        record's hop count (configs/ssp_tiny.yaml, 1-hop records).
      rules: "reference" (default) or "v1" (configs/ssp_tiny.yaml): the text rules of `extract_problem`, the
        pool's clearing step (reference: after steps interval − 1, 2·interval − 1, …, its step counter being
        advanced before the test; v1: after steps interval, 2·interval, …) and a failed slot with no eligible
        pool problem (reference: any pool problem; v1: the dummy; only with reuse_threshold < 1).
      format_penalty: R_p of an invalid problem (script 0, config default -1).
      rag_check: run rule 7; rag_others: other episodes' materials mixed in (reference: 4; fewer keep the
        verifier's prompt inside a small model's prompt buckets).
      rag_verifier: who answers in rule 7 (`jaxrl.multi_agent.ssp_verify`): "policy" (the paper: the policy
        itself, greedy), "rule" (a frozen lookup over the world's questions, needing the evidence in the
        materials), or a judge spec, `{model: PATH, ...}` (a frozen local model) or `{generate:
        "module:function"}` (the reference: a separate LLM).
      proposer_samples: n_p, questions proposed per answer record, the Proposer's group (reference: 1,
        A = R); the Solver's group is the run's `rollout.group_size`.
      update: "sequential" (reference: the Proposer's update, then the Solver's, whose old log-probs are
        taken after the first; `jaxrl.rl.update.Phased`) or "joint" (one update over both roles).
      failed_slots: "reuse" (reference: a failed proposal's Solver slot takes an earlier problem from the
        pool, `jaxrl.multi_agent.ssp_pool`, else a dummy) or "dummy" (always the dummy problem).
      reuse_threshold, pool_clear_interval: the pool's eligibility (success rate <= threshold; reference
        1.0) and its clearing period in steps (reference 10; 0 never clears).
      query_with_question: both roles' searches are "question question query" (`SearchEnv`'s option; the
        Proposer's question is its record's own, which it never sees), so a tiny model that garbles names
        still retrieves the right document.
      solver_demo_search: the share of the Solver's SFT demonstrations that search (`SearchEnv.demo_search`);
        below 1 the others guess, leaving RL the discovery that searching pays.
      verifier_demos: the SFT warm start also demonstrates the RAG check (one role in three per record).
      rag_layout: the RAG check's prompt: "materials" (`verifier_text`: materials, then the question) or
        "solver" (the paper's verifier, the Solver answering from the materials without searching: the
        Solver's prompt for the question, then the materials as a search result, laid out as in a Solver
        episode, so reading the answer is the Solver's own skill).
      grounded: a rule after rule 6 (not the reference's): the question must name a document title of its
        materials. A stand-in for what the reference's RAG check with noisy materials enforces (the
        question identifies its answer's document), which a tiny verifier that cannot match names does
        not: without it a question about a garbled name ("Sob" after reading "Sop") is valid, unsolvable,
        and earns the Proposer R_p = 1.
      short_prompts: short user texts for both roles (`proposer_text(short=True)`, the Solver's
        `SHORT_SOLVER_INSTRUCTIONS`), so a tiny model's rows fit 128-token buckets.
      proposer_query: what the Proposer's SFT demonstrations search: "chain" (the record's entity names) or
        "answer" (a* for the first hop, the chain's names after it: with `query_with_question` the
        retrieved person is the record's anyway, and a demonstrated query naming that person would let the
        question copy its name from the query, which at sampling time names someone else).
    """

    name = "ssp"  # the key of the pool's state in checkpoints

    adapter_roles = ROLES  # `multi_agent.adapters: per_role`: one adapter set per role
    adapter_aliases = {"verifier": "solver"}  # the RAG check is the Solver reading the materials

    def __init__(self, tokenizer, *, corpus_seed: int = 0, corpus_size: str = "tiny", top_k: int = 1,
                 max_turns: int = 4, max_total_tokens: int = 512, min_words: int = 10,
                 min_searches: int | None = 2, format_penalty: float = 0.0, rag_check: bool = True,
                 rag_others: int = 4, proposer_samples: int = 1, update: str = "sequential",
                 failed_slots: str = "reuse", reuse_threshold: float = 1.0, pool_clear_interval: int = 10,
                 leak: str = "substring", query_with_question: bool = False, solver_demo_search: float = 1.0,
                 verifier_demos: bool = False, rag_layout: str = "materials", proposer_query: str = "chain",
                 short_prompts: bool = False, grounded: bool = False, rules: str = "reference",
                 rag_verifier: Any = "policy"):
        if int(proposer_samples) < 1:
            raise ValueError(f"proposer_samples={proposer_samples}: must be >= 1")
        if update not in ("sequential", "joint"):
            raise ValueError(f"update={update!r}: allowed values are 'sequential', 'joint'")
        if failed_slots not in ("reuse", "dummy"):
            raise ValueError(f"failed_slots={failed_slots!r}: allowed values are 'reuse', 'dummy'")
        if leak not in ("substring", "word"):
            raise ValueError(f"leak={leak!r}: allowed values are 'substring', 'word'")
        if rag_layout not in ("materials", "solver"):
            raise ValueError(f"rag_layout={rag_layout!r}: allowed values are 'materials', 'solver'")
        if proposer_query not in ("chain", "answer"):
            raise ValueError(f"proposer_query={proposer_query!r}: allowed values are 'chain', 'answer'")
        if int(pool_clear_interval) < 0:
            raise ValueError(f"pool_clear_interval={pool_clear_interval}: must be >= 0")
        if rules not in RULES:
            raise ValueError(f"rules={rules!r}: allowed values are {', '.join(map(repr, RULES))}")
        self.rules = rules
        self.tokenizer, self.leak, self.verifier_demos = tokenizer, leak, bool(verifier_demos)
        self.rag_layout, self.proposer_query = rag_layout, proposer_query
        self.short_prompts, self.grounded = bool(short_prompts), bool(grounded)
        self.query_with_question, self.solver_demo_search = bool(query_with_question), float(solver_demo_search)
        self.world = dict(corpus_seed=int(corpus_seed), corpus_size=str(corpus_size), top_k=int(top_k))
        self.verifier = make_verifier(rag_verifier, cached_world(int(corpus_seed), str(corpus_size)))
        self.max_turns, self.max_total_tokens = int(max_turns), int(max_total_tokens)
        self.min_words, self.min_searches = int(min_words), min_searches
        self.format_penalty, self.rag_check = float(format_penalty), bool(rag_check)
        self.rag_others, self.proposer_samples = int(rag_others), int(proposer_samples)
        # role ids in update order (`jaxrl.rl.update.Phased`); () = one joint update
        self.update_phases = (ROLE_IDS["proposer"], ROLE_IDS["solver"]) if update == "sequential" else ()
        offset = 1 if rules == "reference" else 0
        self.pool = ProblemPool(float(reuse_threshold), int(pool_clear_interval), clear_offset=offset,
                                fallback_any=rules == "reference") if failed_slots == "reuse" else None

    def state_json(self) -> dict | None:
        return None if self.pool is None else self.pool.state_json()

    def load_state(self, data) -> None:
        if self.pool is not None:
            self.pool.load_state(data)

    def check_records(self, records: Sequence[Mapping[str, Any]], split: str) -> None:
        """Setup: every record is a question over this system's world (`entities.check_world_records`)."""
        check_world_records(records, cached_world(self.world["corpus_seed"], self.world["corpus_size"]),
                            who="SSP", split=split)

    def group_sizes(self, group_size: int) -> dict[str, int]:
        """The group size of each trained role (the trainer checks the algorithm supports them)."""
        return {"proposer": self.proposer_samples, "solver": int(group_size)}

    def proposer_env(self, tokenizer) -> ProposerEnv:
        return ProposerEnv(tokenizer, **self.world, query_with_question=self.query_with_question,
                           short_prompt=self.short_prompts)

    def solver_env(self, tokenizer) -> SearchEnv:
        short = {"instructions": SHORT_SOLVER_INSTRUCTIONS} if self.short_prompts else {}
        return SearchEnv(tokenizer, **self.world, query_with_question=self.query_with_question,
                         demo_search=self.solver_demo_search, **short)

    def demonstration_env(self, tokenizer) -> SspDemoEnv:
        return SspDemoEnv(tokenizer, self)

    def verifier_ids(self, materials: str, question: str) -> list[int]:
        """The RAG check's prompt ids in `rag_layout` ("solver": the Solver's prompt, then the materials as
        the observation of a search, whose query is left out: the Proposer's could hold a*)."""
        tok = self.tokenizer
        if self.rag_layout == "materials":
            return prompt_ids(tok, [{"role": "user", "content": verifier_text(materials, question)}])
        ids = self.solver_env(tok).reset({"question": question, "answers": [""]})
        return ids + encode_text(tok, f"\n<result>\n{materials}\n</result>\n")

    def _episodes(self, name, graphdef, params, records, factory, spec: SamplingSpec, g: int,
                  key) -> Episodes:
        budget = EpisodeBudget(max_turns=self.max_turns, max_total_tokens=self.max_total_tokens)
        # g episodes per record; chunk and decode widths from the sampler's default buckets, since contexts
        # grow to max_total_tokens, past the run's prompt buckets
        sampling = dataclasses.replace(spec, num_samples=g, prompt_buckets=DEFAULT_PROMPT_BUCKETS,
                                       gen_buckets=DEFAULT_GEN_BUCKETS)
        return collect_episodes(graphdef, role_params(params, name), records, self.tokenizer, factory, budget,
                                sampling, key)

    def verify(self, graphdef, params, problems: Sequence[Problem], answers: Sequence[str], spec, key
               ) -> tuple[np.ndarray, float]:
        """Rule 7: the verifier's answers from noisy materials; valid when they match a*. Returns (valid
        [P], the share of checked problems the verifier gave no answer for)."""
        ok = np.asarray([p.valid for p in problems])
        idx = np.flatnonzero(ok)
        if not self.rag_check or not len(idx):
            return ok, 0.0
        others = [p.materials for p in problems]
        materials = [noisy_materials(problems[i].materials, others, int(i), self.rag_others) for i in idx]
        questions = [str(problems[i].question) for i in idx]
        if self.verifier is not None:  # a rule or a separate judge
            said = self.verifier.answers(materials, questions)
        else:  # the policy, greedy, one turn
            ids = [self.verifier_ids(m, q) for m, q in zip(materials, questions)]
            greedy = dataclasses.replace(spec, temperature=0.0, num_samples=1)
            tok = self.tokenizer
            gen = generate_from_state(graphdef, role_params(params, "verifier"), ids, greedy,
                                      eos_ids=(int(tok.eos_token_id),), seed=key, pad_id=int(tok.pad_token_id))
            rows = role_rows("verifier", ids, gen, 1, tok, spec.prompt_buckets)
            said = [(ANSWER_TAG.findall(text) or [None])[-1] for text in rows.completions]
        for i, a in zip(idx, said):
            ok[i] = a is not None and exact_match(a, [answers[i]])
        return ok, float(np.mean([a is None for a in said]))

    def collect(self, graphdef, params, records: Sequence[Mapping[str, Any]], rewards, spec: SamplingSpec,
                key, *, train: bool = True) -> Rollout:
        """Proposer -> checks -> Solver rows (train), or the Solver on the records' questions (evaluation).
        `rewards` (the config's) are not used: SSP's rewards are its own."""
        del rewards
        if isinstance(key, (int, np.integer)):
            key = jax.random.key(int(key))
        keys = [int(jax.random.randint(jax.random.fold_in(key, i), (), 0, 2**31 - 1)) for i in range(3)]
        g = spec.num_samples
        names, weights = ("ssp",), np.ones((1,), np.float32)
        if not train:
            eps = self._episodes("solver", graphdef, params, records, self.solver_env, spec, g, keys[2])
            r = solver_reward(eps.rewards_B > 0, *answer_tag_counts(eps.completions))
            rows = eps.rows("solver")
            return joint_rollout([(rows, list(eps.records), np.asarray(r)[:, None])], role_ids=ROLE_IDS,
                                 reward_names=names, weights_R=weights,
                                 pad_id=int(self.tokenizer.pad_token_id),
                                 metrics=role_metrics("solver", np.asarray(r), rows.lengths_B),
                                 group_sizes=[g])
        prop = self._episodes("proposer", graphdef, params, records, self.proposer_env, spec,
                              self.proposer_samples, keys[0])
        answers = [str(r["answers"][0]) for r in prop.records]
        problems = [extract_problem(t, a, min_words=self.min_words, leak=self.leak, grounded=self.grounded,
                                    min_searches=self.min_searches or int(r.get("hops", 1)), rules=self.rules)
                    for t, a, r in zip(prop.completions, answers, prop.records)]
        valid, unanswered = self.verify(graphdef, params, problems, answers, spec, jax.random.fold_in(key, 9))
        reused = self.pool.fill(valid, keys[2]) if self.pool is not None else [None] * len(problems)
        solver_records = [{"question": p.question, "answers": [a], "valid": True} if ok else
                          {"question": DUMMY, "answers": [a], "valid": False} if old is None else
                          {"question": old["question"], "answers": [old["answer"]], "valid": False}
                          for p, a, ok, old in zip(problems, answers, valid, reused)]
        sol = self._episodes("solver", graphdef, params, solver_records, self.solver_env, spec, g, keys[1])
        r_s = np.asarray(solver_reward(sol.rewards_B > 0, *answer_tag_counts(sol.completions)))
        r_p = np.asarray(proposer_reward(r_s.reshape(-1, g), mode="1-acc", valid_P=valid,
                                         format_penalty=self.format_penalty))
        p_rows, s_rows = prop.rows("proposer"), sol.rows("solver")
        metrics = {**role_metrics("proposer", r_p, p_rows.lengths_B),
                   **role_metrics("solver", r_s, s_rows.lengths_B)}
        solved = (r_s.reshape(-1, g) > 0).mean(1)
        if self.pool is not None:  # every non-dummy problem of this step, with its success rate
            self.pool.push([(r["question"], r["answers"][0], p) for r, p in zip(solver_records, solved)
                            if r["question"] != DUMMY])
            metrics["ssp/pool_size"] = float(len(self.pool.problems))
        metrics["ssp/reused"] = float(np.mean([old is not None for old in reused]))
        metrics["ssp/dummy"] = float(np.mean([r["question"] == DUMMY for r in solver_records]))
        metrics["ssp/valid_frac"] = float(valid.mean())
        metrics["ssp/solver_success"] = float(solved[valid].mean()) if valid.any() else float("nan")
        for reason in ("format", "length", "leak", "materials", "searches", "grounded"):
            metrics[f"ssp/invalid/{reason}"] = float(np.mean([p.reason == reason for p in problems]))
        metrics["ssp/rag_rejected"] = float(np.mean([p.valid and not v for p, v in zip(problems, valid)]))
        metrics["ssp/rag_unanswered"] = unanswered  # of the problems the verifier was asked about
        parts = [(p_rows, list(prop.records), r_p[:, None]), (s_rows, list(sol.records), r_s[:, None])]
        return joint_rollout(parts, role_ids=ROLE_IDS, reward_names=names, weights_R=weights,
                             pad_id=int(self.tokenizer.pad_token_id), metrics=metrics,
                             group_sizes=[self.proposer_samples, g])
