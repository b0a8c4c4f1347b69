r"""pass@k / avg@n of a model on one or more eval sets, over sampling seeds.

  python -m launch.evaluate --model=workdir/tiny/policy \
      --data=data/math_aime_eval.jsonl --n=8 --seeds=0,1,2 --max_tokens=1024

Writes eval.md (table), eval.csv, eval.json and pass_at_k.png into --workdir.
Samples in-process with JaxSampler, or from vLLM servers with --vllm_urls.
"""

from absl import app, flags, logging

FLAGS = flags.FLAGS
flags.DEFINE_string("model", None, "HF model directory.", required=True)
flags.DEFINE_list("data", [], "Eval sets (parquet/jsonl/json); 'arithmetic' = the procedural "
                  "held-out split.")
flags.DEFINE_string("workdir", "workdir/eval", "Output directory.")
flags.DEFINE_integer("n", 8, "Samples per problem (pass@k for k = 1, 2, 4, ... <= n).")
flags.DEFINE_list("seeds", ["0"], "Sampling seeds; the report gives mean and std over them.")
flags.DEFINE_float("temperature", 1.0, "Sampling temperature.")
flags.DEFINE_float("top_p", 1.0, "Nucleus sampling.")
flags.DEFINE_integer("top_k", 0, "Top-k sampling (0 = off).")
flags.DEFINE_integer("max_tokens", 1024, "Response length limit.")
flags.DEFINE_integer("limit", 0, "Use the first N problems of each set (0 = all).")
flags.DEFINE_string("instruction", "Please reason step by step, and put your final answer "
                    "within \\boxed{}.", "Appended to each problem.")
flags.DEFINE_bool("integer_answers", False, "AIME-style integer answer matching.")
flags.DEFINE_list("vllm_urls", [], "Sample from these vLLM servers instead of in-process.")
flags.DEFINE_integer("reward_workers", 2, "math-verify processes.")


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # orbax/jax INFO lines drown the progress bars
  import os
  from transformers import AutoTokenizer
  from rlvr import data as data_lib, evaluation, model
  from rlvr.rewards import RewardConfig, RewardPool
  from rlvr.loop import Prompt
  from rlvr.sampling import JaxSampler

  cfg, params = model.load_hf(FLAGS.model)
  tok = AutoTokenizer.from_pretrained(FLAGS.model)
  if FLAGS.vllm_urls:
    from rlvr.sampling.vllm_sampler import VLLMSampler
    sampler = VLLMSampler(FLAGS.vllm_urls, model_config=cfg, eos_token_id=tok.eos_token_id)
  else:
    sampler = JaxSampler(cfg, params, tok)
  sets = {}
  for path in FLAGS.data:
    if path == "arithmetic":
      from rlvr.tasks import arithmetic
      _, heldout = arithmetic.make_splits(0, FLAGS.limit or 256, 1, 0)
      sets["arithmetic-heldout"] = arithmetic.to_examples(heldout)
    else:
      exs = list(data_lib.read_dataset(path))
      sets[os.path.splitext(os.path.basename(path))[0]] = exs[:FLAGS.limit or None]
  ecfg = evaluation.EvalConfig(n=FLAGS.n, seeds=tuple(int(s) for s in FLAGS.seeds),
                               temperature=FLAGS.temperature, top_p=FLAGS.top_p,
                               top_k=FLAGS.top_k, max_tokens=FLAGS.max_tokens)
  rcfg = RewardConfig(integer_answers=FLAGS.integer_answers)
  results = {}
  with RewardPool(workers=FLAGS.reward_workers, timeout_s=rcfg.timeout_s) as pool:
    score = evaluation.score_fn(pool, rcfg)
    for name, exs in sets.items():
      prompts = [Prompt(tuple(data_lib.format_prompt(tok, e.problem, FLAGS.instruction)),
                        e.answer, e.problem, name) for e in exs]
      results[name] = evaluation.evaluate_set(sampler, prompts, score, ecfg, progress=True,
                                              context=cfg.max_position_embeddings)
  report = evaluation.write_report(results, FLAGS.workdir, f"eval {FLAGS.model}")
  print(open(report["markdown"]).read())


if __name__ == "__main__":
  app.run(main)
