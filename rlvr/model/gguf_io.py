"""A GGUF file (llama.cpp's format) as an HF model folder.

`convert(file, out_dir)` dequantizes every tensor (`gguf_file.GGUFFile`), renames it
from llama.cpp's names to HF's (`TENSOR_NAMES`), undoes llama.cpp's reordering of the
Q and K projection rows for the llama architecture, and writes config.json,
safetensors, generation_config.json and the tokenizer that the file's metadata
describes (`gguf_tokenizer`: special tokens and chat template included). `gguf_cache`
converts a file once into the model cache for `model.path`.

What would convert into a damaged model is refused instead, each a one-line `GGUFError`:
a NaN or infinite weight here, a special token or chat template that would not survive in
`gguf_tokenizer`.

llama.cpp stores llama's Q/K rows interleaved per head (its RoPE rotates adjacent
pairs, HF's rotates the two halves of each head): `_unpermute` puts them back. Its
qwen2 rotates halves like HF, so qwen2 files are not reordered.
"""

from __future__ import annotations

import json
import math
import os
import re

import numpy as np

from rlvr.model.config import ConfigError, ModelConfig
from rlvr.model.gguf_tokenizer import _check_chat_template, _fail, tokenizer

# general.architecture -> our family (HF LlamaForCausalLM / Qwen2ForCausalLM).
ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2"}
# llama.cpp tensor name -> HF key; {i} is the layer.
TENSOR_NAMES = {
  "token_embd.weight": "model.embed_tokens.weight",
  "output_norm.weight": "model.norm.weight",
  "output.weight": "lm_head.weight",
  "blk.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
  "blk.{i}.attn_q.weight": "model.layers.{i}.self_attn.q_proj.weight",
  "blk.{i}.attn_k.weight": "model.layers.{i}.self_attn.k_proj.weight",
  "blk.{i}.attn_v.weight": "model.layers.{i}.self_attn.v_proj.weight",
  "blk.{i}.attn_q.bias": "model.layers.{i}.self_attn.q_proj.bias",
  "blk.{i}.attn_k.bias": "model.layers.{i}.self_attn.k_proj.bias",
  "blk.{i}.attn_v.bias": "model.layers.{i}.self_attn.v_proj.bias",
  "blk.{i}.attn_output.weight": "model.layers.{i}.self_attn.o_proj.weight",
  "blk.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
  "blk.{i}.ffn_gate.weight": "model.layers.{i}.mlp.gate_proj.weight",
  "blk.{i}.ffn_up.weight": "model.layers.{i}.mlp.up_proj.weight",
  "blk.{i}.ffn_down.weight": "model.layers.{i}.mlp.down_proj.weight",
}
_DTYPES = ("float32", "bfloat16", "float16")
_LAYER = re.compile(r"blk\.(\d+)\.(.+)")


# ------------------------------------------------------------------ metadata
def model_config(g) -> ModelConfig:
  """The `ModelConfig` that `g`'s metadata and tensor shapes describe."""
  md, path = g.metadata, g.path
  arch = md.get("general.architecture")
  if arch not in ARCHITECTURES:
    _fail(path, f"architecture {arch!r} is not supported ({', '.join(ARCHITECTURES)})")

  def get(key, default=None, kind=int):
    value = md.get(f"{arch}.{key}", default)
    if value is None:
      _fail(path, f"metadata {arch}.{key}: missing")
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (number and math.isfinite(value) and value > 0 and kind(value) == value):
      _fail(path, f"metadata {arch}.{key}: {value!r} is not a positive {kind.__name__}")
    return kind(value)

  if "token_embd.weight" not in g.tensors:
    _fail(path, "no token_embd.weight tensor")
  vocab, hidden = g.tensors["token_embd.weight"].shape[0], get("embedding_length")
  if get("vocab_size", vocab) != vocab:
    _fail(path, f"metadata {arch}.vocab_size {md[f'{arch}.vocab_size']} != {vocab} embeddings")
  heads = get("attention.head_count")
  head_dim = get("attention.key_length", max(hidden // heads, 1))
  for key in ("attention.value_length", "rope.dimension_count"):
    if get(key, head_dim) != head_dim:
      _fail(path, f"metadata {arch}.{key}: {md[f'{arch}.{key}']} != head size {head_dim}")
  scaling = md.get(f"{arch}.rope.scaling.type", "none")
  if scaling != "none" or "rope_freqs.weight" in g.tensors:
    _fail(path, f"RoPE scaling ({scaling if scaling != 'none' else 'rope_freqs'}) is not supported")
  ids = {}
  for name in ("bos", "eos"):  # integers or absent (`gguf_file.METADATA_TYPES`)
    ids[name] = md.get(f"tokenizer.ggml.{name}_token_id")
    if ids[name] is not None and not 0 <= ids[name] < vocab:
      _fail(path, f"metadata tokenizer.ggml.{name}_token_id {ids[name]} not in 0..{vocab - 1}")
  try:
    return ModelConfig(
      family=ARCHITECTURES[arch],
      vocab_size=vocab,
      hidden_size=hidden,
      intermediate_size=get("feed_forward_length"),
      num_layers=get("block_count"),
      num_heads=heads,
      num_kv_heads=get("attention.head_count_kv", heads),
      head_dim=head_dim,
      rope_theta=get("rope.freq_base", 10000.0, float),
      rms_norm_eps=get("attention.layer_norm_rms_epsilon", kind=float),
      tie_word_embeddings="output.weight" not in g.tensors,
      max_position_embeddings=get("context_length", 32768),
      bos_token_id=ids["bos"],
      eos_token_id=ids["eos"],
    )
  except ConfigError as e:
    _fail(path, f"metadata: {e}")


def gguf_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
  """llama.cpp tensor name -> shape (numpy order) of every tensor `config`'s model has."""
  d, q = config.hidden_size, config.num_heads * config.head_dim
  kv = config.num_kv_heads * config.head_dim
  layer = {
    "blk.{i}.attn_norm.weight": (d,),
    "blk.{i}.attn_q.weight": (q, d),
    "blk.{i}.attn_k.weight": (kv, d),
    "blk.{i}.attn_v.weight": (kv, d),
    "blk.{i}.attn_output.weight": (d, q),
    "blk.{i}.ffn_norm.weight": (d,),
    "blk.{i}.ffn_gate.weight": (config.intermediate_size, d),
    "blk.{i}.ffn_up.weight": (config.intermediate_size, d),
    "blk.{i}.ffn_down.weight": (d, config.intermediate_size),
  }
  if config.qkv_bias:
    layer.update({"blk.{i}.attn_q.bias": (q,), "blk.{i}.attn_k.bias": (kv,)})
    layer["blk.{i}.attn_v.bias"] = (kv,)
  shapes = {"token_embd.weight": (config.vocab_size, d), "output_norm.weight": (d,)}
  if not config.tie_word_embeddings:
    shapes["output.weight"] = (config.vocab_size, d)
  for i in range(config.num_layers):
    shapes.update({name.format(i=i): shape for name, shape in layer.items()})
  return shapes


def _check_tensors(g, config: ModelConfig) -> None:
  """Every tensor the config needs is there with its shape, and nothing else is."""
  layers = {int(m.group(1)) for m in map(_LAYER.fullmatch, g.tensors) if m}
  n = config.num_layers  # distinct ints are 0..n-1 when there are n of them from 0 to n-1
  if len(layers) != n or min(layers, default=0) != 0 or max(layers, default=-1) != n - 1:
    _fail(g.path, f"metadata says {config.num_layers} layers, the tensors have {len(layers)}")
  shapes = gguf_shapes(config)
  for name, t in g.tensors.items():
    if name not in shapes:
      _fail(g.path, f"tensor {name} is not part of a {config.architecture} checkpoint")
    if t.shape != shapes[name]:
      _fail(
        g.path, f"tensor {name}: shape {list(t.shape)}, the metadata needs {list(shapes[name])}"
      )
  missing = sorted(set(shapes) - set(g.tensors))
  if missing:
    _fail(g.path, f"missing tensor {missing[0]}")


def hf_key(name: str) -> str:
  m = _LAYER.fullmatch(name)
  return TENSOR_NAMES[f"blk.{{i}}.{m.group(2)}"].format(i=m.group(1)) if m else TENSOR_NAMES[name]


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
  """Inverse of llama.cpp's Q/K row order: per head, rows (pair, half) -> (half, pair)."""
  return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_tensor(g, config: ModelConfig, name: str) -> np.ndarray:
  """Tensor `name` of `g` in HF's layout, float32."""
  w = g.array(name)
  if config.family == "llama" and name.endswith((".attn_q.weight", ".attn_k.weight")):
    w = _unpermute(w, config.num_heads if ".attn_q." in name else config.num_kv_heads)
  return w


# ------------------------------------------------------------------ writing
def _checked(g, config: ModelConfig, np_dtype):
  """(HF key, weight as `np_dtype`) of every tensor; a NaN or infinite value is a `GGUFError`
  naming its tensor. A float64 sum is finite exactly when every float32 term is."""
  for name in g.tensors:
    w = hf_tensor(g, config, name)
    if not np.isfinite(w.sum(dtype=np.float64)):
      bad = w.size - np.count_nonzero(np.isfinite(w))
      _fail(g.path, f"tensor {name}: {bad} of {w.size} values are NaN or infinite")
    with np.errstate(over="ignore"):
      cast = w.astype(np_dtype)
    if not np.isfinite(cast.sum(dtype=np.float64)):
      _fail(g.path, f"tensor {name}: values beyond the range of {np.dtype(np_dtype).name}")
    yield hf_key(name), cast


def _write_tensors(out_dir: str, tensors, max_shard_bytes: int) -> None:
  """(key, array) pairs as model.safetensors, or shards of at most `max_shard_bytes` and
  their index; one shard is in memory at a time."""
  from rlvr.model.safetensors_io import save_file

  shards, shard, size = [], {}, 0

  def flush():
    n = len(shards) + 1
    fname = f"model-{n:05d}.safetensors"
    save_file(shard, os.path.join(out_dir, fname))
    shards.append((fname, {k: v.nbytes for k, v in shard.items()}))

  for key, arr in tensors:
    if shard and size + arr.nbytes > max_shard_bytes:
      flush()
      shard, size = {}, 0
    shard[key], size = arr, size + arr.nbytes
  flush()
  if len(shards) == 1:
    os.replace(os.path.join(out_dir, shards[0][0]), os.path.join(out_dir, "model.safetensors"))
    return
  weight_map, total = {}, 0
  for n, (fname, sizes) in enumerate(shards, 1):
    final = f"model-{n:05d}-of-{len(shards):05d}.safetensors"
    os.replace(os.path.join(out_dir, fname), os.path.join(out_dir, final))
    weight_map.update(dict.fromkeys(sizes, final))
    total += sum(sizes.values())
  with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
    json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


def convert(
  gguf_path: str, out_dir: str, dtype: str = "float32", max_shard_bytes: int = 2 << 30
) -> str:
  """Writes the HF folder of a llama / qwen2 GGUF file to `out_dir`; returns `out_dir`.

  dtype: of the written weights ("float32", "bfloat16", "float16"). Every defect of the
  file is a `GGUFError` naming it, found before any tensor is dequantized, except a NaN or
  infinite weight, found as its tensor is written (`gguf_cache.cached` then removes the
  folder).
  """
  import ml_dtypes

  from rlvr.model.gguf_file import GGUFFile

  if dtype not in _DTYPES:
    raise ValueError(f"dtype: {dtype!r} is not one of {_DTYPES}")
  g = GGUFFile(gguf_path)
  config = model_config(g)
  _check_tensors(g, config)
  tok = tokenizer(g)
  if len(tok) > config.vocab_size:
    _fail(g.path, f"the tokenizer has {len(tok)} tokens, the model {config.vocab_size} embeddings")
  _check_chat_template(g, tok)
  np_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
  os.makedirs(out_dir, exist_ok=True)
  _write_tensors(out_dir, _checked(g, config, np_dtype), max_shard_bytes)
  with open(os.path.join(out_dir, "config.json"), "w") as f:
    json.dump(config.to_hf(dtype), f, indent=2)
  generation = {"bos_token_id": config.bos_token_id, "eos_token_id": config.eos_token_id}
  generation["pad_token_id"] = tok.pad_token_id
  with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
    json.dump(generation, f, indent=2)
  tok.save_pretrained(out_dir)
  return out_dir
