"""Clients of a real vLLM server started with an API key (as `launch.serve_vllm --api_key`
starts it): the QbQ teacher, `launch.compose` and the sampler send the key they are given,
else $VLLM_API_KEY (`rlvr.sampling.http`); without one the server refuses them (HTTP 401).
One extra server for the whole module."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from paths import REPO

from configs import tiny_qbq
from rlvr import methods
from rlvr.methods import qbq as qbq_method
from rlvr.model.config import ModelConfig
from rlvr.sampling import SamplingParams
from rlvr.sampling.assistant import AssistantError
from rlvr.sampling.http import API_KEY_ENV
from rlvr.sampling.vllm_sampler import SamplerError, VLLMSampler
from rlvr.sampling.vllm_server import ServerOptions, start_server

AIME = os.path.join(REPO, "data", "math_aime_eval.jsonl")
KEY = "rlvr-test-key"


@pytest.fixture(scope="module")
def keyed_server(served_model_dir, tmp_path_factory):
  """The session's served model behind a second server that requires KEY."""
  log = str(tmp_path_factory.mktemp("keyed") / "vllm.log")
  server = start_server(
    served_model_dir, ServerOptions(max_model_len=1024, api_key=KEY), log_path=log
  )
  print(f"\nkeyed vLLM server up at {server.url} after {server.startup_s:.1f}s")
  yield server
  server.stop()


def _qbq_settings(url: str, api_key: str, workdir: str):
  cfg = tiny_qbq.get_config()
  cfg.workdir = workdir
  cfg.qbq.teacher, cfg.qbq.teacher_max_tokens = url, 8
  cfg.sampler.api_key = api_key
  return methods.check(cfg)  # the method's settings, as a run makes them at launch


def test_qbq_teacher_sends_the_configured_or_environment_key(keyed_server, tmp_path, monkeypatch):
  monkeypatch.delenv(API_KEY_ENV, raising=False)
  with pytest.raises(AssistantError, match=f"{keyed_server.url}/v1/models: HTTP 401"):
    qbq_method.make(_qbq_settings(keyed_server.url, "", str(tmp_path)), [])
  with pytest.raises(AssistantError, match="HTTP 401"):  # a wrong key is no key
    qbq_method.make(_qbq_settings(keyed_server.url, "wrong", str(tmp_path)), [])
  method = qbq_method.make(_qbq_settings(keyed_server.url, KEY, str(tmp_path)), [])
  assert [type(t) for t in method.external(["Compute 1+1.", "Compute 2+3."])] == [str, str]
  monkeypatch.setenv(API_KEY_ENV, KEY)  # sampler.api_key unset: the environment's key
  method = qbq_method.make(_qbq_settings(keyed_server.url, "", str(tmp_path)), [])
  assert isinstance(method.external(["Compute 1+1."])[0], str)


def _compose(out: str, url: str, env: dict, *extra: str) -> subprocess.CompletedProcess:
  cmd = [
    sys.executable,
    "-m",
    "launch.compose",
    f"--source={AIME}",
    f"--out={out}",
    f"--url={url}",
    "--n=1",
    "--max_tokens=16",
    *extra,
  ]
  return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_launch_compose_sends_the_flag_or_environment_key(keyed_server, tmp_path):
  env = {k: v for k, v in os.environ.items() if k != API_KEY_ENV}
  r = _compose(str(tmp_path / "none.jsonl"), keyed_server.url, env)
  assert r.returncode == 1 and "HTTP 401" in r.stderr, r.stderr[-2000:]
  for name, run_env, extra in (
    ("flag", env, [f"--api_key={KEY}"]),
    ("env", dict(env, **{API_KEY_ENV: KEY}), []),
  ):
    out = str(tmp_path / f"{name}.jsonl")
    r = _compose(out, keyed_server.url, run_env, *extra)
    assert r.returncode == 0, (name, r.stderr[-2000:])
    with open(out + ".report.json") as f:
      report = json.load(f)
    assert report["finished"] == 1 and report["this_run"]["requests"] >= 2, (name, report)
    assert "error" not in report["this_run"], (name, report)


def test_vllm_sampler_sends_the_given_or_environment_key(
  keyed_server, served_model_dir, monkeypatch
):
  monkeypatch.delenv(API_KEY_ENV, raising=False)
  cfg = ModelConfig.from_hf(served_model_dir)
  sp = SamplingParams(n=1, max_tokens=4, ignore_eos=True)

  def generate(api_key):
    sampler = VLLMSampler(
      keyed_server.url, model_config=cfg, eos_token_id=cfg.eos_token_id, api_key=api_key, retries=0
    )
    try:
      return sampler.generate([[5, 6, 7]], sp)
    finally:
      sampler.close()

  with pytest.raises(SamplerError, match=f"{keyed_server.url}/v1/completions: HTTP 401"):
    generate(None)
  assert len(generate(KEY)[0][0].token_ids) == 4
  monkeypatch.setenv(API_KEY_ENV, KEY)
  assert len(generate(None)[0][0].token_ids) == 4
