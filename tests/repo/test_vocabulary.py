"""docs/coming-from-verl-trl.md against `rlvr.common.vocabulary`: the doc's tables hold the
same pairs as the code's, every rlvr path they name is a field of the config, their commands
pass the launch's checks, and a flag or config in verl's or TRL's words gets one line naming
rlvr's."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import pytest
import tiny_run
from absl import flags
from ml_collections import config_flags
from paths import REPO

from rlvr import rollout
from rlvr.common import settings, vocabulary

DOC = os.path.join(REPO, vocabulary.DOC)
CONFIG = os.path.join(REPO, "configs", "tiny_rlvr.py")


def _rows(whose: str) -> list[list[str]]:
  """The cells of each row of the table whose first header cell is `whose`."""
  lines = open(DOC).read().splitlines()
  start = lines.index(f"| {whose} | rlvr | how it differs |")
  rows = []
  for line in lines[start + 2 :]:
    if not line.startswith("|"):
      break
    rows.append([cell.strip() for cell in line.strip("|").split(" | ")])
  return rows


def _pairs(whose: str) -> dict[str, str | None]:
  pairs = {}
  for theirs, ours, _ in _rows(whose):
    [name] = re.fullmatch(r"`([^`]+)`", theirs).groups()
    assert name not in pairs, f"{whose} {name}: two rows"
    pairs[name] = None if ours == "none" else re.fullmatch(r"`([^`]+)`", ours).group(1)
  return pairs


def _config_paths() -> set[str]:
  """Every path of the config, sections and leaves (rl, rl.learner, rl.learner.lora.rank)."""
  from configs import tiny_rlvr

  def walk(d, prefix):
    for k, v in d.items():
      yield f"{prefix}{k}"
      if isinstance(v, dict):
        yield from walk(v, f"{prefix}{k}.")

  return set(walk(tiny_rlvr.get_config().to_dict(), ""))


@pytest.mark.parametrize("whose", sorted(vocabulary.TABLES))
def test_the_docs_table_holds_the_codes_pairs(whose):
  assert _pairs(whose) == vocabulary.TABLES[whose]


def test_every_rlvr_path_the_tables_name_is_a_config_field():
  paths = _config_paths()
  theirs = {name for table in vocabulary.TABLES.values() for name in table}
  tops = {p for p in paths if "." not in p}
  named = {rlvr for table in vocabulary.TABLES.values() for rlvr in table.values() if rlvr}
  for whose in vocabulary.TABLES:
    for _, ours, differs in _rows(whose):
      for token in re.findall(r"`([^`]+)`", f"{ours} {differs}"):
        path = token.split("=", 1)[0].strip()  # `rl.learner.policy_loss="cispo"`
        dotted = re.fullmatch(r"[a-z_]+(\.[a-z_0-9]+)+", path)
        if dotted and path.split(".")[0] in tops and path not in theirs:
          named.add(path)
  assert sorted(named - paths) == []


def _flag_line(override: str) -> str:
  from launch import train

  argv = ["train", f"--config={CONFIG}", f"--config.{override}"]
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file(
    "config", None, "", flag_values=fv, lock_config=True, sys_argv=argv
  )
  with pytest.raises(Exception) as e:  # noqa: B017 - absl and ml_collections raise many kinds
    fv(argv)
  return train.flag_error(e.value, argv)


@pytest.mark.parametrize(
  "override, line",
  [
    (
      "rl.loop.num_generations=8",
      "unknown config field rl.loop.num_generations (TRL's name); rlvr's is rl.loop.group_size",
    ),
    (
      "rl.learner.beta=0.04",
      "unknown config field rl.learner.beta (TRL's name); rlvr's is rl.learner.kl_beta",
    ),
    (
      "rl.loop.n=8",
      "unknown config field rl.loop.n (verl's actor_rollout_ref.rollout.n); rlvr's is "
      "rl.loop.group_size",
    ),
    (
      "actor_rollout_ref.rollout.n=8",
      "unknown config field actor_rollout_ref.rollout.n (verl's name); rlvr's is "
      "rl.loop.group_size",
    ),
    (
      "rl.learner.optim.lr=1e-6",
      "unknown config field rl.learner.optim.lr (verl's actor_rollout_ref.actor.optim.lr); "
      "rlvr's is rl.learner.learning_rate",
    ),
    (
      "rl.loop.max_prompt_length=512",
      "unknown config field rl.loop.max_prompt_length (verl's data.max_prompt_length and "
      "TRL's name); rlvr's is rl.loop.max_prompt_len",
    ),
    (
      "rl.learner.entropy_coeff=0.01",
      "unknown config field rl.learner.entropy_coeff (verl's "
      "actor_rollout_ref.actor.entropy_coeff); rlvr has no such setting "
      "(docs/coming-from-verl-trl.md)",
    ),
    # rlvr's own words keep the launch's hint: the fields of that name, or the section's own
    (
      "rl.learner.temperature=0.7",
      "unknown config field rl.learner.temperature; did you mean eval.sampling.temperature or "
      "rl.loop.temperature?",
    ),
    ("eval.n=4", "unknown config field eval.n; did you mean eval.sampling.n?"),
    # a moved rlvr field is told where it moved, not verl's name it shares
    (
      "rl.loop.ppo_epochs=2",
      "rl.loop.ppo_epochs: moved to rl.learner.ppo_epochs; set that instead",
    ),
  ],
)
def test_a_flag_in_their_words_is_one_line_naming_rlvrs(override, line):
  assert _flag_line(override) == line


def test_the_docs_examples_print_what_the_launch_prints():
  shown = re.findall(
    r"^\$ python -m launch\.train --config=configs/tiny_rlvr\.py --config\.(\S+)\n"
    r"launch\.train: (.*)$",
    open(DOC).read(),
    re.M,
  )
  assert len(shown) == 2
  for override, line in shown:
    assert _flag_line(override) == line


def test_a_config_file_in_their_words_is_one_line_naming_rlvrs():
  with pytest.raises(ValueError) as e:
    settings.frozen(rollout.RLConfig, {"num_generations": 8, "batch": 2}, prefix="rl.loop.")
  assert str(e.value) == (
    "unknown config field rl.loop.num_generations (TRL's name); rlvr's is rl.loop.group_size"
  )
  with pytest.raises(ValueError) as e:
    settings.frozen(rollout.RLConfig, {"rollout": {"n": 8}})
  assert str(e.value) == (
    "unknown config field RLConfig.rollout.n (verl's actor_rollout_ref.rollout.n); rlvr's is "
    "rl.loop.group_size"
  )
  with pytest.raises(ValueError, match=r"RLConfig: unknown config fields \['batch'\]"):
    settings.frozen(rollout.RLConfig, {"batch": 2})


def test_the_docs_commands_pass_the_launchs_checks():
  from launch import train  # its list parser for `--config.<list field>=...`
  from rlvr.run import experiment

  doc = open(DOC).read()
  blocks = re.findall(r"```\n(python -m launch\.train .*?)```", doc, re.S)
  assert len(blocks) == 2
  for block in blocks:
    argv = ["train", *shlex.split(block.replace("\\\n", " "))[2:]]
    argv = [re.sub(r"^--config=", f"--config={REPO}/", a) for a in argv]  # run from the repo
    fv = flags.FlagValues()
    config_flags.DEFINE_config_file(
      "config", None, "", flag_values=fv, lock_config=True, sys_argv=argv
    )
    try:
      fv(argv)
    except Exception as e:  # noqa: BLE001 - absl and ml_collections raise many kinds
      pytest.fail(train.flag_error(e, argv))
    experiment.check(fv.config)


def test_launch_prints_the_line_and_stops():
  """The whole path of a user's command: one line on stderr, exit 2, nothing built."""
  bad = subprocess.run(
    [sys.executable, "-m", "launch.train", f"--config={CONFIG}", "--config.rl.loop.n=8"],
    cwd=REPO,
    env=tiny_run.env(),
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert bad.returncode == 2
  assert bad.stderr.strip().splitlines() == [
    "launch.train: unknown config field rl.loop.n (verl's actor_rollout_ref.rollout.n); "
    "rlvr's is rl.loop.group_size"
  ]
