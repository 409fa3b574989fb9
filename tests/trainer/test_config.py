"""Experiment config: YAML <-> dataclasses, dotted overrides, one-line errors naming the key."""

import dataclasses
from pathlib import Path

import pytest
from jaxrl.sharding.mesh import MeshConfig

from jaxrl.cli import main
from jaxrl.config import (
    Algo,
    ExperimentConfig,
    RewardSpec,
    default_config_text,
    dump_config,
    load_config,
    save_config,
)
from jaxrl.errors import ConfigError
from jaxrl.rewards import build_reward


def test_default_is_embedded_quickstart():
    cfg = load_config(None)
    assert default_config_text().startswith("# Run with: jaxrl train")
    assert cfg.model.preset == "tiny_siamese" and cfg.data.source == "arithmetic"
    assert cfg.algorithm.name == Algo.GDPO and [r.name for r in cfg.rewards] == ["answer", "format"]
    assert isinstance(cfg.mesh, MeshConfig)


def test_overrides_apply_with_yaml_values():
    cfg = load_config(
        None,
        [
            "optimizer.lr=1e-5",
            "algorithm.name=dapo",
            "algorithm.clip.dual=3",
            "rollout.top_p=null",
            "rollout.prompt_buckets=[16, 48]",
            "model.overrides.num_layers=3",
            "rewards.format.weight=0.25",
            "rewards.0.on_error=skip",
            "mesh.fsdp=2",
            "data.params.max_operand=99",
        ],
    )
    assert cfg.optimizer.lr == 1e-5 and cfg.algorithm.name == Algo.DAPO and cfg.algorithm.clip.dual == 3.0
    default = load_config(None)
    assert cfg.rollout.prompt_buckets == (16, 48)
    assert cfg.model.overrides == {**default.model.overrides, "num_layers": 3}  # merged into the YAML's dict
    assert cfg.rewards[1].weight == 0.25 and cfg.rewards[0].on_error == "skip"
    assert cfg.mesh.fsdp == 2 and cfg.data.params["max_operand"] == 99


def test_round_trip(tmp_path):
    cfg = load_config(
        None,
        [
            "algorithm.name=gd2po",
            "rewards.answer.params={use_math_verify: false}",
            "rollout.top_k=5",
            "model.overrides.vocab_size=128",
        ],
    )
    path = save_config(cfg, tmp_path / "run")
    again = load_config(path)
    assert again == cfg
    assert dump_config(again) == dump_config(cfg)


def test_full_file_round_trip_of_all_defaults(tmp_path):
    cfg = ExperimentConfig(rewards=(RewardSpec(name="r", type="math_answer"),))
    (tmp_path / "c.yaml").write_text(dump_config(cfg))
    assert load_config(tmp_path / "c.yaml") == cfg


@pytest.mark.parametrize(
    "override, message",
    [
        ("optimzer.lr=1", "unknown key 'optimzer'; did you mean 'optimizer'?"),
        ("optimizer.lrr=1", "unknown key 'optimizer.lrr'; did you mean 'optimizer.lr'?"),
        ("rollout.grop_size=4", "unknown key 'rollout.grop_size'; did you mean 'rollout.group_size'?"),
        ("optimizer.lr=abc", "optimizer.lr='abc': expected float, got str"),
        ("rollout.group_size=2.5", "rollout.group_size=2.5: expected int, got float"),
        ("checkpoint.async_save=1", "checkpoint.async_save=1: expected bool, got int"),
        ("optimizer.lr=-1", "optimizer.lr=-1.0: must be > 0"),
        ("algorithm.name=grpoo", "algorithm.name='grpoo': allowed values are 'grpo'"),
        ("algorithm.agg_mode=mean", "algorithm.agg_mode='mean': allowed values are 'token-mean'"),
        ("algorithm.kl.kind=k4", "algorithm.kl.kind='k4': allowed values are 'k1'"),
        ("algorithm.etr_alpha=0.5", "'algorithm.etr_alpha' has moved: write 'algorithm.params.alpha' instead"),
        ("algorithm.clipo_tau=0.1", "'algorithm.clipo_tau' has moved: write 'algorithm.params.tau' instead"),
        ("algorithm.etr.alpha=1", "'algorithm.etr' has moved: write 'algorithm.params' instead"),
        ("rollout.prompt_buckets=[64, 32]", "rollout.prompt_buckets=[64, 32]: must be strictly increasing"),
        ("mesh.tensor=2", "mesh.tensor=2 but mesh.rules='fsdp'"),
        ("rewards.nosuch.weight=1", "no list entry 'nosuch'"),
        (
            "rewards.answer.on_error=ignore",
            "rewards[answer].on_error='ignore': allowed values are 'zero', 'skip'",
        ),
        ("rewards.0.wieght=1", "unknown key 'rewards.0.wieght'; did you mean 'rewards.0.weight'?"),
        ("optimizer.lr", "expected key=value"),
        ("model.preset.x=1", "'model.preset' holds 'tiny_siamese', not a mapping"),
        ("model.hf_path=/x", "set exactly one of model.preset, model.hf_path, model.checkpoint"),
        ("algorithm.name=gdpo", None),
        ("rollout.group_size=1", "rollout.group_size=1: group-relative algorithms need group_size >= 2"),
        ("train=3", "train=3: expected a mapping, got int"),
    ],
)
def test_errors_name_the_key(override, message):
    if message is None:
        assert load_config(None, [override]).algorithm.name == Algo.GDPO
        return
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    text = str(e.value)
    assert message in text and "\n" not in text


OLD_LAYOUT = """
  etr: {alpha: 0.0, beta: 0.0, adv_max: 3.0}
  gdpo: {batch_norm: sample}
  gd2po: {mode: hard, tau: 0.2, eps_snr: 1.0e-06}
  clipo: {tau: 0.05, lam: 0.2, head_dim: 512, lr: 0.001, warmup_steps: 0}
  dapo: {max_tries: 8, filter_rewards: []}
  sft: {lam: 0.1}
  reinforce_pp: {gamma: 1.0}
"""  # every method's section, as the resolved config.yaml of a run before `algorithm.params` holds them


def test_a_run_config_of_the_earlier_layout_loads_and_its_changed_sections_are_refused(tmp_path):
    """A config.yaml written before the methods' parameters moved to `algorithm.params` (`jaxrl eval
    --checkpoint` reads it) loads as the same config when its method sections hold their old defaults; a
    section that set something is refused with its new place."""
    cfg = load_config(None)
    text = dump_config(cfg)
    old = text.replace("algorithm:\n", "algorithm:" + OLD_LAYOUT, 1).replace(
        "    name: ppo_clip\n    params: {}\n", "    name: ppo_clip\n    gspo_low: 0.0003\n    cispo_w_min: null\n")
    assert old.count("etr:") == 1 and "gspo_low" in old  # the old sections are there
    (tmp_path / "old.yaml").write_text(old)
    assert load_config(tmp_path / "old.yaml") == cfg
    (tmp_path / "set.yaml").write_text(old.replace("sft: {lam: 0.1}", "sft: {lam: 0.5}"))
    with pytest.raises(ConfigError, match=r"^'algorithm.sft' has moved: write 'algorithm.params' instead$"):
        load_config(tmp_path / "set.yaml")
    (tmp_path / "obj.yaml").write_text(old.replace("gspo_low: 0.0003", "gspo_low: 0.001"))
    with pytest.raises(ConfigError, match=r"'algorithm.objective.gspo_low' has moved: write "
                                          r"'algorithm.objective.params.clip_low' instead"):
        load_config(tmp_path / "obj.yaml")


def test_a_methods_parameters_are_its_records_and_refused_for_another():
    """`algorithm.params` is checked against the selected record's class (`jaxrl.algorithms.ETRParams`): a
    misspelt key names the nearest one, a parameter of another method is refused, the values are typed."""
    cfg = load_config(None, ["algorithm.name=etr", "algorithm.params.alpha=0.5", "algorithm.params.adv_max=2"])
    assert cfg.algorithm.params == {"alpha": 0.5, "adv_max": 2}
    with pytest.raises(ConfigError, match=r"unknown key 'algorithm.params.alpah'; did you mean 'algorithm.params."
                                          r"alpha'\? \(valid keys of algorithm.params: alpha, beta, adv_max\)"):
        load_config(None, ["algorithm.name=etr", "algorithm.params.alpah=1"])
    with pytest.raises(ConfigError, match=r"unknown key 'algorithm.params.max_tries'"):
        load_config(None, ["algorithm.name=etr", "algorithm.params.max_tries=3"])  # dapo's, not etr's
    with pytest.raises(ConfigError, match=r"algorithm.params.alpha=-1.0: must be >= 0"):
        load_config(None, ["algorithm.name=etr", "algorithm.params.alpha=-1"])


def test_file_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("optimizer: {lr: 1e-3, betas: [0.9, 0.99]}\n")
    with pytest.raises(ConfigError, match="unknown key 'optimizer.betas'"):
        load_config(bad)
    bad.write_text("model: [1, 2\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(bad)
    bad.write_text("- 1\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(bad)
    bad.write_text("rewards:\n  - {weight: 1}\n")
    with pytest.raises(ConfigError, match=r"rewards\[0\]: missing required key\(s\) name"):
        load_config(bad)
    bad.write_text("rewards:\n  - {name: a, type: function}\n")
    with pytest.raises(ConfigError, match="module:function"):
        load_config(bad)
    bad.write_text("rewards:\n  - {name: a, type: format}\n  - {name: a, type: format}\n")
    with pytest.raises(ConfigError, match="reward names must be unique"):
        load_config(bad)
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "missing.yaml")


def test_configs_are_frozen():
    cfg = load_config(None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.optimizer.lr = 1.0  # type: ignore[misc]


CONFIGS = sorted((Path(__file__).parents[2] / "configs").glob("*.yaml"))


def _judge_models_present(spec, present: Path):
    """The spec with each judge model it names by path (`judge` / `proxy`: {model: PATH}) that this machine
    lacks replaced by `present`, so that everything else in it is still resolved here."""
    params = dict(spec.params)
    for key in ("judge", "proxy"):
        value = params.get(key)
        if isinstance(value, dict) and "model" in value and not Path(value["model"]).expanduser().exists():
            params[key] = {**value, "model": str(present)}
    return dataclasses.replace(spec, params=params)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_configs_load_and_start_with_the_command(path, tmp_path):
    first = path.read_text().splitlines()[0]
    if path.name.startswith("rm_"):
        from jaxrl.reward_model.config import load_rm_config

        cfg = load_rm_config(path)
        assert first.startswith("# Run with: jaxrl train-rm"), first
    else:
        cfg = load_config(path)
        assert first.startswith(("# Run with: jaxrl train", "# Run with: jaxrl launch")), first
    if path.name == "quickstart.yaml":
        assert cfg == load_config(None)  # the embedded default is this very file
    for spec in getattr(cfg, "rewards", ()):  # every reward of a shipped RL config resolves to a callable
        assert callable(build_reward(_judge_models_present(spec, tmp_path)).fn)


def test_home_directory_in_paths_is_expanded():
    cfg = load_config(
        None, ["model.preset=null", "model.hf_path=~/models/x", "tokenizer.kind=hf", "tokenizer.path=~/tok"]
    )
    assert cfg.model.hf_path == str(Path.home() / "models" / "x") and cfg.tokenizer.path == str(
        Path.home() / "tok"
    )


def test_cli_config_error_exits_2_with_one_line(capsys):
    pytest.importorskip("jaxrl.commands.train")
    assert main(["train", "--set", "optimzer.lr=1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "jaxrl train: error: unknown key 'optimzer'; did you mean 'optimizer'? (valid keys: model, "
        "tokenizer, data, rollout, algorithm, rewards, optimizer, checkpoint, logging, mesh, "
        "sft_warmup, train, env, multi_agent)"
    )


def test_old_flat_algorithm_keys_in_a_file_name_their_new_place(tmp_path):
    """A config written for the flat `algorithm:` layout fails at load with the key's new place."""
    text = default_config_text().replace("  kl: {beta: 0.0}", "  kl_beta: 0.0")
    (tmp_path / "old.yaml").write_text(text)
    with pytest.raises(ConfigError, match="'algorithm.kl_beta' has moved: write 'algorithm.kl.beta' instead"):
        load_config(tmp_path / "old.yaml")


def test_kl_in_the_reward_is_refused_for_per_reward_normalisation():
    """GDPO / GD²PO normalise each reward column within its group: a KL column there would lose β."""
    for name in ("gdpo", "gd2po"):
        with pytest.raises(ConfigError, match="algorithm.kl.where='reward': .* use kl.where: loss"):
            load_config(None, [f"algorithm.name={name}", "algorithm.kl.beta=0.1", "algorithm.kl.where=reward"])
    assert load_config(None, ["algorithm.name=grpo", "algorithm.kl.beta=0.1", "algorithm.kl.where=reward"])
