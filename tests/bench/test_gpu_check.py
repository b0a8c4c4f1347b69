"""bench/gpu_check.py runs end to end on CPU with --small and reports every field."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

from paths import REPO


def test_gpu_check_small_on_cpu_reports_every_field(tmp_path):
  out = tmp_path / "check.json"
  cmd = [sys.executable, "bench/gpu_check.py", "--small", f"--json={out}"]
  res = subprocess.run(
    cmd,
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=600,
    env=dict(os.environ, JAX_PLATFORMS="cpu"),
  )
  assert res.returncode == 0, res.stderr[-3000:]
  check = json.loads(out.read_text())
  assert json.loads(res.stdout) == check  # stdout is the JSON alone
  assert {
    "platform",
    "device_kind",
    "jax_version",
    "bf16_vs_f32",
    "matmul_peak_tflops",
    "learner",
    "attention",
    "sampler",
    "total_seconds",
  } <= set(check)
  assert check["platform"] == "cpu"

  num = check["bf16_vs_f32"]
  assert math.isfinite(num["max_abs_diff"]) and num["max_abs_diff"] > 0  # bf16 really differs
  assert num["max_abs_diff"] < 0.05 * num["max_abs_logit"]
  assert check["matmul_peak_tflops"] > 0

  assert check["learner"]["blockwise"]["tokens_per_s"] > 0
  assert 0 < check["learner"]["blockwise"]["mfu"]
  assert check["learner"]["cudnn"] == {"skipped": "needs a GPU"}

  attn = check["attention"]
  assert attn["blockwise"]["diff"]["input_dtype"] == "float32"
  assert attn["blockwise"]["diff"]["max_abs_vs_dense_f32"] < 1e-4
  assert attn["blockwise"]["fwd_bwd_ms"] > 0 and attn["dense"]["fwd_bwd_ms"] > 0
  assert attn["cudnn"] == {"skipped": "needs a GPU"}

  samp = check["sampler"]
  assert samp["generated"] == samp["prompts"] * samp["new_tokens"] and samp["tokens_per_s"] > 0
  assert "error" not in json.dumps(check)
