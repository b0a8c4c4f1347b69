"""QbQ's pure parts on hand-built inputs: bands, plan and variant parsing, rejection,
SelectRL (paper Algorithm 2), the seed update, and the Vendi score."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from synthesis import qbq
from synthesis.diversity import hashed_ngrams, pool_vendi, similarity_eigenvalues, vendi_score
from synthesis.qbq import Variant


# ------------------------------------------------------------------ bands
@pytest.mark.parametrize(
  "k,expect",
  [
    (16, {16: "mastered", 15: "mostly", 8: "mostly", 7: "sometimes", 1: "sometimes", 0: "never"}),
    (8, {8: "mastered", 7: "mostly", 4: "mostly", 3: "sometimes", 1: "sometimes", 0: "never"}),
    (
      15,
      {15: "mastered", 14: "mostly", 8: "mostly", 7: "sometimes", 1: "sometimes", 0: "never"},
    ),  # odd k: k/2 = 7.5, so "mostly" starts at 8
  ],
)
def test_band_boundaries(k, expect):
  assert {n: qbq.band(n, k) for n in expect} == expect


def test_seed_ranges_and_in_band():
  assert qbq.seed_range("mostly", 16) == (8, 15)
  assert qbq.seed_range("sometimes", 16) == (1, 7)
  assert qbq.seed_range("mixed", 16) == (1, 15)
  assert qbq.seed_range("mostly", 8) == (4, 7)
  assert qbq.seed_range("sometimes", 8) == (1, 3)
  assert qbq.seed_range("mixed", 8) == (1, 7)
  assert [n for n in range(17) if qbq.in_band(n, 16, "mostly")] == list(range(8, 16))
  assert [n for n in range(9) if qbq.in_band(n, 8, "sometimes")] == [1, 2, 3]
  assert [n for n in range(9) if qbq.in_band(n, 8, "mixed")] == list(range(1, 8))
  for k in range(1, 18):  # every count is in exactly one of the four bands, the same one
    for n in range(k + 1):
      assert [b for b in qbq.BANDS if qbq.in_band(n, k, b)] == [qbq.band(n, k)]


@pytest.mark.parametrize(
  "call",
  [
    lambda: qbq.band(17, 16),
    lambda: qbq.band(-1, 16),
    lambda: qbq.band(0, 0),
    lambda: qbq.seed_range("hard", 16),
    lambda: qbq.in_band(9, 8, "mostly"),
  ],
)
def test_band_rejects_bad_input(call):
  with pytest.raises(ValueError):
    call()


# ------------------------------------------------------------------ operators and planning
def test_operators_are_the_five_in_order():
  assert [o.id for o in qbq.OPERATORS] == ["O1", "O2", "O3", "O4", "O5"]
  assert len({o.instruction for o in qbq.OPERATORS}) == 5
  assert qbq.operator("O4").name == "inverse problem"
  with pytest.raises(ValueError):
    qbq.operator("O6")


def test_plan_prompt_shows_every_operator_and_the_tag():
  p = qbq.plan_prompt("Find the area of a 13-14-15 triangle.")
  assert "13-14-15" in p and "<operators>" in p and "choose the 3" in p.lower()
  assert all(f"{o.id} ({o.name}): {o.instruction}" in p for o in qbq.OPERATORS)


@pytest.mark.parametrize(
  "text,ops,notes",
  [
    ("<operators>O2, O4, O5</operators>", ("O2", "O4", "O5"), []),
    # chatter around and inside the tag, lower case, spaces, "and", semicolons
    (
      "O1 would be forced here. <operators> o 3; O-1 and O4 </operators> Done.",
      ("O3", "O1", "O4"),
      [],
    ),
    ("<operators>\n1. O5\n2. O2\n3. O3\n</operators>", ("O5", "O2", "O3"), []),
    # names instead of ids
    (
      "<operators>inverse problem, add a constraint layer, parametrize and sum</operators>",
      ("O4", "O5", "O2"),
      [],
    ),
    # the last tag counts (an echoed example before it does not)
    (
      "Format: <operators>O3, O4, O5</operators>\nMine: <operators>O1, O2, O3</operators>",
      ("O1", "O2", "O3"),
      [],
    ),
  ],
)
def test_parse_plan_well_formed(text, ops, notes):
  assert qbq.parse_plan(text) == (ops, notes)


def test_parse_plan_replaces_invalid_and_duplicate_picks_in_fixed_order():
  ops, notes = qbq.parse_plan("<operators>O2, O2, O9, banana</operators>")
  assert ops == ("O2", "O1", "O3")  # kept O2, then O1, O2 (taken), O3
  assert notes == [
    "duplicate pick: O2",
    "invalid pick: O9",
    "invalid pick: banana",
    "filled: O1",
    "filled: O3",
  ]
  assert qbq.parse_plan("<operators>O1, O3, O7</operators>") == (
    ("O1", "O3", "O2"),
    ["invalid pick: O7", "filled: O2"],
  )
  assert qbq.parse_plan("<operators>O5, O4, O3, O2</operators>") == (
    ("O5", "O4", "O3"),
    ["extra pick: O2"],
  )
  assert qbq.parse_plan("<operators></operators>") == (
    ("O1", "O2", "O3"),
    ["filled: O1", "filled: O2", "filled: O3"],
  )


def test_parse_plan_missing_tag_falls_back_to_the_fixed_order():
  assert qbq.parse_plan("I would pick O2, O4 and O5.") == (("O1", "O2", "O3"), ["missing tag"])
  assert qbq.parse_plan("") == (("O1", "O2", "O3"), ["missing tag"])
  assert qbq.parse_plan("<operators>O4</operators>", n=2) == (("O4", "O1"), ["filled: O1"])
  with pytest.raises(ValueError):
    qbq.parse_plan("<operators>O1</operators>", n=6)


# ------------------------------------------------------------------ generation
SEED = "Find the remainder when $7^{2024}$ is divided by 100, using \\frac{1}{2} nowhere."


def test_variant_prompt_carries_seed_operator_and_rules():
  p = qbq.variant_prompt(SEED, "1", "O5", reference_solution="The powers of 7 repeat mod 100.")
  assert SEED in p and "Seed answer: 1" in p and "powers of 7 repeat" in p
  assert qbq.operator("O5").instruction in p and "O5 (add a constraint layer)" in p
  assert "only in its numbers" in p and "<abstain/>" in p
  assert "<problem>" in p and "<answer>" in p and "single integer" not in p
  p = qbq.variant_prompt(SEED, "1", qbq.OPERATORS[0], integer_answer=True)
  assert "No reference solution" in p and "single integer" in p


@pytest.mark.parametrize(
  "text,expect",
  [
    (
      "Let me build it.\n<problem>Let N = 7^2024 + 3^2024. Find N mod 100.</problem>\n"
      "<answer>2</answer>\nHope this helps.",
      ("Let N = 7^2024 + 3^2024. Find N mod 100.", "2", "accepted"),
    ),
    ("<problem>Q</problem><answer>$\\boxed{42}$</answer>", ("Q", "42", "accepted")),
    ("This operator has no natural inverse here. <abstain/>", (None, None, "abstained")),
    ("<ABSTAIN />", (None, None, "abstained")),
    ("<abstain/> <problem>Q</problem><answer>3</answer>", (None, None, "abstained")),
    ("<problem>Q</problem> the answer is 3", (None, None, "missing tag")),
    ("Here it is: Q. Answer: 3", (None, None, "missing tag")),
    ("<problem>   </problem><answer>3</answer>", (None, None, "empty problem")),
    ("<problem>Q</problem><answer> </answer>", (None, None, "empty answer")),
    ("<problem>Q</problem><answer>\\boxed{}</answer>", (None, None, "empty answer")),
  ],
)
def test_parse_variant(text, expect):
  assert qbq.parse_variant(text) == expect


def test_parse_variant_integer_rule():
  assert qbq.parse_variant("<problem>Q</problem><answer>3/4</answer>", integer_answer=True) == (
    None,
    None,
    "answer is not an integer",
  )
  assert (
    qbq.parse_variant("<problem>Q</problem><answer>1,024</answer>", integer_answer=True)[2]
    == "accepted"
  )


def test_reject_same_answer_and_duplicates():
  variants = [
    ("P one", "12.0"),
    ("P two", "13"),
    ("  p   TWO ", "14"),
    ("P three", "7"),
    ("P four", "\\frac{24}{2}"),
  ]
  assert qbq.reject_variants("12", variants, seen=["p three"]) == [
    "same answer as parent",
    "accepted",
    "duplicate",
    "duplicate",
    "same answer as parent",
  ]
  # the caller's equivalence decides "same answer"
  assert qbq.reject_variants(
    "x+1", [("A", "X+1"), ("B", "x+2")], equivalent=lambda a, b: a.lower() == b.lower()
  ) == ["same answer as parent", "accepted"]
  # a rejected statement does not make a later one a duplicate
  assert qbq.reject_variants("5", [("Q", "5"), ("q", "6")]) == ["same answer as parent", "accepted"]


# ------------------------------------------------------------------ SelectRL
def V(vid: str, parent: str, n: int) -> Variant:
  return Variant(vid, parent, "O1", f"problem {vid}", "1", n)


def ids(vs):
  return [v.id for v in vs]


def test_select_takes_all_eligible_when_at_most_n():
  pool = [V("a", "s", 3), V("b", "s", 8), V("c", "t", 15), V("z0", "s", 0), V("f", "t", 16)]
  assert ids(qbq.select_rl(pool, N=3)) == ["b", "a", "c"]  # all of E, by (d, id); no top-up
  # |E| < N: all of E, then n = 0, then n = k
  assert ids(qbq.select_rl(pool, N=10)) == ["b", "a", "c", "z0", "f"]
  assert ids(qbq.select_rl(pool, N=4)) == ["b", "a", "c", "z0"]


def test_select_coverage_with_ties():
  pool = [
    V("a2", "A", 8),
    V("a1", "A", 8),
    V("a3", "A", 9),
    V("b1", "B", 12),
    V("b2", "B", 14),
    V("c1", "C", 2),
  ]
  # coverage: A -> a1 (d 0, tie with a2 broken by id), B -> b1 (d 4), C -> c1 (d 6);
  # cap = ceil(4 / 3) = 2; fill by d: a2 (A has 1 < 2) -> full
  assert ids(qbq.select_rl(pool, N=4)) == ["a1", "b1", "c1", "a2"]
  # d ties across seeds (n = 7 and n = 9 both give d = 1) break by id
  pool = [V("x", "X", 9), V("w", "X", 7), V("y", "Y", 8), V("v", "Y", 0)]
  assert ids(qbq.select_rl(pool, N=2)) == ["y", "w"]


def test_select_cap_binds_and_relaxes():
  # cap binds: A has four variants at d = 0, B three at d = 6; N = 4, cap = 2 per seed,
  # so B's second variant (d = 6) enters ahead of A's third (d = 0)
  pool = [V(f"A{i}", "A", 8) for i in range(4)] + [V(f"B{i}", "B", 2) for i in range(3)]
  assert ids(qbq.select_rl(pool, N=4)) == ["A0", "B0", "A1", "B1"]
  # relaxed: A has five, B one; N = 5, cap = ceil(5 / 2) = 3: A0, B0, A1, A2 then short,
  # so the cap is dropped and A3 fills the last slot (A4 left out)
  pool = [V(f"A{i}", "A", 8) for i in range(5)] + [V("B0", "B", 1)]
  assert ids(qbq.select_rl(pool, N=5)) == ["A0", "B0", "A1", "A2", "A3"]


def test_select_more_seeds_than_n_keeps_the_best_coverage_picks():
  pool = [V("p", "P", 3), V("q", "Q", 8), V("r", "R", 9), V("s", "S", 7), V("t", "T", 15)]
  assert ids(qbq.select_rl(pool, N=3)) == ["q", "r", "s"]
  assert qbq.select_rl(pool, N=0) == []


def test_select_degenerate_top_up_order():
  # ids chosen so that id order alone would put the n = k ones first
  pool = [
    V("m", "S", 8),
    V("z2", "S", 0),
    V("z1", "T", 0),
    V("a1", "S", 16),
    V("a2", "T", 16),
    V("a3", "T", 16),
  ]
  assert ids(qbq.select_rl(pool, N=5)) == ["m", "z1", "z2", "a1", "a2"]
  assert ids(qbq.select_rl(pool[1:], N=3)) == ["z1", "z2", "a1"]  # no eligible at all


def test_select_rejects_unscored_duplicate_or_out_of_range():
  for pool in (
    [V("a", "s", 3), Variant("b", "s", "O1", "p", "1")],
    [V("a", "s", 3), V("a", "t", 4)],
    [V("a", "s", 17)],
  ):
    with pytest.raises(ValueError):
      qbq.select_rl(pool, N=2)


def test_select_properties_on_random_pools():
  rng = random.Random(0)
  for _ in range(400):
    k = rng.choice([2, 3, 8, 15, 16])
    seeds = [f"s{i}" for i in range(rng.randint(1, 12))]
    pool = [V(f"v{j}", rng.choice(seeds), rng.randint(0, k)) for j in range(rng.randint(0, 60))]
    rng.shuffle(pool)
    N = rng.randint(0, 40)
    got = qbq.select_rl(pool, N=N, k=k)
    eligible = [v for v in pool if 1 <= v.n <= k - 1]
    assert len(got) == min(N, len(pool)) <= N
    assert len(set(ids(got))) == len(got)
    if len(eligible) <= N:  # all of E first, then n = 0 before any n = k
      assert set(ids(got[: len(eligible)])) == set(ids(eligible))
      ns = [v.n for v in got[len(eligible) :]]
      assert ns == sorted(ns) and set(ns) <= {0, k}
    else:  # no degenerate item; every seed covered when there is room for it
      assert all(1 <= v.n <= k - 1 for v in got)
      covered = {v.parent_id for v in eligible}
      if len(covered) <= N:
        assert {v.parent_id for v in got} == covered
    assert qbq.select_rl(list(reversed(pool)), N=N, k=k) == got  # input order is irrelevant


# ------------------------------------------------------------------ next seeds
def test_next_seeds_keeps_exactly_the_rescored_band():
  selected = [V("a", "s", 8), V("b", "s", 3), V("c", "t", 12), V("d", "t", 15), V("e", "u", 9)]
  counts = {"a": 16, "b": 15, "c": 8, "d": 7, "e": 0}
  got = qbq.next_seeds(selected, counts, k=16)
  assert [(v.id, v.n) for v in got] == [("b", 15), ("c", 8)]  # new counts, old order
  assert ids(qbq.next_seeds(selected, counts, 16, band="sometimes")) == ["d"]
  assert ids(qbq.next_seeds(selected, counts, 16, band="mixed")) == ["b", "c", "d"]
  with pytest.raises(ValueError, match="'e'"):
    qbq.next_seeds(selected, {"a": 8, "b": 8, "c": 8, "d": 8}, 16)


# ------------------------------------------------------------------ Vendi score
E1, E2, E3 = [1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]


def test_vendi_identical_items_count_once():
  x = [[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [0.5, 1.0, 1.5], [1.0, 2.0, 3.0]]  # one direction
  for q in (0, 0.5, 1, 2, math.inf):
    assert vendi_score(x, q) == pytest.approx(1.0)


def test_vendi_orthogonal_items_count_n():
  for q in (0, 0.5, 1, 2, math.inf):
    assert vendi_score(np.eye(5), q) == pytest.approx(5.0)
    assert vendi_score(np.eye(5)[:3], q) == pytest.approx(3.0)  # 3 items in 5-D


def test_vendi_two_identical_and_one_orthogonal():
  # rows e1, e1, e2: K = [[1,1,0],[1,1,0],[0,0,1]]. The block [[1,1],[1,1]] has eigenvalues
  # 2 and 0, the last row 1, so K/3 has 2/3, 1/3, 0.
  #   q = 1: exp(-(2/3 ln 2/3 + 1/3 ln 1/3)) = exp(ln 3 - (2/3) ln 2) = 3 / 2^(2/3) ~ 1.8899
  #   q = 2: 1 / (4/9 + 1/9) = 9/5;  q = inf: 1 / (2/3) = 3/2;  q = 0: rank 2
  for x in ([E1, E1, E2], [[1, 0], [1, 0], [0, 1]]):  # n <= dim and n > dim paths
    assert similarity_eigenvalues(x) == pytest.approx([2 / 3, 1 / 3, 0][: len(x[0])])
    assert vendi_score(x) == pytest.approx(3 / 2 ** (2 / 3))
    assert vendi_score(x, 2) == pytest.approx(9 / 5)
    assert vendi_score(x, math.inf) == pytest.approx(1.5)
    assert vendi_score(x, 0) == pytest.approx(2.0)


def test_vendi_two_items_at_an_angle():
  # cos = 0.6: K/2 = [[1, .6], [.6, 1]] / 2 has eigenvalues 0.8 and 0.2
  x = [[1.0, 0.0], [0.6, 0.8]]
  assert vendi_score(x) == pytest.approx(math.exp(-(0.8 * math.log(0.8) + 0.2 * math.log(0.2))))
  assert vendi_score(x, 2) == pytest.approx(1 / 0.68)
  assert vendi_score(x, math.inf) == pytest.approx(1.25)
  assert vendi_score(x, 0.5) == pytest.approx((0.8**0.5 + 0.2**0.5) ** 2)


def test_vendi_rejects_bad_embeddings():
  with pytest.raises(ValueError, match="row 1 is all zeros"):
    vendi_score([E1, [0.0, 0.0, 0.0], E2])
  with pytest.raises(ValueError, match="row 2 is not finite"):
    vendi_score([E1, E2, [np.nan, 0.0, 1.0]])
  for bad in ([], [1.0, 2.0], np.zeros((2, 0))):
    with pytest.raises(ValueError):
      vendi_score(bad)
  with pytest.raises(ValueError):
    vendi_score([E1], q=-1)


def letter_counts(texts: list[str]) -> np.ndarray:
  """A real (if crude) embedding: counts of the letters a, b, c."""
  return np.array([[t.count(c) for c in "abc"] for t in texts], dtype=float)


def test_pool_vendi():
  assert pool_vendi(["a", "aa", "b"], letter_counts) == pytest.approx(3 / 2 ** (2 / 3))
  assert pool_vendi(["a", "b", "c"], letter_counts, q=2) == pytest.approx(3.0)
  with pytest.raises(ValueError, match="row 1"):
    pool_vendi(["a", "xyz", "b"], letter_counts)
  with pytest.raises(ValueError, match="expected 2 rows"):
    pool_vendi(["a", "b"], lambda texts: np.eye(3))


def test_hashed_ngrams_is_deterministic_and_feeds_the_score():
  texts = [
    "Find the area.",
    "find   THE area.",
    "Count the lattice points inside x^2+y^2<25.",
    "ab",
  ]
  x = hashed_ngrams(texts, dim=512)
  assert x.shape == (4, 512) and np.array_equal(x, hashed_ngrams(texts, dim=512))
  assert np.array_equal(x[0], x[1])  # case and spacing do not matter
  assert x[0].sum() == len("find the area.") - 2 and x[3].sum() == 1  # short text padded
  assert 1.0 < pool_vendi(texts, hashed_ngrams) < 3.0  # two copies count once
  with pytest.raises(ValueError, match="row 1"):
    pool_vendi(["a b c", "  "], hashed_ngrams)
