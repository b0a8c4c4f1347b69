"""HF checkpoint I/O: safetensors (single file or sharded) <-> our parameter pytree.

One declarative table maps HF tensor names to parameter paths; entries whose
path the config does not have (qkv bias for Llama, q/k norm for Qwen2, the
LM head of a tied model, the dense MLP of a sparse layer) are dropped by comparing
with the abstract params. Per-layer tensors go to the layer's stack
(`decoder.layer_groups`); per-expert tensors (`mlp.experts.{e}.*`) are stacked
expert-major, [layers, experts, ...].
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from rlvr.model import decoder
from rlvr.model.config import ModelConfig
from rlvr.model.safetensors_io import SafetensorsFile, save_file
from rlvr.parallel import sharding


class CheckpointError(ValueError):
  """A checkpoint whose tensors do not match the config (names the HF key)."""


@dataclasses.dataclass(frozen=True)
class KeyRule:
  """HF key (with `{i}` for the layer) -> parameter path, and how the array moves.

  layout: "same"  identical (norms, embedding);
          "flat"  HF [heads*head_dim] -> ours [heads, head_dim] (qkv biases);
          "in"    HF [out, in] Linear weight -> ours [in, *out] (x @ W layout);
          "out"   HF [out, in] Linear weight -> ours [*in, out].
  """

  hf: str
  path: tuple[str, ...]
  layout: str = "same"

  @property
  def per_layer(self) -> bool:
    return "{i}" in self.hf

  @property
  def per_expert(self) -> bool:
    return "{e}" in self.hf


_L = "model.layers.{i}."
KEY_TABLE: tuple[KeyRule, ...] = (
  KeyRule("model.embed_tokens.weight", ("embedding",)),
  KeyRule(_L + "self_attn.q_proj.weight", ("layers", "attn", "q_kernel"), "in"),
  KeyRule(_L + "self_attn.k_proj.weight", ("layers", "attn", "k_kernel"), "in"),
  KeyRule(_L + "self_attn.v_proj.weight", ("layers", "attn", "v_kernel"), "in"),
  KeyRule(_L + "self_attn.q_proj.bias", ("layers", "attn", "q_bias"), "flat"),
  KeyRule(_L + "self_attn.k_proj.bias", ("layers", "attn", "k_bias"), "flat"),
  KeyRule(_L + "self_attn.v_proj.bias", ("layers", "attn", "v_bias"), "flat"),
  KeyRule(_L + "self_attn.o_proj.weight", ("layers", "attn", "o_kernel"), "out"),
  KeyRule(_L + "self_attn.q_norm.weight", ("layers", "attn", "q_norm", "scale")),
  KeyRule(_L + "self_attn.k_norm.weight", ("layers", "attn", "k_norm", "scale")),
  KeyRule(_L + "mlp.gate_proj.weight", ("layers", "mlp", "gate_kernel"), "in"),
  KeyRule(_L + "mlp.up_proj.weight", ("layers", "mlp", "up_kernel"), "in"),
  KeyRule(_L + "mlp.down_proj.weight", ("layers", "mlp", "down_kernel"), "in"),
  KeyRule(_L + "mlp.gate.weight", ("layers", "moe", "router_kernel"), "in"),
  KeyRule(_L + "mlp.experts.{e}.gate_proj.weight", ("layers", "moe", "gate_kernel"), "in"),
  KeyRule(_L + "mlp.experts.{e}.up_proj.weight", ("layers", "moe", "up_kernel"), "in"),
  KeyRule(_L + "mlp.experts.{e}.down_proj.weight", ("layers", "moe", "down_kernel"), "in"),
  KeyRule(_L + "input_layernorm.weight", ("layers", "input_norm", "scale")),
  KeyRule(_L + "post_attention_layernorm.weight", ("layers", "post_attn_norm", "scale")),
  KeyRule("model.norm.weight", ("final_norm", "scale")),
  KeyRule("lm_head.weight", ("lm_head",), "in"),
)


def _get(tree, path):
  for p in path:
    if not isinstance(tree, dict) or p not in tree:
      return None
    tree = tree[p]
  return tree


def _set(tree, path, value):
  for p in path[:-1]:
    tree = tree.setdefault(p, {})
  tree[path[-1]] = value


@dataclasses.dataclass(frozen=True)
class Entry:
  """One parameter of this config's model and the HF tensors it is made of."""

  rule: KeyRule
  path: tuple[str, ...]  # in the param tree (the layer stack's name first)
  leaf: Any  # its abstract value
  first_layer: int = 0  # HF index of the stack's layer 0

  def keys(self, i: int | None = None, e: int | None = None) -> str:
    return self.rule.hf.format(i=None if i is None else self.first_layer + i, e=e)


def active_rules(config: ModelConfig) -> list[Entry]:
  """An `Entry` for each table entry this config's model has."""
  shapes = decoder.param_shapes(config)
  out = []
  for rule in KEY_TABLE:
    groups = decoder.layer_groups(config) if rule.per_layer else (None,)
    for g in groups:
      path = rule.path if g is None else (g.name,) + rule.path[1:]
      leaf = _get(shapes, path)
      if leaf is not None:
        out.append(Entry(rule, path, leaf, 0 if g is None else g.start))
  return out


def _to_ours(w: np.ndarray, layout: str, shape: tuple[int, ...]) -> np.ndarray:
  if layout in ("in", "out"):
    w = w.T
  return w.reshape(shape)


def _to_hf(x: np.ndarray, layout: str) -> np.ndarray:
  if layout == "in":
    return x.reshape(x.shape[0], -1).T
  if layout == "out":
    return x.reshape(-1, x.shape[-1]).T
  if layout == "flat":
    return x.reshape(-1)
  return x


def _hf_shape(layout: str, shape: tuple[int, ...]) -> tuple[int, ...]:
  if layout == "in":
    return (math.prod(shape[1:]), shape[0])
  if layout == "out":
    return (shape[-1], math.prod(shape[:-1]))
  if layout == "flat":
    return (math.prod(shape),)
  return tuple(shape)


# ------------------------------------------------------------------- reading
class _TensorSource:
  """All tensors of an HF directory, whether one file or a sharded index."""

  def __init__(self, path: str):
    index = os.path.join(path, "model.safetensors.index.json")
    single = os.path.join(path, "model.safetensors")
    self._files: dict[str, SafetensorsFile] = {}
    self._where: dict[str, str] = {}
    if os.path.exists(index):
      with open(index) as f:
        weight_map = json.load(f)["weight_map"]
      for key, fname in weight_map.items():
        self._where[key] = os.path.join(path, fname)
    elif os.path.exists(single):
      f = SafetensorsFile(single)
      self._files[single] = f
      self._where = {k: single for k in f.keys()}
    else:
      raise CheckpointError(f"{path}: no model.safetensors or model.safetensors.index.json")

  def __contains__(self, key):
    return key in self._where

  def _file(self, key) -> SafetensorsFile:
    fname = self._where[key]
    if fname not in self._files:
      if not os.path.exists(fname):
        raise CheckpointError(f"tensor {key!r}: shard file {fname} is missing")
      self._files[fname] = SafetensorsFile(fname)
    return self._files[fname]

  def get(self, key: str, expected_shape: tuple[int, ...]) -> np.ndarray:
    if key not in self._where:
      raise CheckpointError(f"missing tensor {key!r} in checkpoint")
    f = self._file(key)
    if key not in f.keys():
      raise CheckpointError(f"missing tensor {key!r} in {f.path}")
    if f.shape(key) != tuple(expected_shape):
      raise CheckpointError(
        f"tensor {key!r}: shape {f.shape(key)} in checkpoint, "
        f"expected {tuple(expected_shape)} from config"
      )
    return f.get(key)


def _read_param(src: _TensorSource, entry: Entry, np_dtype) -> np.ndarray:
  rule, leaf = entry.rule, entry.leaf
  if not rule.per_layer:
    w = src.get(rule.hf, _hf_shape(rule.layout, leaf.shape))
    return _to_ours(w, rule.layout, leaf.shape).astype(np_dtype)
  out = np.empty(leaf.shape, np_dtype)
  for i in range(leaf.shape[0]):
    if rule.per_expert:
      shape = leaf.shape[2:]
      for e in range(leaf.shape[1]):
        w = src.get(entry.keys(i, e), _hf_shape(rule.layout, shape))
        out[i, e] = _to_ours(w, rule.layout, shape)
    else:
      w = src.get(entry.keys(i), _hf_shape(rule.layout, leaf.shape[1:]))
      out[i] = _to_ours(w, rule.layout, leaf.shape[1:])
  return out


def load_hf(
  path: str,
  dtype=jnp.float32,
  mesh: jax.sharding.Mesh | None = None,
  rules=None,
  progress: bool = False,
):
  """Reads an HF directory -> (ModelConfig, params), one parameter at a time.

  With `mesh`, each parameter is placed on the sharding its logical axes get
  under `rules` (default `rlvr.parallel.sharding.DEFAULT_RULES`) as soon as it is read,
  so at most one full parameter lives in host memory at a time.
  """
  path = os.fspath(path)
  config = ModelConfig.from_hf(path)
  src = _TensorSource(path)
  np_dtype = np.dtype(jnp.dtype(dtype))
  shardings = None
  if mesh is not None:
    shardings = decoder.param_shardings(config, mesh, rules)
  params: dict = {}
  items = active_rules(config)
  if progress:
    from tqdm import tqdm

    items = tqdm(items, desc=f"load {os.path.basename(path)}", unit="param")
  for entry in items:
    host = _read_param(src, entry, np_dtype)
    if shardings is None:
      value = jnp.asarray(host)
    else:
      sh = _get(shardings, entry.path)
      value = jax.make_array_from_callback(host.shape, sh, lambda idx, h=host: h[idx])
    _set(params, entry.path, value)
  return config, params


# ------------------------------------------------------------------- writing
to_host = sharding.to_host  # kept importable from here


def hf_tensors(
  config: ModelConfig, params, untie_embeddings: bool = False
) -> Iterator[tuple[str, np.ndarray]]:
  """Yields (HF key, numpy array) for every tensor of the checkpoint.

  untie_embeddings: for a tied model, also yield `lm_head.weight` (a copy of the
  embedding), to be written with a config that says untied. Tensors are fetched
  one at a time (`to_host`), never the whole model at once; with several
  processes every one of them must iterate (each fetch is collective).
  """
  if untie_embeddings and config.tie_word_embeddings:
    yield "lm_head.weight", to_host(params["embedding"])
  for entry in active_rules(config):
    rule, where = entry.rule, "/".join(entry.path)
    value = _get(params, entry.path)
    if value is None:
      raise CheckpointError(f"params: missing {where} (HF {rule.hf!r})")
    if tuple(value.shape) != tuple(entry.leaf.shape):
      raise CheckpointError(
        f"params: {where} has shape {tuple(value.shape)}, config needs {tuple(entry.leaf.shape)}"
      )
    host = to_host(value)
    if not rule.per_layer:
      yield rule.hf, _to_hf(host, rule.layout)
      continue
    for i in range(host.shape[0]):
      if rule.per_expert:
        for e in range(host.shape[1]):
          yield entry.keys(i, e), _to_hf(host[i, e], rule.layout)
      else:
        yield entry.keys(i), _to_hf(host[i], rule.layout)


def save_hf(
  path: str,
  config: ModelConfig,
  params,
  tokenizer=None,
  *,
  dtype=None,
  max_shard_bytes: int = 4 << 30,
  untie_embeddings: bool = False,
) -> str:
  """Writes config.json + safetensors (sharded past `max_shard_bytes`) (+ tokenizer).

  dtype: dtype of the written tensors (default: that of the params).
  untie_embeddings: write a tied model as an untied one (explicit `lm_head.weight`).
    vLLM's in-place `reload_weights` refreshes the embedding but leaves a tied
    LM head on the old weights, so checkpoints served for RL are written untied.
  The result loads with transformers' `from_pretrained` and in vLLM.
  Multi-host: every process calls this (tensors are gathered collectively);
  process 0 writes, the others wait for it. `path` must be on a file system that
  process 0 can write.
  """
  path = os.fspath(path)
  writer = jax.process_index() == 0
  if writer:
    os.makedirs(path, exist_ok=True)
  shards: list[dict[str, np.ndarray]] = [{}]
  size = 0
  np_dtype = None if dtype is None else np.dtype(jnp.dtype(dtype))
  for key, arr in hf_tensors(config, params, untie_embeddings):
    if not writer:
      continue
    if np_dtype is not None:
      arr = arr.astype(np_dtype)
    if shards[-1] and size + arr.nbytes > max_shard_bytes:
      shards.append({})
      size = 0
    shards[-1][key] = np.ascontiguousarray(arr)
    size += arr.nbytes
  if not writer:
    _wait_for_writer(path)
    return path
  first = next(iter(shards[0].values()))
  dtype_name = {np.dtype(np.float32): "float32", np.dtype(np.float16): "float16"}.get(
    first.dtype, "bfloat16"
  )
  for stale in os.listdir(path):
    if stale.startswith("model") and (stale.endswith(".safetensors") or stale.endswith(".json")):
      os.remove(os.path.join(path, stale))
  if len(shards) == 1:
    save_file(shards[0], os.path.join(path, "model.safetensors"))
  else:
    weight_map, total = {}, 0
    for n, shard in enumerate(shards, 1):
      fname = f"model-{n:05d}-of-{len(shards):05d}.safetensors"
      save_file(shard, os.path.join(path, fname))
      for key, arr in shard.items():
        weight_map[key] = fname
        total += arr.nbytes
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
      json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
  if untie_embeddings:
    config = dataclasses.replace(config, tie_word_embeddings=False)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(config.to_hf(dtype_name), f, indent=2)
  if tokenizer is not None:
    tokenizer.save_pretrained(path)
  _wait_for_writer(path)
  return path


def _wait_for_writer(path: str) -> None:
  """Multi-host: every process leaves save_hf once process 0 has written `path`."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils

    multihost_utils.sync_global_devices(f"save_hf {path}")
