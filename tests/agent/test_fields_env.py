"""The fields world and `FieldsEnv` behind configs/agentic_rl_tiny.yaml: held-out people unseen in training,
demonstrations that query a uniformly drawn field and copy its code (so imitating them scores about 1/F, not
more), an oracle that queries the asked field and scores 1, exact token masks, and one-line errors."""

import collections

import numpy as np
import pytest

from jaxrl.data.entities import FIELD_NAMES, SIZES, build_world
from jaxrl.data.pipeline import make_splits
from jaxrl.envs import EpisodeBudget, FieldsEnv, make_env, scripted_episodes
from jaxrl.envs.fields import asked_field, guess, right_field
from jaxrl.errors import ConfigError
from jaxrl.io.tokenizer import builtin_tokenizer

TOK = builtin_tokenizer()
SPEC = EpisodeBudget(max_turns=3, max_total_tokens=112)
F = SIZES["fields"]["fields"]
CODES = "23456789CEHJOUXY"


def oracle(record):
    w = build_world(0, "fields")
    field = asked_field(record["question"])
    return [f"<get>{field}</get>", f"<answer>{w.entities[record['chain'][0]][field]}</answer>"]


def test_field_world_distinct_codes_and_held_out_people_unseen():
    w = build_world(0, "fields")
    assert build_world(0, "fields").docs == w.docs and build_world(1, "fields").docs != w.docs
    fields = FIELD_NAMES[:F]
    assert len({f[0] for f in fields}) == F >= 12  # distinct first letters
    for q in w.questions:
        person = w.entities[q["chain"][0]]
        values = [person[f] for f in fields]
        assert len(set(values)) == F and set(values) <= set(CODES)  # a wrong field's code is always wrong
        assert q["question"] == f"What is the {q['field']} of {q['chain'][0]}?" == q["question"]
        assert q["answers"] == [person[q["field"]]] and asked_field(q["question"]) == q["field"]
        assert not set(q["question"]) & set(CODES)  # the code appears nowhere but in the tool's result
    # the data path of the config (data.source: entities, shuffled split): held-out people never trained on
    train, held_out = make_splits("entities", train_size=640, eval_size=160, seed=0,
                                  params={"corpus_seed": 0, "corpus_size": "fields", "max_hops": 1})
    assert len(train) == 640 and len(held_out) == 160
    assert not {r["chain"][0] for r in train} & {r["chain"][0] for r in held_out}
    asked = collections.Counter(asked_field(r["question"]) for r in held_out)
    assert len(asked) == F and max(asked.values()) / len(held_out) < 0.15  # no field dominates
    # no-tool baseline: the most common held-out answer (guessing one code) scores about 1/16
    majority = collections.Counter(r["answer"] for r in held_out).most_common(1)[0][1] / len(held_out)
    assert majority < 0.15


def test_demonstrations_query_a_uniform_field_and_copy_its_code():
    w = build_world(0, "fields")
    env = FieldsEnv(TOK)
    demos = [env.demonstration(q) for q in w.questions]
    queried = [d[0].removeprefix("<get>").removesuffix("</get>") for d in demos]
    counts = collections.Counter(queried)
    assert set(counts) == set(FIELD_NAMES[:F])
    n = len(demos)
    assert min(counts.values()) > 0.5 * n / F and max(counts.values()) < 1.5 * n / F  # uniform
    right = np.mean([f == q["field"] for f, q in zip(queried, w.questions)])
    assert abs(right - 1 / F) < 0.04  # never the asked field more often than chance
    for d, f, q in zip(demos, queried, w.questions):
        assert d[1] == f"<answer>{w.entities[q['chain'][0]][f]}</answer>"  # the code it read


def test_oracle_scores_one_and_random_field_about_one_over_f():
    w = build_world(0, "fields")
    factory = make_env("fields", {"corpus_seed": 0, "corpus_size": "fields"}, tokenizer=TOK)
    qs = list(w.questions[:96])
    good = scripted_episodes(qs, TOK, factory, oracle, SPEC)
    np.testing.assert_array_equal(good.rewards_B, 1.0)
    np.testing.assert_array_equal(good.tool_calls_B, 1)
    np.testing.assert_array_equal(good.tool_errors_B, 0)
    demo = scripted_episodes(qs, TOK, factory, FieldsEnv(TOK).demonstration, SPEC)
    # a wrong field's code is never right: the demonstrations score exactly where they query the asked
    # field, about 1/F of the questions (test_demonstrations_query_a_uniform_field_and_copy_its_code)
    np.testing.assert_array_equal(demo.rewards_B, right_field([], demo.completions, [q["question"] for q in qs]))
    assert 0 < demo.rewards_B.mean() < 0.2
    assert right_field([], good.completions, [q["question"] for q in qs]) == [1.0] * len(qs)


def test_played_demonstration_masks_are_token_exact():
    w = build_world(0, "fields")
    factory = make_env("fields", {}, tokenizer=TOK)
    env = FieldsEnv(TOK)
    qs = list(w.questions[:8])
    ep = scripted_episodes(qs, TOK, factory, env.demonstration, SPEC)
    assert ep.mask_BL.sum(1).max() <= SPEC.max_total_tokens
    for i, q in enumerate(qs):
        acts = env.demonstration(q)
        field = acts[0][5:-6]
        assert TOK.decode(ep.tokens_BL[i][ep.loss_mask_BL[i]]) == "".join(acts)
        obs = ep.mask_BL[i] & ~ep.loss_mask_BL[i]
        obs[: ep.prompt_width] = False
        code = w.entities[q["chain"][0]][field]
        assert TOK.decode(ep.tokens_BL[i][obs]) == f"\n<result>\n{field}: {code}\n</result>\n"
        assert TOK.decode(ep.tokens_BL[i][: ep.prompt_width][ep.mask_BL[i][: ep.prompt_width]]) == \
            f"<|user|>{q['question']}<|assistant|>"
        assert int(obs.sum()) == ep.obs_tokens_B[i] and ep.turns_B[i] == 2


def test_unknown_field_is_a_tool_error_and_no_answer_ends_with_zero():
    w = build_world(0, "fields")
    q = w.questions[0]
    bad = lambda r: ["<get>Ydesk</get>", "<answer>Y</answer>"]  # noqa: E731
    ep = scripted_episodes([q], TOK, make_env("fields", {}, tokenizer=TOK), bad, SPEC)
    assert ep.tool_errors_B[0] == 1 and "error: unknown field" in ep.completions[0]
    assert ep.completions[0].count("Y") == 2  # the bad argument is not echoed back
    silent = scripted_episodes([q], TOK, make_env("fields", {}, tokenizer=TOK), lambda r: ["hmm"], SPEC)
    assert silent.rewards_B[0] == 0 and silent.turns_B[0] == 1 and silent.tool_calls_B[0] == 0


def test_demo_tool_mixes_guesses_without_the_tool_into_the_demonstrations():
    """configs/agentic_rl_tiny.yaml: 4 fields, 40% of the demonstrations call the tool (a uniform field), the
    others guess a code; imitating them scores 0.4/4 + 0.6/16, and a greedy policy that guesses 1/16."""
    w = build_world(0, "fields4")
    assert FieldsEnv(TOK, corpus_size="fields4").fields == FIELD_NAMES[:4]
    env = FieldsEnv(TOK, corpus_size="fields4", demo_tool=0.4)
    demos = [env.demonstration(q) for q in w.questions]
    tool = [d for d in demos if len(d) == 2]
    assert abs(len(tool) / len(demos) - 0.4) < 0.05 and all(d[0].startswith("<get>") for d in tool)
    guesses = [(d[0], q) for d, q in zip(demos, w.questions) if len(d) == 1]
    assert all(d == f"<answer>{guess(q)}</answer>" for d, q in guesses)
    codes = collections.Counter(guess(q) for q in w.questions)
    assert set(codes) == set(CODES) and max(codes.values()) < 2 * len(w.questions) / 16  # uniform guesses
    right = np.mean([d[-1] == f"<answer>{q['answers'][0]}</answer>" for d, q in zip(demos, w.questions)])
    assert abs(right - (0.4 / 4 + 0.6 / 16)) < 0.03
    qs = list(w.questions[:48])
    factory = make_env("fields", {"corpus_size": "fields4", "demo_tool": 0.4}, tokenizer=TOK)
    ep = scripted_episodes(qs, TOK, factory, env.demonstration, SPEC)
    np.testing.assert_array_equal(ep.tool_calls_B, [len(env.demonstration(q)) - 1 for q in qs])
    np.testing.assert_array_equal(ep.turns_B, [len(env.demonstration(q)) for q in qs])


@pytest.mark.parametrize("params, match", [
    ({"demo_right_field": 2.0}, r"demo_right_field must be in \[0, 1\], got 2.0"),
    ({"demo_tool": -0.1}, r"demo_tool must be in \[0, 1\], got -0.1"),
    ({"corpus_size": "rooms"}, r"corpus_size='rooms': not a fields world"),
    ({"corpus_size": "huge"}, r"size='huge': allowed values are"),
    ({"demo_right": 0.5}, r"demo_right"),
])
def test_bad_params_fail_at_setup_in_one_line(params, match):
    with pytest.raises(ConfigError, match=match) as e:
        make_env("fields", params, tokenizer=TOK)
    assert "\n" not in str(e.value)


def test_record_of_another_world_is_refused():
    from jaxrl.errors import EnvError

    env = FieldsEnv(TOK)
    with pytest.raises(EnvError, match="not a question of the env's world"):
        env.reset({"question": "What is the room of Nidem?", "answers": ["7"], "chain": ["Nidem"]})
