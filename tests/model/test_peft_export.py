"""LoRA adapters in PEFT's layout (rlvr.model.peft_io): the real `peft` package loads what
we write and computes our merged model's logits; reading it back is exact."""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import traverse_util
from peft import PeftModel
from transformers import AutoModelForCausalLM

from rlvr import model
from rlvr.model import lora, peft_io
from rlvr.model.lora import LoraConfig

LC = LoraConfig(rank=4, alpha=8.0, dropout=0.05)  # all 7 linears


def random_adapters(params, cfg: LoraConfig, seed: int = 1, b_std: float = 0.05):
  """Adapters with B non-zero too (fresh ones have B = 0: a no-op)."""
  rng = np.random.RandomState(seed)
  return jax.tree_util.tree_map_with_path(
    lambda p, x: (
      jnp.asarray(rng.randn(*x.shape).astype(np.float32) * b_std) if p[-1].key == "lora_b" else x
    ),
    lora.init_adapters(params, cfg, jax.random.key(seed)),
  )


def test_peft_loads_our_adapter_and_computes_the_merged_model(tiny_dirs, tmp_path):
  cfg, params = model.load_hf(tiny_dirs["qwen2"])
  ad = random_adapters(params, LC)
  out = peft_io.save_adapter(str(tmp_path / "adapter"), cfg, LC, ad)
  assert sorted(os.listdir(out)) == [peft_io.CONFIG_FILE, peft_io.WEIGHTS_FILE]
  with open(os.path.join(out, peft_io.CONFIG_FILE)) as f:
    config = json.load(f)
  assert config["target_modules"] == list(peft_io.HF_MODULES.values())
  assert (config["r"], config["lora_alpha"], config["peft_type"]) == (4, 8.0, "LORA")

  tokens = np.random.RandomState(7).randint(3, 700, (2, 40)).astype(np.int32)
  ours = np.asarray(model.forward(lora.merge(params, ad, LC), jnp.asarray(tokens), config=cfg))
  hf = AutoModelForCausalLM.from_pretrained(tiny_dirs["qwen2"], dtype=torch.float32)
  pm = PeftModel.from_pretrained(hf, out).eval()
  with torch.no_grad():
    ref = pm(torch.tensor(tokens)).logits.numpy()
    with pm.disable_adapter():
      base = pm(torch.tensor(tokens)).logits.numpy()
  np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=0)
  assert np.abs(ref - base).max() > 0.1  # the adapter matters far beyond the tolerance

  got_cfg, got = peft_io.load_adapter(out, cfg)
  assert got_cfg == LC
  flat, want = traverse_util.flatten_dict(got), traverse_util.flatten_dict(ad)
  assert set(flat) == set(want)
  for k in want:
    assert flat[k].dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(flat[k]), np.asarray(want[k]), err_msg=str(k))


def test_unsupported_or_broken_adapters_are_named(tiny_dirs, tmp_path):
  cfg, params = model.load_hf(tiny_dirs["llama"])  # untied: has an lm_head
  head = LoraConfig(rank=2, targets=("q_kernel", "lm_head"))
  with pytest.raises(ValueError, match="adapters: lm_head cannot be saved"):
    peft_io.save_adapter(
      str(tmp_path / "a"), cfg, head, lora.init_adapters(params, head, jax.random.key(0))
    )
  assert not os.path.exists(tmp_path / "a")
  ad = lora.init_adapters(params, LC, jax.random.key(0))
  bad = jax.tree.map(lambda x: x, ad)
  bad["layers"]["attn"]["o_kernel"]["lora_a"] = bad["layers"]["attn"]["o_kernel"]["lora_a"][..., :3]
  with pytest.raises(ValueError, match=r"layers/attn/o_kernel/lora_a has shape \(3, 4, 32, 3\)"):
    peft_io.save_adapter(str(tmp_path / "b"), cfg, LC, bad)
  out = peft_io.save_adapter(str(tmp_path / "c"), cfg, LC, ad)
  qwen3 = model.load_hf(tiny_dirs["qwen3"])[0]  # other head layouts
  with pytest.raises(
    peft_io.AdapterError, match=r"layers\.0\.self_attn\.o_proj\.lora_A\.weight' has"
  ):
    peft_io.load_adapter(out, qwen3)
  with open(os.path.join(out, peft_io.CONFIG_FILE)) as f:
    config = json.load(f)
  with open(os.path.join(out, peft_io.CONFIG_FILE), "w") as f:
    json.dump(dict(config, use_dora=True), f)
  with pytest.raises(peft_io.AdapterError, match=f"{peft_io.CONFIG_FILE}: use_dora is True"):
    peft_io.load_adapter(out, cfg)
