"""LoRA adapters <-> PEFT's saved layout (what `PeftModel.from_pretrained` and vLLM load).

A PEFT LoRA directory holds `adapter_config.json` (peft_type "LORA", r, lora_alpha,
target_modules as HF module names, ...) and `adapter_model.safetensors` with, per adapted
HF Linear `M` (e.g. `model.layers.3.self_attn.q_proj`), the weights of its two Linears:

  base_model.model.M.lora_A.weight   [r, in]    (x @ A^T: the down projection)
  base_model.model.M.lora_B.weight   [out, r]

so that M(x) = x W^T + (lora_alpha / r) (x A^T) B^T. Ours (`rlvr.model.lora`) are
A [layers, *in, r] and B [layers, r, *out] with W' = W + (alpha/rank) A @ B over the
flattened in/out dims: per layer, lora_A = A.reshape(-1, r).T and lora_B = B.reshape(r, -1).T.
Both flatten their head dims row-major as `hf_io` does for the base kernels (q/k/v out
[heads, head_dim] -> heads*head_dim, o in [heads, head_dim]), so an adapter lines up with
the HF weight it adapts. Only the seven linear kernels of the blocks map to PEFT modules
here (`lora.ALL_LINEAR`); an adapter on the embedding or the LM head is refused.
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from rlvr.common import fileio
from rlvr.model import hf_io, lora
from rlvr.model.config import ModelConfig
from rlvr.model.lora import LoraConfig
from rlvr.model.safetensors_io import SafetensorsFile, save_file

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PREFIX = "base_model.model."  # PEFT's wrapper (PeftModel.base_model.model) of the HF model
# Our kernel name -> the HF module (last part of its name) it adapts.
HF_MODULES = {
  "q_kernel": "q_proj",
  "k_kernel": "k_proj",
  "v_kernel": "v_proj",
  "o_kernel": "o_proj",
  "gate_kernel": "gate_proj",
  "up_kernel": "up_proj",
  "down_kernel": "down_proj",
}
_KERNELS = {v: k for k, v in HF_MODULES.items()}


class AdapterError(ValueError):
  """An adapter directory or pytree that does not fit the model (names the file or key)."""


def _entries(model_cfg: ModelConfig) -> dict[tuple[str, ...], hf_io.Entry]:
  """param path -> its `hf_io` entry, for the kernels PEFT modules here can adapt."""
  return {
    e.path: e
    for e in hf_io.active_rules(model_cfg)
    if e.path[-1] in HF_MODULES and "moe" not in e.path
  }


def _shapes(entry: hf_io.Entry, rank: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
  """Our (A, B) shapes for the kernel of `entry`: [layers, *in, r], [layers, r, *out]."""
  shape, n_in = tuple(entry.leaf.shape), lora.IN_DIMS[entry.path[-1]]
  return shape[: 1 + n_in] + (rank,), shape[:1] + (rank,) + shape[1 + n_in :]


def _module(entry: hf_io.Entry, i: int) -> str:
  """PEFT's name of layer `i` (of the entry's stack) of the adapted Linear, without the
  `.lora_A.weight` tail."""
  return PREFIX + entry.keys(i).removesuffix(".weight")


def _kernels(adapters) -> dict[tuple[str, ...], tuple[Any, Any]]:
  """kernel path -> (A, B) of an adapters pytree; anything but the 7 linears is refused."""
  flat = traverse_util.flatten_dict(adapters)
  out = {}
  for path in sorted({p[:-1] for p in flat}):
    if path[-1] not in HF_MODULES:
      raise AdapterError(
        f"adapters: {'/'.join(path)} cannot be saved in PEFT's layout here; only the block "
        f"linears {list(lora.ALL_LINEAR)} can (not the embedding or lm_head)"
      )
    a, b = flat.get(path + ("lora_a",)), flat.get(path + ("lora_b",))
    if a is None or b is None:
      raise AdapterError(f"adapters: {'/'.join(path)} needs both lora_a and lora_b")
    out[path] = (a, b)
  return out


def save_adapter(
  path: str,
  model_cfg: ModelConfig,
  lora_cfg: LoraConfig,
  adapters,
  dtype: Any = None,
  base: str = "",
) -> str:
  """Writes `adapters` (trained with `lora_cfg` on a `model_cfg` model) as a PEFT LoRA
  directory at `path`; returns `path`.

  dtype: of the written tensors (default: the adapters'). base: the base model's path or
  hub id, the config's `base_model_name_or_path` (PEFT loads the base from it). The
  directory is written beside `path` and renamed into place (`fileio.atomic_dir`), so `path`
  never holds half an adapter nor files of what it held before. Shapes are checked against
  the model first (AdapterError naming the kernel).
  Multi-host: every process calls this (the adapters are gathered collectively); process 0
  writes.
  """
  path = os.path.abspath(os.fspath(path))
  entries = _entries(model_cfg)
  kernels = _kernels(adapters)
  np_dtype = None if dtype is None else np.dtype(jnp.dtype(dtype))
  if not kernels:
    raise AdapterError("adapters: empty; nothing to save")
  for kpath, (a, b) in kernels.items():
    where = "/".join(kpath)
    entry = entries.get(kpath)
    if entry is None:
      raise AdapterError(f"adapters: {where} is not a kernel of this model")
    for name, x, expected in zip(("lora_a", "lora_b"), (a, b), _shapes(entry, lora_cfg.rank)):
      if tuple(x.shape) != expected:
        raise AdapterError(
          f"adapters: {where}/{name} has shape {tuple(x.shape)}, this model with rank "
          f"{lora_cfg.rank} needs {expected}"
        )
  r = lora_cfg.rank
  tensors: dict[str, np.ndarray] = {}
  for kpath, (a, b) in kernels.items():
    a, b = hf_io.to_host(a), hf_io.to_host(b)
    if np_dtype is not None:
      a, b = a.astype(np_dtype), b.astype(np_dtype)
    for i in range(a.shape[0]):
      module = _module(entries[kpath], i)
      tensors[module + ".lora_A.weight"] = np.ascontiguousarray(a[i].reshape(-1, r).T)
      tensors[module + ".lora_B.weight"] = np.ascontiguousarray(b[i].reshape(r, -1).T)
  if jax.process_index() == 0:
    config = {
      "peft_type": "LORA",
      "task_type": "CAUSAL_LM",
      "base_model_name_or_path": base,
      "r": lora_cfg.rank,
      "lora_alpha": lora_cfg.alpha,
      "lora_dropout": lora_cfg.dropout,
      "target_modules": [HF_MODULES[k] for k in lora.ALL_LINEAR if k in {p[-1] for p in kernels}],
      "bias": "none",
      "fan_in_fan_out": False,
      "use_rslora": False,
      "use_dora": False,
      "inference_mode": True,
    }
    with fileio.atomic_dir(path) as tmp:
      os.makedirs(tmp)
      save_file(tensors, os.path.join(tmp, WEIGHTS_FILE))
      fileio.write_json(os.path.join(tmp, CONFIG_FILE), config)
  hf_io._wait_for_writer(path)
  return path


def _read_config(path: str) -> LoraConfig:
  where = os.path.join(path, CONFIG_FILE)
  try:
    with open(where) as f:
      config = json.load(f)
  except FileNotFoundError:
    raise AdapterError(f"{where}: missing (not a PEFT adapter directory)") from None
  except ValueError as e:
    raise AdapterError(f"{where}: not JSON ({e})") from None
  if not isinstance(config, dict):
    raise AdapterError(f"{where}: expected a JSON object")
  for key, ok, need in (
    ("peft_type", config.get("peft_type") == "LORA", '"LORA"'),
    ("bias", config.get("bias", "none") == "none", '"none"'),
    ("use_rslora", not config.get("use_rslora"), "false"),
    ("use_dora", not config.get("use_dora"), "false"),
    ("fan_in_fan_out", not config.get("fan_in_fan_out"), "false"),
    ("rank_pattern", not config.get("rank_pattern"), "empty"),
    ("alpha_pattern", not config.get("alpha_pattern"), "empty"),
    ("modules_to_save", not config.get("modules_to_save"), "empty"),
    ("lora_bias", not config.get("lora_bias"), "false"),
    ("layers_to_transform", not config.get("layers_to_transform"), "empty"),
    ("layer_replication", not config.get("layer_replication"), "empty"),
    ("target_parameters", not config.get("target_parameters"), "empty"),
  ):
    if not ok:
      raise AdapterError(f"{where}: {key} is {config.get(key)!r}; only {need} is supported")
  targets = config.get("target_modules")
  if not isinstance(targets, list) or not targets:
    raise AdapterError(
      f"{where}: target_modules is {targets!r}; expected a list of module names "
      f"among {list(_KERNELS)}"
    )
  unknown = [t for t in targets if t not in _KERNELS]
  if unknown:
    raise AdapterError(f"{where}: target_modules {unknown} unsupported; known: {list(_KERNELS)}")
  try:
    return LoraConfig(
      rank=config.get("r"),
      alpha=float(config.get("lora_alpha", 8)),
      dropout=float(config.get("lora_dropout", 0.0)),
      targets=tuple(k for k in lora.ALL_LINEAR if HF_MODULES[k] in targets),
    )
  except (TypeError, ValueError) as e:
    raise AdapterError(f"{where}: {e}") from None


def load_adapter(path: str, model_cfg: ModelConfig) -> tuple[LoraConfig, Any]:
  """Reads a PEFT LoRA directory (as `save_adapter` writes it) -> (LoraConfig, adapters),
  the adapters in f32 in `rlvr.model.lora`'s layout. Raises AdapterError naming the file
  and key of anything missing, unsupported or of the wrong shape."""
  path = os.fspath(path)
  cfg = _read_config(path)
  fname = os.path.join(path, WEIGHTS_FILE)
  if not os.path.exists(fname):
    raise AdapterError(f"{fname}: missing")
  try:
    src = SafetensorsFile(fname)
  except (OSError, ValueError, UnicodeDecodeError) as e:
    raise AdapterError(f"{fname}: not a safetensors file ({e})") from None
  used, out = set(), {}
  for kpath, entry in sorted(_entries(model_cfg).items()):
    if kpath[-1] not in cfg.targets:
      continue
    a_shape, b_shape = _shapes(entry, cfg.rank)
    a = np.empty(a_shape, np.float32)
    b = np.empty(b_shape, np.float32)
    for i in range(a_shape[0]):
      module = _module(entry, i)
      for name, dst, hf_shape in (
        ("lora_A", a, (cfg.rank, int(np.prod(a_shape[1:-1])))),
        ("lora_B", b, (int(np.prod(b_shape[2:])), cfg.rank)),
      ):
        key = f"{module}.{name}.weight"
        if key not in src.keys():
          raise AdapterError(f"{fname}: missing tensor {key!r}")
        if src.shape(key) != hf_shape:
          raise AdapterError(
            f"{fname}: tensor {key!r} has shape {src.shape(key)}, expected {hf_shape} "
            f"(r={cfg.rank} on this model)"
          )
        try:
          dst[i] = src.get(key).astype(np.float32).T.reshape(dst.shape[1:])
        except ValueError as e:
          raise AdapterError(f"{fname}: tensor {key!r}: {e}") from None
        used.add(key)
    out[kpath + ("lora_a",)] = jnp.asarray(a)
    out[kpath + ("lora_b",)] = jnp.asarray(b)
  missing = [HF_MODULES[k] for k in cfg.targets if not any(p[-2] == k for p in out)]
  if missing:
    raise AdapterError(f"{path}: target_modules {missing}: this model has no such dense layers")
  extra = sorted(set(src.keys()) - used)
  if extra:
    raise AdapterError(
      f"{fname}: {len(extra)} tensors this model's adapters do not have, e.g. {extra[0]!r}"
    )
  return cfg, traverse_util.unflatten_dict(out)
