"""bench/plan.py compiles a config's update for fake devices and reports the memory plan."""

from __future__ import annotations

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_plan_of_a_small_config_has_every_field(tmp_path):
  out = tmp_path / "plan.json"
  cmd = [
    sys.executable,
    "bench/plan.py",
    "--config=configs/tiny_rlvr.py",
    "--devices=4",
    "--model=config",
    f"--json={out}",
    "--config.rl.learner.micro_batches=2",
  ]
  res = subprocess.run(
    cmd,
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=600,
    env=dict(os.environ, JAX_PLATFORMS="cpu"),
  )
  assert res.returncode == 0, res.stderr[-3000:]
  plan = json.loads(out.read_text())
  assert plan["devices"] == 4 and plan["mesh"] == {"data": 1, "fsdp": 4, "tensor": 1}
  assert plan["rows_per_step"] == 16 * 8 and plan["micro_batches"] == 2
  assert plan["rows_per_device_per_micro_batch"] == 16
  g = plan["gib_per_device"]
  assert set(g) == {
    "params",
    "optimizer",
    "inputs (state + batch)",
    "temporaries (grads, activations)",
    "outputs not aliased",
    "total",
  }
  assert 0 < g["params"] < g["inputs (state + batch)"] <= g["total"] < plan["budget_gib"]
  assert abs(g["optimizer"] / g["params"] - 2) < 1e-2  # Adam: two f32 moments (+ a count)
  lp = plan["old_logprobs_gib_per_device"]
  assert set(lp) == {"temporaries", "total (with the optimizer state)"}
  assert 0 < lp["temporaries"] < lp["total (with the optimizer state)"] < plan["budget_gib"]
  assert plan["fits"] is True and plan["model_tflops_per_step_per_device"] > 0
  assert plan["xla_tflops_loop_bodies_once"] > 0
  assert "DOES NOT FIT" not in res.stdout and "fits" in res.stdout
