"""The embedded default (configs/tiny.py: SvS on 2-step arithmetic) with a mixture-of-experts
policy: a Qwen3-MoE decoder of 3 layers, each with 8 experts of which 2 per token.

The experts' width (192) makes a token's active MLP as wide as configs/tiny.py's dense
one (384); the model holds 4x its MLP parameters. Everything else is configs/tiny.py.

  python -m launch.train --config=configs/tiny_moe.py
"""

from configs import tiny


def get_config():
  c = tiny.get_config()
  c.workdir = "workdir/tiny_moe"
  c.model.tiny = {  # make_tiny overrides (head size 32 for vLLM CPU)
    "seed": 0,
    "family": "qwen3_moe",
    "hidden_size": 128,
    "num_layers": 3,
    "num_heads": 4,
    "num_kv_heads": 4,
    "head_dim": 32,
    "intermediate_size": 384,  # unused: every layer is sparse
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 192,
    "norm_topk_prob": True,
    "tie_word_embeddings": True,
  }
  return c
