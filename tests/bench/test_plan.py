"""bench/plan.py compiles a config's update for fake devices and reports the memory plan."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from paths import REPO


def _plan(tmp_path, *flags):
  out = tmp_path / "plan.json"
  cmd = [sys.executable, "bench/plan.py", "--devices=4", "--model=config", f"--json={out}", *flags]
  res = subprocess.run(
    cmd,
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=600,
    env=dict(os.environ, JAX_PLATFORMS="cpu"),
  )
  assert res.returncode == 0, res.stderr[-3000:]
  return json.loads(out.read_text()), res.stdout


def test_plan_of_a_small_config_has_every_field(tmp_path):
  plan, stdout = _plan(
    tmp_path, "--config=configs/tiny_rlvr.py", "--config.rl.learner.micro_batches=2"
  )
  assert plan["devices"] == 4
  assert plan["mesh"] == {"data": 1, "fsdp": 4, "expert": 1, "tensor": 1}
  assert plan["rows_per_step"] == 16 * 8 and plan["micro_batches"] == 2
  assert plan["rows_per_device_per_micro_batch"] == 16
  g = plan["gib_per_device"]
  assert set(g) == {
    "params",
    "frozen base (LoRA)",
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
  assert "DOES NOT FIT" not in stdout and "fits" in stdout
  assert plan["active_params_b"] == plan["params_b"]  # dense: every parameter is active
  assert g["frozen base (LoRA)"] == 0 and plan["trained_params_b"] == plan["params_b"]
  # With LoRA the params are the adapters, the base rides frozen beside them.
  lora, stdout = _plan(tmp_path, "--config=configs/tiny_rlvr.py", "--config.rl.learner.lora.rank=8")
  gl = lora["gib_per_device"]
  assert 0 < gl["params"] < gl["frozen base (LoRA)"] and gl["optimizer"] < g["optimizer"]
  assert lora["trained_params_b"] < lora["params_b"] == plan["params_b"]
  assert "LoRA rank 8" in stdout and lora["fits"] is True


def test_plan_of_a_small_moe_config_counts_active_parameters(tmp_path):
  from rlvr.model import ModelConfig

  plan, _ = _plan(tmp_path, "--config=configs/tiny_moe.py", "--config.rl.learner.micro_batches=2")
  c = ModelConfig.from_hf(plan["model"])
  assert c.is_moe and c.num_sparse_layers == c.num_layers
  idle = c.num_sparse_layers * (c.num_experts - c.num_experts_per_tok)
  idle_params = idle * 3 * c.hidden_size * c.moe_intermediate_size
  assert abs((plan["params_b"] - plan["active_params_b"]) * 1e9 - idle_params) < 1
  assert plan["fits"] is True and plan["gib_per_device"]["temporaries (grads, activations)"] > 0
  # FLOPs: 6 x active parameters per token, plus attention.
  tokens = plan["rows_per_step"] * plan["seq_len"]
  attn = 6 * c.num_layers * c.num_heads * c.head_dim * plan["seq_len"] / 2
  want = tokens * (6 * plan["active_params_b"] * 1e9 + attn) / plan["devices"] / 1e12
  assert abs(plan["model_tflops_per_step_per_device"] - want) < 1e-9 * max(want, 1)
