"""Model paths as users write them: hub ids through a locally laid out HF cache (offline),
missing directories and unknown ids as one line naming the field."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import tiny_run
from paths import REPO

from rlvr.model import hub

REVISION = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory, tiny_dirs):
  """An HF hub cache holding `rlvr-test/tiny-qwen3` as huggingface_hub lays one out."""
  cache = tmp_path_factory.mktemp("hf_cache")
  repo = cache / "models--rlvr-test--tiny-qwen3"
  shutil.copytree(tiny_dirs["qwen3"], repo / "snapshots" / REVISION)
  (repo / "refs").mkdir()
  (repo / "refs" / "main").write_text(REVISION)
  return cache


def _resolve_offline(cache, repo_id):
  code = (
    "import sys; from rlvr.model import hub\n"
    "try: print(hub.resolve(sys.argv[1]))\n"
    "except FileNotFoundError as e: print('ERROR', e)\n"
  )
  out = subprocess.run(
    [sys.executable, "-c", code, repo_id],
    cwd=REPO,
    env=tiny_run.env(HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1"),
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert out.returncode == 0, out.stderr[-2000:]
  return out.stdout.strip()


def test_a_hub_id_resolves_to_its_cached_snapshot_offline(hub_cache):
  from rlvr import model

  path = _resolve_offline(hub_cache, "rlvr-test/tiny-qwen3")
  assert path == str(hub_cache / "models--rlvr-test--tiny-qwen3" / "snapshots" / REVISION)
  cfg, _ = model.load_hf(path)
  assert cfg.num_layers >= 1
  missing = _resolve_offline(hub_cache, "rlvr-test/not-cached")
  assert missing.startswith(
    "ERROR model.path: hub id rlvr-test/not-cached is not in the HF "
    f"cache ({hub_cache}) and HF_HUB_OFFLINE is set"
  ), missing


def test_paths_that_are_no_model_name_the_field(tmp_path, tiny_dirs):
  assert hub.resolve(tiny_dirs["qwen3"]) == tiny_dirs["qwen3"]
  with pytest.raises(FileNotFoundError, match=r"^model.path: no such model directory /no/such"):
    hub.resolve("/no/such/dir")
  with pytest.raises(FileNotFoundError, match=r"has no config.json"):
    hub.resolve(str(tmp_path))
  with pytest.raises(FileNotFoundError, match=r"^--model: no such model directory"):
    hub.resolve("./missing-model", "--model")


def test_launch_train_names_a_missing_model_dir_in_one_line(tmp_path):
  out = tiny_run.launch(tmp_path, "--config.model.path=/no/such/model", timeout=300)
  assert out.returncode != 0
  assert out.stderr.strip().splitlines()[-1] == (
    "launch.train: model.path: no such model directory /no/such/model (nor a hub id "
    "org/name) (--verbose for the traceback)"
  ), out.stderr[-2000:]


def test_the_tiny_model_cache_is_named_and_rlvr_cache_dir_moves_it(tmp_path, monkeypatch, capsys):
  from configs import tiny_rlvr
  from rlvr.run import workdir

  cfg = tiny_rlvr.get_config()  # model.path "": a tiny random model, cached outside the run
  monkeypatch.delenv("RLVR_CACHE_DIR", raising=False)
  home = workdir.prepare_model(cfg.model)  # in ~/.cache/rlvr, as tests/run/test_oom.py builds it
  assert os.path.dirname(home) == os.path.expanduser("~/.cache/rlvr")
  name = os.path.basename(home)
  for where, setting in (("env", ""), ("config", str(tmp_path / "config"))):
    cache = tmp_path / where
    cache.mkdir()
    os.symlink(home, cache / name)  # the model already there
    monkeypatch.setenv("RLVR_CACHE_DIR", str(tmp_path / "env"))
    cfg.model.cache_dir = setting
    capsys.readouterr()
    assert workdir.prepare_model(cfg.model) == str(cache / name)
    assert (
      capsys.readouterr().out
      == f"model: tiny random model from {cache / name} (model.cache_dir or $RLVR_CACHE_DIR moves it)\n"
    )
