"""MARCH as a collect stage: Solver -> Proposer -> Checker x S, rewards from `losses.research.march`.

MARCH, "Multi-Agent Reinforced self-Check for Hallucination", arXiv:2603.24579 (reference:
Qwen-Applications/MARCH, `ray_trainer_with_fact_check_march.py::fit / generate_fact_check_batch`); the
pipeline of spec/multi-agent.md §1, with its critic-free variant (§1.7, `march.estimator =
"grpo"`): one policy, G Solver answers per prompt, each with its own Proposer and Checker x S chain.

Per chain i (Solver answer i of prompt p):

    v[s][q] = +1 if Checker sample s answers question q like the Proposer, else -1
    r_fc(i) = fact_check_reward(v, mode)                 ZTR: -1 if some c_q = sum_s v[s][q] < 0, else 0
    Solver row:  R = r_RM + r_fc      r_RM = the config's `rewards:` on the Solver answer (weighted sum)
    Checker row (sample S only): R = r_fc(i)  (the Solver's penalty: spec §1.6 and quirk Q1)
    hallucination rate = #{claims q with c_q < 0} / #claims   (claims of fact-checked rows)

Rows are grouped per role (`jaxrl.multi_agent.roles`): GRPO over the G Solver answers of a prompt, and over
the G trained Checker rows of the same prompt. The Proposer and Checker samples 1..S-1 are never trained.
Checker rows of chains with no claim (unlabelled rows, or no parsable pair) get a NaN reward and no trained
token (the spec's `fixed` option of quirk Q6). Greedy evaluation (`train=False`) returns the Solver rows only.

Deviations (see docs/multi_agent.md): GRPO instead of PPO+GAE with a critic; S Checker samples drawn as S
samples of one prompt (same distribution as S identical calls); `fixed` options of quirks Q2, Q3 and Q6.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Mapping, Sequence

import jax
import numpy as np

from jaxrl.data.entities import build_world, check_world_records
from jaxrl.envs.base import StepResult, prompt_ids
from jaxrl.losses.research.march import answers_match, checker_votes, fact_check_reward
from jaxrl.multi_agent import march_text as mt
from jaxrl.multi_agent.adapters import role_params
from jaxrl.multi_agent.roles import joint_rollout, role_metrics, role_rows
from jaxrl.rewards.rows import score_rows
from jaxrl.sampling import SamplingSpec, generate_from_state
from jaxrl.types import Rollout, Rows

ROLES = ("solver", "proposer", "checker")
ROLE_IDS = {name: i for i, name in enumerate(ROLES)}
TRAINABLE = ("solver", "checker")
FACT_CHECK = "fact_check"
HALLUCINATION = "hallucination"


@dataclasses.dataclass(frozen=True)
class Chains:
    """Everything one collect call generated, role by role (B = P·G chains, S Checker samples each)."""

    solver: Rows  # B rows
    proposer: Rows  # B rows
    checker: Rows  # N·S rows, chain i's samples at i·S .. i·S + S-1
    pairs: list[list[tuple[str, str]]]  # the Proposer's (question, answer) pairs of each chain
    votes_BSQ: np.ndarray
    qmask_BQ: np.ndarray
    labelled_B: np.ndarray


def chain_rewards(votes_BSQ: np.ndarray, qmask_BQ: np.ndarray, labelled_B: np.ndarray, mode: str
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(r_fc per chain, refuted claims per chain, claims per chain), `losses.research.march` arithmetic."""
    r_B = np.asarray(fact_check_reward(votes_BSQ, qmask_BQ, mode=mode, labelled_B=labelled_B), np.float32)
    c_BQ = votes_BSQ.sum(axis=1)
    checked_B = labelled_B.astype(bool)[:, None]
    refuted_B = ((c_BQ < 0) & qmask_BQ & checked_B).sum(axis=1)
    claims_B = (qmask_BQ & checked_B).sum(axis=1)
    return r_B, refuted_B, claims_B


def checker_gold_frac(checker_texts: Sequence[str], pairs: Sequence[Sequence[tuple[str, str]]],
                      golds: Sequence[str], samples: int) -> float:
    """The share of Checker samples whose answer to question 1 is the record's gold answer, over chains with
    a claim (NaN when none): the Checker's own accuracy, which the hallucination rate relies on."""
    hits = [answers_match(mt.parse_checker(checker_texts[i * samples + s], 1)[0], gold)
            for i, (chain, gold) in enumerate(zip(pairs, golds)) if chain for s in range(samples)]
    return float(np.mean(hits)) if hits else float("nan")


def vote_matrix(checker_texts: Sequence[str], pairs: Sequence[Sequence[tuple[str, str]]], samples: int,
                max_questions: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(votes [N, S, Q], question mask [N, Q]) from the decoded Checker samples (chain i at rows i·S + s);
    Q = `max_questions`, or (None) the most pairs of any chain."""
    n = len(pairs)
    q = max(max_questions or max((len(p) for p in pairs), default=0), 1)
    votes = -np.ones((n, samples, q), np.int32)
    qmask = np.zeros((n, q), bool)
    for i, chain in enumerate(pairs):
        if not chain:
            continue
        answers = [mt.parse_checker(checker_texts[i * samples + s], len(chain)) for s in range(samples)]
        votes[i, :, : len(chain)] = np.asarray(checker_votes(answers, [a for _, a in chain]), np.int32)
        qmask[i, : len(chain)] = True
    return votes, qmask


class MarchDemoEnv:
    """One role-format demonstration per record, for the SFT warm start (`jaxrl.rl.agentic.demonstration_rows`):
    the role is a function of the question (crc32 over the roles the record has: numeric answers have all
    three, others the Solver only) and, with `demo_roles="all"`, of how often the record was drawn before
    (`MarchSystem.demo_role`), so the prompt (`reset`) and the demonstrated text always belong together."""

    stop_strings: tuple[str, ...] = ()

    def __init__(self, tokenizer, system: "MarchSystem"):
        self.tokenizer, self.system = tokenizer, system

    def _demo(self, record: Mapping[str, Any], *, draw: bool = False) -> tuple[str, str]:
        demos = self.system.demonstrations(record)
        roles = [r for r in ROLES if r in demos]
        return demos[self.system.demo_role(record, roles, draw=draw)]

    def reset(self, record: Mapping[str, Any]) -> list[int]:
        return prompt_ids(self.tokenizer, [{"role": "user", "content": self._demo(record, draw=True)[0]}])

    def step(self, action) -> StepResult:
        return StepResult([], 0.0, True, {})

    def demonstration(self, record: Mapping[str, Any]) -> list[str]:
        return [self._demo(record)[1] + self.tokenizer.eos_token]


class MarchSystem:
    """MARCH on the fictional-entity world (`jaxrl.data.entities`) with distractor passages.

    Args:
      tokenizer: the policy's tokenizer.
      corpus_seed, corpus_size: the world the records' questions come from (data.source: entities).
      num_distractors: distractor passages per question (near-twins first: `march_text.passages`).
      train_roles: which of "solver", "checker" get trained rows (the reference trains both).
      checker_samples: S, the Checker's votes per chain (3 in the reference).
      mode: "ztr" (zero tolerance, default) or "error_rate" (`losses.research.march.fact_check_reward`).
      max_questions: at most this many Proposer pairs are checked per chain; None (default) checks every
        parsed pair, as the reference (a cap lets a refuted claim past it go unpunished under ZTR).
      solver_demo_wrong: the share of Solver warm-start demonstrations that answer from a distractor
        passage (`march_text.solver_wrong`): a warm-started Solver that hallucinates, for the fact check to
        correct (0 = every demonstration answers right).
      demo_roles: "one" (each record always demonstrates the same role, crc32 of its question) or "all"
        (the k-th draw of a record in the warm start demonstrates role crc32 + k, so every record shows
        every role: three times the data per role).
      prompts: "full" (the Proposer's and Checker's prompts open with an instruction line) or "terse"
        (without it: for a character model, 40 % shorter Checker prompts).
      rules: how Proposer pairs are parsed (`march_text.parse_pairs`): "reference" (default; a pair may be
        written across lines) or "v1" (one line; configs/march_tiny.yaml, whose results were measured so).
    """

    name = "march"  # the key of its state in checkpoints (it has none: `state_json` is None)
    max_turns = 1  # its warm-start demonstrations are one turn per role (`jaxrl.rl.collect`)
    max_total_tokens: int | None = None  # None: the rollout's longest prompt bucket + its completion
    adapter_roles = ROLES  # `multi_agent.adapters: per_role`: one adapter set per role
    adapter_aliases: dict[str, str] = {}
    update_phases: tuple[int, ...] = ()  # one joint update of the trained roles (`jaxrl.rl.update.Joint`)

    def __init__(self, tokenizer, *, corpus_seed: int = 0, corpus_size: str = "tiny",
                 num_distractors: int = 1, train_roles: Sequence[str] = TRAINABLE, checker_samples: int = 3,
                 mode: str = "ztr", max_questions: int | None = None, solver_demo_wrong: float = 0.0,
                 demo_roles: str = "one", prompts: str = "full", rules: str = "reference"):
        bad = [r for r in train_roles if r not in TRAINABLE]
        if bad or not train_roles:
            raise ValueError(f"train_roles={list(train_roles)!r}: a non-empty subset of {list(TRAINABLE)} "
                             "(the Proposer is never trained, as in the reference)")
        if mode not in ("ztr", "error_rate"):
            raise ValueError(f"mode={mode!r}: allowed values are 'ztr', 'error_rate'")
        if int(checker_samples) < 1 or (max_questions is not None and int(max_questions) < 1) \
                or int(num_distractors) < 0:
            raise ValueError("checker_samples and max_questions (or null) must be >= 1, num_distractors >= 0")
        if not 0.0 <= float(solver_demo_wrong) <= 1.0:
            raise ValueError(f"solver_demo_wrong={solver_demo_wrong!r}: a share in [0, 1]")
        for name, value, allowed in (("demo_roles", demo_roles, ("one", "all")),
                                     ("prompts", prompts, ("full", "terse")), ("rules", rules, mt.RULES)):
            if value not in allowed:
                raise ValueError(f"{name}={value!r}: allowed values are {', '.join(map(repr, allowed))}")
        self.tokenizer = tokenizer
        self.world = build_world(int(corpus_seed), str(corpus_size))
        self.num_distractors, self.train_roles = int(num_distractors), tuple(train_roles)
        self.checker_samples, self.mode = int(checker_samples), mode
        self.max_questions = None if max_questions is None else int(max_questions)
        self.solver_demo_wrong = float(solver_demo_wrong)
        self.demo_roles, self.rules = demo_roles, rules
        self.task = {"task": ""} if prompts == "terse" else {}  # the Proposer's and Checker's instruction
        self._draws: dict[str, int] = {}  # demo_roles="all": warm-start draws of each question so far
        # the rooms world's codes: made-up answers of wrong Solver demonstrations with no distractor passage
        self.codes = tuple(sorted({str(e["room"]) for e in self.world.entities.values() if "room" in e}))

    def check_records(self, records: Sequence[Mapping[str, Any]], split: str) -> None:
        """Setup: every record is a question over this system's world (`entities.check_world_records`)."""
        check_world_records(records, self.world, who="MARCH", split=split)

    def state_json(self) -> None:
        """Nothing to checkpoint: MARCH keeps no state between steps."""
        return None

    def load_state(self, data) -> None:
        del data

    def group_sizes(self, group_size: int) -> dict[str, int]:
        """The group size of each trained role: G Solver answers of a prompt, their G trained Checker rows."""
        return {role: int(group_size) for role in self.train_roles}

    @functools.lru_cache(maxsize=4096)  # noqa: B019 -- a pure function of the question; one system per run
    def _context(self, question: str, chain: tuple[str, ...]) -> tuple[tuple[str, ...], int]:
        docs, gold = mt.passages({"question": question, "chain": chain}, self.world, self.num_distractors)
        return tuple(docs), gold

    def context(self, record: Mapping[str, Any]) -> tuple[tuple[str, ...], int]:
        """(passages, index of the answering passage) of a record."""
        return self._context(str(record["question"]), tuple(record["chain"]))

    def demonstrations(self, record: Mapping[str, Any]) -> dict[str, tuple[str, str]]:
        docs, gold = self.context(record)
        return mt.demonstrations(record, docs, gold, self.solver_demo_wrong, terse=bool(self.task),
                                 codes=self.codes)

    def demo_role(self, record: Mapping[str, Any], roles: Sequence[str], *, draw: bool = False) -> str:
        """The role a warm-start demonstration of `record` shows, of the `roles` it has: index crc32 of its
        question, plus, with demo_roles="all", the number of earlier draws of it (`draw=True` counts a new
        draw: the environment's `reset`; its `demonstration` then reads the same role)."""
        q = str(record["question"])
        if draw and self.demo_roles == "all":
            self._draws[q] = self._draws.get(q, -1) + 1
        return roles[(mt._crc(q) + self._draws.get(q, 0)) % len(roles)]

    def demonstration_env(self, tokenizer) -> MarchDemoEnv:
        return MarchDemoEnv(tokenizer, self)

    def _ids(self, text: str) -> list[int]:
        return prompt_ids(self.tokenizer, [{"role": "user", "content": text}])

    def _generate(self, name, graphdef, params, ids, spec: SamplingSpec, samples: int, key) -> Rows:
        spec = dataclasses.replace(spec, num_samples=samples)
        tok = self.tokenizer
        gen = generate_from_state(graphdef, role_params(params, name), ids, spec,
                                  eos_ids=(int(tok.eos_token_id),), seed=key, pad_id=int(tok.pad_token_id))
        return role_rows(name, ids, gen, samples, tok, spec.prompt_buckets)

    def chains(self, graphdef, params, records: Sequence[Mapping[str, Any]], spec: SamplingSpec,
               key) -> Chains:
        """Solver (G per record) -> Proposer (1 per answer) -> Checker (S per chain), strictly in order.

        The Proposer and Checker prompts are built from the *decoded* Solver prompt (`parse_solver_prompt`),
        the Checker's from the passages and the question texts only."""
        g, s = spec.num_samples, self.checker_samples
        keys = [jax.random.fold_in(key, i) for i in range(3)]
        solver_ids = [self._ids(mt.solver_text(self.context(r)[0], str(r["question"]))) for r in records]
        solver = self._generate("solver", graphdef, params, solver_ids, spec, g, keys[0])
        parsed = [mt.parse_solver_prompt(self.tokenizer.decode(ids, skip_special_tokens=True))
                  for ids in solver_ids]
        n = len(solver.completions)
        prop_ids = [self._ids(mt.proposer_text(parsed[i // g][1], mt.answer_part(solver.completions[i]),
                                               **self.task)) for i in range(n)]
        proposer = self._generate("proposer", graphdef, params, prop_ids, spec, 1, keys[1])
        pairs = [mt.parse_pairs(t, self.max_questions, self.rules) for t in proposer.completions]
        chk_ids = [self._ids(mt.checker_text(parsed[i // g][0], [q for q, _ in pairs[i]], **self.task))
                   for i in range(n)]
        checker = self._generate("checker", graphdef, params, chk_ids, spec, s, keys[2])
        votes, qmask = vote_matrix(checker.completions, pairs, s, self.max_questions)
        labelled = np.asarray([mt.label(records[i // g]) == mt.FACT_LABEL for i in range(n)])
        return Chains(solver, proposer, checker, pairs, votes, qmask, labelled)

    def collect(self, graphdef, params, records: Sequence[Mapping[str, Any]], rewards, spec: SamplingSpec,
                key, *, train: bool = True) -> Rollout:
        """The joint rollout of the trained roles (train) or of the Solver alone (evaluation).

        Reward columns: [the config's rewards (r_RM, Solver rows; 0 on Checker rows) | fact_check (r_fc) |
        hallucination (refuted share of the chain's claims, weight 0: a metric)]."""
        if isinstance(key, (int, np.integer)):
            key = jax.random.key(int(key))
        g, s = spec.num_samples, self.checker_samples
        ch = self.chains(graphdef, params, records, spec, key)
        rep = [dict(r) for r in records for _ in range(g)]
        n = len(rep)
        prompts = [mt.solver_text(self.context(r)[0], str(r["question"])) for r in rep]
        rm_BR, info = score_rows(rewards, prompts, ch.solver.completions, rep, ch.solver.lengths_B)
        r_fc, refuted, claims = chain_rewards(ch.votes_BSQ, ch.qmask_BQ, ch.labelled_B, self.mode)
        frac = np.where(claims > 0, refuted / np.maximum(claims, 1), 0.0).astype(np.float32)
        names = (*info.names, FACT_CHECK, HALLUCINATION)
        weights = np.concatenate([np.asarray(info.weights_R, np.float32), [1.0, 0.0]]).astype(np.float32)
        solver_BR = np.concatenate([rm_BR, r_fc[:, None], frac[:, None]], axis=1)
        r_rm = (np.nan_to_num(rm_BR) * weights[None, : rm_BR.shape[1]]).sum(1)
        has_claims = ch.labelled_B & (ch.qmask_BQ.sum(1) > 0)
        checker_BR = np.zeros_like(solver_BR)
        checker_BR[:, -2] = np.where(has_claims, r_fc, np.nan)
        last = ch.checker.take(np.arange(n) * s + s - 1)
        parts = []
        if not train or "solver" in self.train_roles:
            parts.append((ch.solver, rep, solver_BR))
        if train and "checker" in self.train_roles:
            parts.append((last, rep, checker_BR))
        metrics = dict(info.metrics)
        metrics.update(role_metrics("solver", r_rm + r_fc, ch.solver.lengths_B))
        metrics.update(role_metrics("checker", checker_BR[:, -2], last.lengths_B))
        metrics.update(role_metrics("proposer", np.full((n,), np.nan), ch.proposer.lengths_B))
        metrics["role/solver/correct/mean"] = float(r_rm.mean())
        metrics["role/proposer/pairs/mean"] = float(np.mean([len(p) for p in ch.pairs]))
        metrics[f"reward/{FACT_CHECK}/mean"] = float(r_fc.mean())
        metrics["march/hallucination_rate"] = float(refuted.sum() / max(claims.sum(), 1))
        metrics["march/claims/mean"] = float(claims.mean())
        metrics["march/fault_frac"] = float(np.mean(r_fc < 0))
        metrics["march/labelled_frac"] = float(ch.labelled_B.mean())
        golds = [str(r["answers"][0]) for r in rep]
        metrics["march/checker_gold_frac"] = checker_gold_frac(ch.checker.completions, ch.pairs, golds, s)
        ro = joint_rollout(parts, role_ids=ROLE_IDS, reward_names=names, weights_R=weights,
                           pad_id=int(self.tokenizer.pad_token_id), metrics=metrics, score_infos=(info,),
                           group_sizes=[g] * len(parts))
        ro.metrics["response_length/mean"] = float(ro.lengths_B.mean())
        ro.metrics["response/finished_frac"] = float(ro.finished_B.mean())
        return ro
