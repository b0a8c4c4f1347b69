"""Every shipped config loads, freezes into the library's dataclasses, and takes a
command-line override of every base key; a mistyped key is an error naming it."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys

import ml_collections
import pytest
import tiny_run
from absl import flags
from ml_collections import config_flags
from paths import REPO

from rlvr import learner, methods, rollout
from rlvr.common import settings
from rlvr.data import datasets
from rlvr.methods import qbq as qbq_method
from rlvr.rewards import RewardConfig
from rlvr.run import evaluation, experiment
from synthesis import svs

CONFIGS = sorted(
  f[:-3]
  for f in os.listdir(os.path.join(REPO, "configs"))
  if f.endswith(".py") and f not in ("__init__.py", "base.py", "cpu.py")
)


_load = tiny_run.config


def _leaves(c: ml_collections.ConfigDict, prefix=""):
  for k in c.keys():
    v = c[k] if not isinstance(c._fields[k], ml_collections.FieldReference) else c._fields[k]
    if isinstance(v, ml_collections.ConfigDict):
      yield from _leaves(v, f"{prefix}{k}.")
    else:
      yield f"{prefix}{k}", v


def _other_value(ref):
  """A different value of the field's type, as command-line text and as Python."""
  value = ref.get() if isinstance(ref, ml_collections.FieldReference) else ref
  kind = ref.get_type() if isinstance(ref, ml_collections.FieldReference) else type(value)
  if kind is bool:
    return str(not value), (not value)
  if kind is int:
    return str(value + 1), value + 1
  if kind is float:
    new = 0.5 if value is None or value == 0 else value / 2
    return repr(new), new
  if kind is str:
    return value, value  # strings are often names a section validates; same value
  if kind in (tuple, list):
    return None, None
  raise AssertionError(f"no override rule for {kind}")


@pytest.mark.parametrize("name", CONFIGS)
def test_config_freezes_and_names_its_method(name):
  c = importlib.import_module(f"configs.{name}").get_config()
  settings.frozen(rollout.RLConfig, c.rl.loop)
  settings.frozen(learner.LearnerConfig, c.rl.learner)
  settings.frozen(learner.LearnerConfig, c.sft.learner)
  settings.frozen(svs.SvSConfig, c.svs)
  settings.frozen(qbq_method.QbQConfig, c.qbq)
  settings.frozen(RewardConfig, c.reward)
  settings.frozen(evaluation.EvalConfig, c.eval.sampling)
  assert c.method in methods.KNOWN
  for path in c.data.eval_paths:  # what a config names ships in the repo (or the library)
    if path in datasets.BUNDLED_EVALS:
      continue
    assert os.path.exists(path) and os.path.abspath(path).startswith(REPO), path
  assert not c.data.train_path.startswith("..")


@pytest.mark.parametrize("name", CONFIGS)
def test_every_base_key_overrides_from_the_command_line(name):
  from configs import base

  base_keys = dict(_leaves(base.get_config()))
  shipped = dict(_leaves(_load(name)))
  assert set(base_keys) <= set(shipped), sorted(set(base_keys) - set(shipped))
  argv, want = [], {}
  for key in base_keys:
    text, value = _other_value(shipped[key])
    if text is not None:
      argv.append(f"--config.{key}={text}")
      want[key] = value
  c = _load(name, *argv)
  for key, value in want.items():
    got = c
    for part in key.split("."):
      got = got[part]
    assert got == value, key
  assert len(want) > 100


def test_a_mistyped_key_is_an_error_naming_it():
  with pytest.raises(AttributeError, match="micro_batchs.*Did you mean.*micro_batches"):
    _load("tiny", "--config.rl.learner.micro_batchs=4")


@pytest.mark.parametrize("ablation", ["naive", "asp", "eup", "keep02", "tiny_eup"])
def test_svs_ablations_change_one_setting_of_their_base(ablation):
  from configs import svs_ablations, svs_dapo17k_qwen25_32b, tiny

  c = svs_ablations.get_config(ablation)
  base = (tiny if ablation.startswith("tiny_") else svs_dapo17k_qwen25_32b).get_config()
  changed = {k for k in base.svs.keys() if base.svs[k] != c.svs[k]}
  assert changed == set(svs_ablations.ABLATIONS[ablation.removeprefix("tiny_")])
  settings.frozen(svs.SvSConfig, c.svs)
  settings.frozen(qbq_method.QbQConfig, c.qbq)


def test_paper_configs_take_verls_mini_batches_and_the_authors_svs_loop():
  from configs import rlvr_dapo17k_qwen25_32b, svs_dapo17k_qwen25_32b

  for mod in (rlvr_dapo17k_qwen25_32b, svs_dapo17k_qwen25_32b):
    c = mod.get_config()
    rl = settings.frozen(rollout.RLConfig, c.rl.loop)
    lc = settings.frozen(learner.LearnerConfig, c.rl.learner)
    assert lc.ppo_mini_batch_size * rl.group_size == 2048 and lc.adv_std_ddof == 1
  assert svs_dapo17k_qwen25_32b.get_config().svs.refill_originals is False


def test_unknown_field_is_named():
  with pytest.raises(ValueError, match=r"RLConfig: unknown config fields \['batch'\]"):
    settings.frozen(rollout.RLConfig, {"batch": 3})


def test_launch_prints_the_resolved_config_and_names_a_bad_key_in_one_line():
  import subprocess
  import sys

  # Commands of their own, not tiny_run.argv's: no --workdir, neither run gets that far.
  env = tiny_run.env()
  ok = subprocess.run(
    [
      sys.executable,
      "-m",
      "launch.train",
      "--config=configs/tiny.py",
      "--config.rl.learner.micro_batches=4",
      "--print_config",
    ],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert ok.returncode == 0, ok.stderr[-2000:]
  assert "micro_batches: 4" in ok.stdout and "template: arithmetic" in ok.stdout
  bad = subprocess.run(
    [
      sys.executable,
      "-m",
      "launch.train",
      "--config=configs/tiny.py",
      "--config.rl.learner.micro_batchs=4",
    ],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert bad.returncode == 2
  assert bad.stderr.strip().splitlines() == [
    "launch.train: unknown config field rl.learner.micro_batchs; "
    "did you mean rl.learner.micro_batches?"
  ]


@pytest.mark.parametrize(
  "override, line",
  [
    ("rl.stepz=5", "unknown config field rl.stepz; did you mean rl.steps?"),
    ("rl.loop.stepz=5", "unknown config field rl.loop.stepz"),
    ("rl.loop.seed=1", "rl.loop.seed: set seed instead (one value for the whole run)"),
    ("rl.loop.pack=True", "rl.loop.pack: moved to rl.learner.pack; set that instead"),
    (
      "rl.loop.ppo_mini_batch_size=4",
      "rl.loop.ppo_mini_batch_size: moved to rl.learner.ppo_mini_batch_size; set that instead",
    ),
    (
      "sft.learner.total_steps=5",
      "sft.learner.total_steps: set sft.steps instead (one value for the whole run)",
    ),
    (
      "rl.learner.total_steps=5",
      "rl.learner.total_steps: set rl.steps instead (one value for the whole run)",
    ),
    ("tracking.tensorboard=False", "unknown config field tracking"),
    (
      "learning_rate=1e-5",  # fields whose last part matches
      "unknown config field learning_rate; did you mean rl.learner.learning_rate or "
      "sft.learner.learning_rate?",
    ),
    ("rl.steps=abc", "rl.steps: must be an integer, got 'abc'"),
    ("rl.loop.group_size='fast", 'rl.loop.group_size: must be an integer, got "\'fast"'),
    ("rl.learner.learning_rate=fast", "rl.learner.learning_rate: must be a number, got 'fast'"),
    ("export_hf=maybe", "export_hf: must be true or false, got 'maybe'"),
    (
      "data.eval_paths=[1,",
      "data.eval_paths: must be comma-separated items or a Python list, got '[1,'",
    ),
  ],
)
def test_a_bad_flag_is_one_line_naming_the_field_and_the_value(override, line):
  from launch import train  # its list parser for `--config.<list field>=...`

  argv = ["train", f"--config={os.path.join(REPO, 'configs', 'tiny.py')}", f"--config.{override}"]
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file(
    "config", None, "", flag_values=fv, lock_config=True, sys_argv=argv
  )
  with pytest.raises(Exception) as e:  # noqa: B017 - absl and ml_collections raise many kinds
    fv(argv)
  assert train.flag_error(e.value, argv) == line


def test_the_run_has_one_seed():
  """rl.loop.seed is the run's seed, filled at launch; a config that sets it is told where
  the value lives."""
  from configs import tiny_rlvr
  from rlvr.run import experiment

  c = tiny_rlvr.get_config()
  assert "seed" not in c.rl.loop
  c.seed = 7
  assert experiment.check(c).rl_loop.seed == 7
  c.rl.loop.seed = 7
  with pytest.raises(ValueError) as e:
    experiment.check(c)
  assert str(e.value) == "rl.loop.seed: set seed instead (one value for the whole run)"


def test_the_learners_settings_live_in_its_section():
  """How a buffer becomes optimizer steps (advantages, mini-batches, old log-probs, packing)
  is rl.learner's; a config that still sets one under rl.loop is told where it moved, and an
  SFT learner that sets one is told that SFT does not read it."""
  from configs import tiny_rlvr
  from rlvr.run import experiment

  assert set(experiment.MOVED) == {f"rl.loop.{name}" for name in learner.RL_ONLY}
  c = tiny_rlvr.get_config()
  c.rl.learner.ppo_mini_batch_size, c.rl.learner.advantage = 4, "rloo"
  checked = experiment.check(c)
  assert (checked.rl_learner.ppo_mini_batch_size, checked.rl_learner.advantage) == (4, "rloo")
  assert checked.rl_loop.batch_shape.mini_batch_rows(checked.rl_learner) == 4 * 8
  old = tiny_rlvr.get_config()
  old.rl.loop.ppo_epochs = 2  # an old config file's line (its sections are not locked)
  with pytest.raises(ValueError) as e:
    experiment.check(old)
  assert str(e.value) == "rl.loop.ppo_epochs: moved to rl.learner.ppo_epochs; set that instead"
  sft = tiny_rlvr.get_config()
  sft.sft.learner.pack = True
  with pytest.raises(ValueError) as e:
    experiment.check(sft)
  assert str(e.value) == (
    "sft.learner.pack: an RL setting (advantages, mini-batches of groups, old log-probs, "
    "packing); SFT does not read it, set rl.learner.pack"
  )


def test_a_learners_horizon_is_its_phases_steps():
  """The cosine horizon of each learner is the steps of its phase, derived at launch: SFT's
  sft.steps, RL's rl.steps; a config that sets one is told where the value lives."""
  from configs import tiny_rlvr
  from rlvr.run import experiment

  c = tiny_rlvr.get_config()
  c.sft.steps, c.rl.steps = 120, 9
  checked = experiment.check(c)
  assert (checked.sft.learner.total_steps, checked.rl_learner.total_steps) == (120, 9)
  assert experiment.derived_paths() == {
    "rl.loop.seed": "seed",
    "rl.learner.total_steps": "rl.steps",
    "sft.learner.total_steps": "sft.steps",
  }
  c.sft.learner.total_steps = 120
  with pytest.raises(ValueError) as e:
    experiment.check(c)
  assert (
    str(e.value) == "sft.learner.total_steps: set sft.steps instead (one value for the whole run)"
  )


def test_a_missing_config_file_is_one_line_naming_it():
  from launch import train

  argv = ["train", "--config=configs/no_such_config.py"]
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=fv, sys_argv=argv)
  with pytest.raises(Exception) as e:  # noqa: B017 - absl and ml_collections raise many kinds
    fv(argv)
    fv.config.to_dict()
  assert train.flag_error(e.value, argv) == "--config: no such file 'configs/no_such_config.py'"


@pytest.mark.parametrize("name", CONFIGS)
def test_every_config_passes_the_start_up_checks(name):
  from rlvr.run import experiment

  c = importlib.import_module(f"configs.{name}").get_config()
  if c.sampler.kind == "vllm" and not c.sampler.local_servers:  # paper configs: servers by flag
    c.sampler.urls = ["http://localhost:8000"]
  if c.method == "qbq" and not c.qbq.teacher:  # the teacher's server: by flag too
    c.qbq.teacher = "http://localhost:8001/v1"
  checked = experiment.check(c)
  assert checked.rl_loop.group_size >= 2 and checked.checkpoint.every >= 1


@pytest.mark.parametrize(
  "override, message",
  [
    ("rl.learner.learning_rate=-1e-4", "rl.learner.learning_rate: must be > 0, got -0.0001"),
    ("sft.learner.learning_rate=-0.001", "sft.learner.learning_rate: must be > 0, got -0.001"),
    ("rl.steps=-3", "rl.steps: must be >= 0, got -3"),
    (
      "rl.log_samples_every=-2",
      "rl.log_samples_every: must be an integer >= 0 (0 = off), got -2",
    ),
    ("rl.loop.group_size=1", "rl.loop.group_size: GRPO needs >= 2 responses per prompt, got 1"),
    ("rl.learner.b2=1.0", "rl.learner.b2: must be in [0, 1), got 1.0"),
    ("sft.steps=-1", "sft.steps / batch_size: must be >= 0 / >= 1, got -1 / 32"),
    ("checkpoint.every=0", "checkpoint.every / keep: must be >= 1, got 0 / 2"),
    ("eval.sampling.n=0", "eval.sampling.n: must be >= 1, got 0"),
    (
      "eval.sampling.top_p=0.0",
      "eval.sampling.temperature / top_p / top_k: must be >= 0 / "
      "in (0, 1] / >= 0, got 1.0 / 0.0 / 0",
    ),
    ("eval.every=-1", "eval.every: must be >= 0 (0 = before and after RL only), got -1"),
    ("data.arithmetic.n_train=-5", "data.arithmetic.n_train: must be >= 0, got -5"),
    ("data.on_bad_row=warn", "data.on_bad_row: unknown 'warn'; expected skip|error"),
    (
      "sampler.kind=vllm",
      "sampler.urls: the vllm sampler needs at least one server URL, or local_servers=1 to "
      "start one for the run",
    ),
    (
      "sampler.local_servers=-1",
      "sampler.local_servers / local_device: must be >= 0 / cpu|gpu, got -1 / 'cpu'",
    ),
    ("sampler.max_concurrency=0", "sampler.max_concurrency: must be >= 1, got 0"),
    ("sampler.retries=-1", "sampler.retries: must be an int >= 0, got -1"),
    # Sections whose classes name their fields (RewardConfig.extraction): the config path.
    (
      "reward.extraction=last",
      "reward.extraction: unknown 'last'; expected one of ('boxed', 'answer_line')",
    ),
    (
      "reward.code.sandbox=docker",
      "reward.code.sandbox: unknown 'docker'; expected one of ('bwrap', 'none')",
    ),
    (
      "reward.code.limits.cpu_s=-1.0",
      "reward.code.limits.cpu_s: expected a positive finite number, got -1.0",
    ),
  ],
)
def test_a_bad_setting_is_refused_in_one_line_naming_it(override, message):
  from rlvr.run import experiment

  c = _load("tiny_rlvr", f"--config.{override}")
  with pytest.raises(ValueError) as e:
    experiment.check(c)
  assert str(e.value) == message


def test_a_rerun_with_other_settings_for_a_finished_phase_stops(tmp_path):
  from rlvr.run import workdir

  c = _load("tiny_rlvr", f"--config.workdir={tmp_path}", "--config.data.arithmetic.n_train=50")
  run = workdir.setup(experiment.check(c))
  workdir.check_phases(run)  # first run: settings recorded
  workdir.check_phases(workdir.setup(experiment.check(c)))  # same settings: reused
  for override, message in (
    (
      "--config.sft.steps=60",
      "sft.steps: the sft phase recorded in "
      f"{tmp_path}/progress.json ran with 400, this run asks for 60",
    ),
    (
      "--config.eval.sampling.n=8",
      "eval.sampling.n: the eval phase recorded in "
      f"{tmp_path}/progress.json ran with 4, this run asks for 8",
    ),
  ):
    changed = _load(
      "tiny_rlvr", f"--config.workdir={tmp_path}", "--config.data.arithmetic.n_train=50", override
    )
    with pytest.raises(ValueError) as e:
      workdir.check_phases(workdir.setup(experiment.check(changed)))
    assert str(e.value).startswith(message), str(e.value)


def test_a_record_without_a_newer_field_resumes_at_its_default(tmp_path):
  """progress.json written before a setting existed: the field ran at its default, so a rerun
  at the default reuses the phase and one that asks for another value stops."""
  from rlvr.run import workdir

  c = _load("tiny_rlvr", f"--config.workdir={tmp_path}", "--config.data.arithmetic.n_train=50")
  run = workdir.setup(experiment.check(c))
  workdir.check_phases(run)
  progress = json.loads((tmp_path / "progress.json").read_text())
  for phase in progress["settings"].values():
    del phase["data.chat_template"]
  (tmp_path / "progress.json").write_text(json.dumps(progress))
  workdir.check_phases(workdir.setup(experiment.check(c)))  # the default: reused, and now recorded
  recorded = json.loads((tmp_path / "progress.json").read_text())["settings"]["sft"]
  assert recorded["data.chat_template"] == ""
  other = _load(
    "tiny_rlvr",
    f"--config.workdir={tmp_path}",
    "--config.data.arithmetic.n_train=50",
    "--config.data.chat_template=none",
  )
  with pytest.raises(ValueError, match="^data.chat_template: the sft phase"):
    workdir.check_phases(workdir.setup(experiment.check(other)))


def test_batches_the_mesh_does_not_split_are_refused():
  from rlvr.run import experiment

  checked = experiment.check(_load("tiny_rlvr"))  # 16 prompts x 8, SFT batches of 32
  experiment.check_mesh(checked, {"data": 2, "fsdp": 4, "tensor": 1})
  with pytest.raises(ValueError) as e:
    experiment.check_mesh(checked, {"data": 1, "fsdp": 3, "tensor": 1})
  assert str(e.value) == (
    "rl.loop.prompts_per_step x group_size: 128 rows do not split over the 3 data-parallel "
    "devices (mesh data x fsdp x expert = 3); use a multiple of 3 or another mesh"
  )
  packed = experiment.check(_load("tiny", "--config.rl.learner.pack_min_rows=6"))
  with pytest.raises(
    ValueError, match=r"^rl.learner.pack_min_rows: 6 rows do not split over the 4"
  ):
    experiment.check_mesh(packed, {"data": 1, "fsdp": 4, "tensor": 1})


@pytest.mark.parametrize(
  "name, override, message",
  [
    (
      "tiny_qbq",
      "rl.steps=17",
      "rl.steps: 17, but qbq.rounds x qbq.steps_per_round = 16; set them to agree",
    ),
    (
      "tiny",
      "svs.template=/no/such/template.txt",
      "svs.template: '/no/such/template.txt' is none of default|code|arithmetic and not a "
      "file to read (No such file or directory)",
    ),
    (
      "tiny_composition",
      "composition.solve_all_threshold=1.5",
      "composition.solve_all_threshold: must be in [0, 1], got 1.5",
    ),
  ],
)
def test_the_methods_own_section_is_checked_before_anything_is_built(
  name, override, message, tmp_path
):
  from rlvr.run import runner

  c = _load(name, f"--config.{override}")
  c.workdir = str(tmp_path / "run")
  with pytest.raises(ValueError) as e:
    runner.run(c)
  assert str(e.value) == message
  assert not os.path.exists(c.workdir)  # refused before the work dir, the model or the data


def test_a_runs_vllm_servers_take_their_options_from_its_settings():
  """One source for each server option: LoRA's rank is rl.learner.lora.rank where adapters
  are pushed, the longest sequence covers evaluation and episodes (rounded up to 256)."""
  from rlvr.run import trainer

  def options(*overrides):
    return trainer.server_options(experiment.check(_load("tiny_rlvr", *overrides)), 2048)

  pushed = options("--config.rl.learner.lora.rank=4", "--config.sampler.lora_adapters=True")
  assert pushed.lora_rank == 4 and pushed.served_model_name == "policy"
  assert options("--config.rl.learner.lora.rank=4").lora_rank == 0  # merged weights pushed
  long_eval = options(
    "--config.eval.sampling.max_tokens=600", "--config.rl.loop.max_prompt_len=100"
  )
  assert long_eval.max_model_len == 768
  assert options("--config.eval.sampling.max_tokens=5000").max_model_len == 2048  # the model's


def test_serve_vllm_refuses_a_flag_its_config_decides(tmp_path):
  done = subprocess.run(
    [
      sys.executable,
      "-m",
      "launch.serve_vllm",
      f"--model={tmp_path}",
      "--config=configs/tiny_rlvr.py",
      "--lora_rank=8",
    ],
    cwd=REPO,
    capture_output=True,
    text=True,
    env=tiny_run.env(),
  )
  assert done.returncode != 0
  assert (
    "--lora_rank: --config decides it (rl.learner.lora.rank with sampler.lora_adapters); "
    "drop --lora_rank" in done.stderr
  ), done.stderr[-2000:]
