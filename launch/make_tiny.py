r"""Writes a random tiny decoder + locally trained tokenizer in HF format.

python -m launch.make_tiny --out=/tmp/tiny --family=qwen3 --num_layers=4
python -m launch.make_tiny --out=/tmp/tiny_moe --family=qwen3_moe --num_experts=8
"""

import os

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("out", "workdir/tiny_model", "Directory to write the HF model to.")
flags.DEFINE_enum(
  "family", "qwen2", ["qwen2", "qwen3", "llama", "qwen3_moe"], "Architecture family."
)
flags.DEFINE_integer("seed", 0, "Seed of weights and tokenizer corpus.")
flags.DEFINE_integer("hidden_size", 128, "Model width.")
flags.DEFINE_integer("num_layers", 2, "Decoder layers.")
flags.DEFINE_integer("num_heads", 4, "Query heads.")
flags.DEFINE_integer("num_kv_heads", 2, "Key/value heads (GQA).")
flags.DEFINE_integer("head_dim", 32, "Head size (vLLM CPU needs 32, 64, 80, 96, 112, 128, ...).")
flags.DEFINE_integer("intermediate_size", 256, "MLP width.")
flags.DEFINE_integer("tokenizer_vocab", 1024, "Target BPE vocabulary size.")
flags.DEFINE_bool("tie_word_embeddings", True, "Share input embedding and LM head.")
flags.DEFINE_integer("num_experts", 8, "qwen3_moe: experts per sparse layer.")
flags.DEFINE_integer("num_experts_per_tok", 2, "qwen3_moe: experts each token is routed to.")
flags.DEFINE_integer("moe_intermediate_size", 64, "qwen3_moe: width of each expert's MLP.")


def main(argv):
  del argv
  from rlvr import model

  moe = {}
  if FLAGS.family == "qwen3_moe":
    moe = dict(
      num_experts=FLAGS.num_experts,
      num_experts_per_tok=FLAGS.num_experts_per_tok,
      moe_intermediate_size=FLAGS.moe_intermediate_size,
    )
  path = model.make_tiny(
    FLAGS.out,
    seed=FLAGS.seed,
    tokenizer_vocab=FLAGS.tokenizer_vocab,
    family=FLAGS.family,
    hidden_size=FLAGS.hidden_size,
    num_layers=FLAGS.num_layers,
    num_heads=FLAGS.num_heads,
    num_kv_heads=FLAGS.num_kv_heads,
    head_dim=FLAGS.head_dim,
    intermediate_size=FLAGS.intermediate_size,
    tie_word_embeddings=FLAGS.tie_word_embeddings,
    **moe,
  )
  cfg = model.ModelConfig.from_hf(path)
  print(
    f"wrote {cfg.family} model with {model.count_params(cfg):,} parameters to "
    f"{os.path.abspath(path)}"
  )


if __name__ == "__main__":
  app.run(main)
