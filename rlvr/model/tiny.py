"""Random tiny models with a locally trained tokenizer, written in HF format.

No hub is reachable here, so tests, examples and the embedded default build
their models with `make_tiny`. The tokenizer is a byte-level BPE that splits
text with Qwen2's pre-tokenizer regex (so transformers' and vLLM's Qwen2
tokenizer classes reproduce the same ids) and carries a ChatML template.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random

import jax
import jax.numpy as jnp

from rlvr.common.chatml import CHATML
from rlvr.model import decoder
from rlvr.model.config import ModelConfig, RopeScaling
from rlvr.model.hf_io import save_hf

QWEN2_SPLIT = (
  r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
  r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_WORDS = (
  "the a an of to and in is that for it as with on by this be are from at or which we can "
  "problem solution answer step first then so therefore let find compute number value sum "
  "product difference total each how many what if given where when integer positive real "
  "equation expression solve write final put your within boxed reason carefully response "
  "question topic purpose clear one new correct result check because since thus hence "
  "multiply add subtract divide times plus minus equals less more than twice half square "
  "root prime factor remainder digit even odd"
).split()
_LATEX = (
  "\\boxed{",
  "\\frac{",
  "}{",
  "\\cdot",
  "\\times",
  "\\sqrt{",
  "\\pi",
  "^2",
  "$",
  "\\(",
  "\\)",
  "\\[",
  "\\]",
  "```text",
  "```",
  "<response>",
  "</response>",
  "<think>",
  "</think>",
  "Answer:",
)


def default_corpus(seed: int = 0, lines: int = 4000) -> list[str]:
  """Deterministic English-ish, arithmetic and LaTeX text to train the BPE on."""
  rng = random.Random(seed)
  out = []
  for _ in range(lines):
    kind = rng.random()
    if kind < 0.4:
      a, b, c = (rng.randint(0, 999) for _ in range(3))
      op1, op2 = rng.choice("+-*"), rng.choice("+-*")
      out.append(
        f"Compute {a}{op1}{b}{op2}{c}. {b}{op2}{c}={eval(f'{b}{op2}{c}')}. "
        f"\\boxed{{{eval(f'{a}{op1}{b}{op2}{c}')}}}"
      )
    elif kind < 0.8:
      out.append(" ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 16))).capitalize() + ".")
    else:
      out.append(" ".join(rng.choice(_LATEX + tuple(_WORDS)) for _ in range(rng.randint(3, 10))))
  return out


def train_tokenizer(
  path: str, vocab_size: int = 1024, corpus: list[str] | None = None, seed: int = 0
):
  """Trains a byte-level BPE with Qwen2's split regex; saves an HF tokenizer to `path`.

  Returns the transformers tokenizer loaded back from `path`.
  """
  from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
  from transformers import AutoTokenizer

  tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
  tok.normalizer = normalizers.NFC()
  tok.pre_tokenizer = pre_tokenizers.Sequence(
    [
      pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ]
  )
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
    vocab_size=vocab_size,
    special_tokens=list(SPECIAL_TOKENS),
    show_progress=False,
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    min_frequency=2,
  )
  tok.train_from_iterator(corpus if corpus is not None else default_corpus(seed), trainer)
  os.makedirs(path, exist_ok=True)
  tok.save(os.path.join(path, "tokenizer.json"))
  ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
  with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
    json.dump(
      {
        "tokenizer_class": "Qwen2Tokenizer",
        "model_max_length": 32768,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "bos_token": None,
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        "errors": "replace",
        "added_tokens_decoder": {
          str(i): {
            "content": t,
            "special": True,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "single_word": False,
          }
          for t, i in ids.items()
        },
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "chat_template": CHATML,
      },
      f,
      indent=2,
    )
  return AutoTokenizer.from_pretrained(path)


# The tiny model's shape: make_tiny's defaults, and the model tests and bench scripts build
# without a tokenizer (`ModelConfig(**TINY, vocab_size=...)`).
TINY = dict(
  family="qwen2",
  hidden_size=128,
  intermediate_size=256,
  num_layers=2,
  num_heads=4,
  num_kv_heads=2,
  head_dim=32,
  rope_theta=10000.0,
  rms_norm_eps=1e-6,
  tie_word_embeddings=True,
  max_position_embeddings=2048,
  rope_scaling=None,
)
# Added for family="qwen3_moe" unless overridden: 8 experts, 2 per token.
TINY_MOE = dict(
  num_experts=8,
  num_experts_per_tok=2,
  moe_intermediate_size=64,
  norm_topk_prob=True,
)


def make_tiny(
  path: str,
  *,
  seed: int = 0,
  tokenizer_vocab: int = 1024,
  init_std: float = 0.02,
  corpus: list[str] | None = None,
  **overrides,
) -> str:
  """Writes a random tiny decoder + tokenizer in HF format to `path`; returns `path`.

  overrides: any `ModelConfig` field (family, hidden_size, num_layers, ...);
  `rope_scaling` may be a dict. vocab_size defaults to the tokenizer's size
  rounded up to a multiple of 64. head_dim stays >= 32 (vLLM CPU needs it).
  family="qwen3_moe" adds 8 experts, 2 per token (`TINY_MOE`).
  Deterministic for a seed.
  """
  fields = {f.name for f in dataclasses.fields(ModelConfig)}
  unknown = set(overrides) - fields
  if unknown:
    raise TypeError(f"make_tiny: unknown config fields {sorted(unknown)}; known: {sorted(fields)}")
  tokenizer = train_tokenizer(path, tokenizer_vocab, corpus, seed)
  kw = {**TINY, **overrides}
  if kw["family"] == "qwen3_moe":
    kw = {**TINY_MOE, **kw}
  if isinstance(kw["rope_scaling"], dict):
    kw["rope_scaling"] = RopeScaling(**kw["rope_scaling"])
  kw.setdefault("vocab_size", -(-len(tokenizer) // 64) * 64)
  eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
  kw.setdefault("eos_token_id", eos)
  config = ModelConfig(**kw)
  params = decoder.init(config, jax.random.key(seed))
  if init_std != 0.02:
    params = jax.tree.map(
      lambda p: p if p.ndim == 1 or jnp.all(p == 1) else p * (init_std / 0.02), params
    )
  save_hf(path, config, params)
  with open(os.path.join(path, "generation_config.json"), "w") as f:
    json.dump(
      {"eos_token_id": eos, "pad_token_id": tokenizer.pad_token_id, "bos_token_id": None},
      f,
      indent=2,
    )
  return path
