"""Composition-RL's composition rules on hand-written assistant outputs (no model needed)."""

from __future__ import annotations

import random
import re
from fractions import Fraction

import pytest

from synthesis import composition as comp
from synthesis import numbers
from synthesis.composition import Problem

Q1 = Problem("How many positive divisors does 12 have?", "6", "a", "math")
Q2 = Problem("A rectangle has width 3 and length 5. What is its area?", "15", "b", "math")
Q3 = Problem("What is 4 times 7?", "28", "c", "math")
TRUE = {Q1.text: "6", Q2.text: "15", Q3.text: "28"}

GOOD = {
  "define": "<variable>X</variable>\n<value>6</value>\n"
  "<definition>Let X be the number of positive divisors of 12.</definition>",
  "replace": "<variable>Y</variable><removed>3</removed>"
  "<problem>A rectangle has width Y and length 5. What is its area?</problem>",
  "relate": "<relation>Y is 3 less than X.</relation><difference>3</difference>",
  "v1": "The divisors are 1, 2, 3, 4, 6, 12. <value>6</value>",
  "v2": "<value>3</value>",
  "v3": "<verdict>yes</verdict>",
}
STAGE_OF = {
  "Take one number that appears": "define",
  "Choose one numeric constant": "replace",
  "Write one short sentence": "relate",
  "Solve the problem and find": "v1",
  "Which value does": "v2",
  "Check this composed": "v3",
}


def scripted(outputs):
  """An assistant that answers each stage with the given hand-written text."""
  calls = []

  def complete(prompts):
    out = []
    for p in prompts:
      stage = next(s for phrase, s in STAGE_OF.items() if phrase in p)
      calls.append(stage)
      out.append(outputs[stage])
    return out

  complete.calls = calls
  return complete


def test_well_formed_composition_is_accepted_and_assembled():
  [out] = comp.compose([(Q1, Q2)], scripted(GOOD))
  assert out.reason == "accepted"
  c = out.composed
  assert c.problem.answer == "15" and c.depth == 2 and c.ids == ("a", "b")
  assert (c.v1, c.v2, c.x, c.y) == ("6", "3", "X", "Y")
  assert c.problem.text == (
    "How many positive divisors does 12 have?\n\n"
    "Let X be the number of positive divisors of 12.\n\n"
    "Y is 3 less than X.\n\n"
    "A rectangle has width Y and length 5. What is its area?"
  )


def test_chatter_around_the_tags_is_fine():
  chatty = {k: f"Sure, here it is.\n{v}\nLet me know if you need more." for k, v in GOOD.items()}
  chatty["v1"] = "<value>x</value> is a placeholder; the real one: " + GOOD["v1"]
  assert comp.compose([(Q1, Q2)], scripted(chatty))[0].reason == "accepted"


@pytest.mark.parametrize(
  "stage, text, stage_out, reason",
  [
    ("define", "<variable>X</variable><value>6</value>", "define", "missing tag"),
    (
      "define",
      GOOD["define"].replace("<value>6</value>", "<value>None</value>"),
      "define",
      "value is not a number",
    ),
    (
      "define",
      GOOD["define"].replace("<value>6</value>", "<value>7</value>"),
      "define",
      "value is not a number of the answer",
    ),
    (
      "replace",
      GOOD["replace"].replace("<removed>3</removed>", "<removed>4</removed>"),
      "replace",
      "removed constant is not in the problem",
    ),
    ("replace", GOOD["replace"].replace("Y", "X"), "replace", "name clash"),
    (
      "relate",
      GOOD["relate"].replace("<difference>3</difference>", "<difference>4</difference>"),
      "relate",
      "wrong relation arithmetic",
    ),
    ("v1", "<value>None</value>", "v1", "v1 recomputation differs"),
    ("v1", "<value>7</value>", "v1", "v1 recomputation differs"),
    ("v2", "<value>5</value>", "v2", "v2 recomputation differs"),
    ("v2", "no tags at all", "v2", "missing tag"),
    (
      "v3",
      "<verdict>no</verdict><reason>Y is used twice</reason>",
      "v3",
      "v3 rejected: Y is used twice",
    ),
  ],
)
def test_each_malformed_or_wrong_output_is_rejected_with_its_reason(stage, text, stage_out, reason):
  outputs = dict(GOOD, **{stage: text})
  complete = scripted(outputs)
  [out] = comp.compose([(Q1, Q2)], complete)
  assert out.composed is None and (out.stage, out.reason) == (stage_out, reason)
  later = list(STAGE_OF.values())[list(STAGE_OF.values()).index(stage) + 1 :]
  assert not set(later) & set(complete.calls)  # a rejected chain costs no further calls


def test_a_variable_name_already_in_a_problem_clashes():
  q1 = Problem("Let n = 12. How many positive divisors does n have?", "6", "a")
  outputs = dict(GOOD, define=GOOD["define"].replace("X", "n"))
  [out] = comp.compose([(q1, Q2)], scripted(outputs))
  assert (out.stage, out.reason) == ("define", "name clash")
  assert numbers.clashes("n", "does n have") and not numbers.clashes("n", "an integer")
  assert not numbers.clashes("X", r"\max(a, b)") and numbers.clashes("X", "$X+1$")


def test_an_answer_without_a_number_cannot_open_a_composition():
  q1 = Problem("Is 7 prime?", "\\text{yes}", "a")
  complete = scripted(GOOD)
  [out] = comp.compose([(q1, Q2)], complete)
  assert (out.stage, out.reason) == ("define", "answer has no number") and not complete.calls


def test_numbers_are_parsed_exactly():
  assert numbers.parse_number("1,000") == 1000 and numbers.parse_number("$-3.5$") == Fraction(-7, 2)
  assert numbers.parse_number("\\frac{3}{4}") == Fraction(3, 4) == numbers.parse_number("3/4")
  assert numbers.parse_number("None") is None and numbers.parse_number("x+1") is None
  assert numbers.numbers_in("(2, \\frac{1}{2})") == [2, Fraction(1, 2)]


F = Fraction


@pytest.mark.parametrize(
  "text, expected",
  [
    # a minus between two terms subtracts
    ("2x-7", [2, 7]),
    ("5-3", [5, 3]),
    ("10 - 4 = 6", [10, 4, 6]),
    ("(x+1)-2", [1, 2]),
    ("3^{2}-1", [3, 2, 1]),
    ("2\\pi-3", [2, 3]),
    ("1-\\frac{1}{2}", [1, F(1, 2)]),
    # a comma that does not group thousands separates numbers
    ("(2,3)", [2, 3]),
    ("[1,2,3]", [1, 2, 3]),
    ("2, 3", [2, 3]),
    ("[1,200,3]", [1, 200, 3]),
    ("(1,000, 2)", [1000, 2]),
    # the sign of a negative fraction
    ("-\\frac{1}{2}", [F(-1, 2)]),
    ("x = -\\dfrac{3}{4}", [F(-3, 4)]),
    ("-\\tfrac{1}{3}", [F(-1, 3)]),
    ("-\\frac12", [F(-1, 2)]),
    ("\\frac{-5}{2}", [F(-5, 2)]),
    ("$-\\frac{7}{3}$", [F(-7, 3)]),
    # signs after operators, words and commands; decimals, thousands, fractions
    ("-7", [-7]),
    ("x = -3", [-3]),
    ("(-2, 5)", [-2, 5]),
    ("[1,-2]", [1, -2]),
    ("5 - -3", [5, -3]),
    ("x \\le -3", [-3]),
    ("roots 2 and -3, between -1 and 1", [2, -3, -1, 1]),
    ("2 \\cdot -4", [2, -4]),
    ("10^{-3}", [10, -3]),
    ("x = \u22122", [-2]),
    ("3.25 and -0.5", [F(13, 4), F(-1, 2)]),
    ("1,000", [1000]),
    ("12,345,678.5", [F(24691357, 2)]),
    ("1{,}000", [1000]),
    ("3/4 and -3/4", [F(3, 4), F(-3, 4)]),
    ("\\frac{3}{4} of 12", [F(3, 4), 12]),
    ("\\frac{\\sqrt{3}}{2}", [3, 2]),
    ("1/0 or \\frac{1}{0}", []),
  ],
)
def test_numbers_in_reads_each_number_as_written(text, expected):
  assert numbers.numbers_in(text) == expected


@pytest.mark.parametrize(
  "text, number",
  [
    ("-7", -7),
    ("$-3.5$", F(-7, 2)),
    ("- 3", -3),
    ("1,000", 1000),
    ("1 000", 1000),
    ("3 / 4", F(3, 4)),
    ("-\\frac{1}{2}", F(-1, 2)),
    ("-\\dfrac{3}{4}", F(-3, 4)),
    ("\\tfrac{1}{3}", F(1, 3)),
    ("\\frac12", F(1, 2)),
    ("\\frac {3} {4}", F(3, 4)),
    ("2,3", None),
    ("2, 3", None),
    ("(2,3)", None),
    ("1,00", None),
    ("5-3", None),
    ("2x-7", None),
    ("1/0", None),
    ("\\frac{1}{0}", None),
    ("", None),
  ],
)
def test_parse_number_reads_one_whole_number_or_none(text, number):
  assert numbers.parse_number(text) == number


def composing_q1_with(answer, v1):
  """Q1 with `answer`, composed with Q2 by an assistant that takes v1 from the answer."""
  q1 = Problem(Q1.text, answer, "a")
  outputs = dict(
    GOOD,
    define=GOOD["define"].replace("<value>6</value>", f"<value>{v1}</value>"),
    relate=f"<relation>Y differs from X.</relation><difference>{F(v1) - 3}</difference>",
    v1=f"<value>{v1}</value>",
  )
  [out] = comp.compose([(q1, Q2)], scripted(outputs))
  return out


@pytest.mark.parametrize(
  "answer, v1, accepted",
  [
    ("(2,3)", "2", True),
    ("(2,3)", "23", False),
    ("[1,2,3]", "3", True),
    ("[1,2,3]", "123", False),
    ("-\\frac{1}{2}", "-1/2", True),
    ("-\\frac{1}{2}", "1/2", False),
    ("x = -\\dfrac{3}{4}", "-3/4", True),
    ("2x-7", "7", True),
    ("2x-7", "-7", False),
    ("1,000", "1000", True),
  ],
)
def test_v1_must_be_a_number_as_written_in_the_answer(answer, v1, accepted):
  out = composing_q1_with(answer, v1)
  if accepted:
    assert out.reason == "accepted" and out.composed.v1 == str(F(v1)), out
  else:
    assert (out.stage, out.reason) == ("define", "value is not a number of the answer")


@pytest.mark.parametrize(
  "removed, reason", [("3", "accepted"), ("-3", "removed constant is not in the problem")]
)
def test_a_subtracted_constant_of_q2_is_replaced_without_its_minus(removed, reason):
  q2 = Problem("What is 10-3?", "7", "b")
  outputs = dict(
    GOOD,
    replace=f"<variable>Y</variable><removed>{removed}</removed><problem>What is 10-Y?</problem>",
  )
  [out] = comp.compose([(Q1, q2)], scripted(outputs))
  assert out.reason == reason
  if reason == "accepted":
    assert out.composed.v2 == "3" and "What is 10-Y?" in out.composed.problem.text


def generic_assistant(prompts):
  """Follows each instruction mechanically (first number, fresh capital letter); checks
  answer from the problems' known answers. Hand-written rules, not a model."""
  out = []
  for p in prompts:
    if "Take one number that appears" in p:
      answer = re.search(r"Answer: (.*)", p).group(1)
      avoid = re.search(r"is none of: (.*)\.", p).group(1).split(", ")
      name = next(
        n for n in "XZW" if n not in avoid and not numbers.clashes(n, p.split("Answer:")[0])
      )
      out.append(
        f"<variable>{name}</variable><value>{numbers.numbers_in(answer)[0]}</value>"
        f"<definition>Let {name} be the answer to the problem above.</definition>"
      )
    elif "Choose one numeric constant" in p:
      problem = p.split("Problem:\n", 1)[1].split("\n\nChoose", 1)[0]
      taken = re.search(r"and is not (\w+)\.", p).group(1)
      name = next(n for n in "YVU" if n != taken and not numbers.clashes(n, problem))
      number = re.search(r"(?<![A-Za-z])\d+", problem.split("\n\n")[-1]).group(0)
      last = problem.split("\n\n")[-1]
      rewritten = "\n\n".join(problem.split("\n\n")[:-1] + [last.replace(number, name, 1)])
      out.append(
        f"<variable>{name}</variable><removed>{number}</removed><problem>{rewritten}</problem>"
      )
    elif "Write one short sentence" in p:
      x, v1, y, v2 = re.search(r"quantities: (\w+) = (\S+) and (\w+) = (\S+)\.", p).groups()
      d = Fraction(v1) - Fraction(v2)
      words = (
        f"{y} equals {x}" if d == 0 else f"{y} is {abs(d)} {'less' if d > 0 else 'more'} than {x}"
      )
      out.append(f"<relation>{words}.</relation><difference>{d}</difference>")
    elif "Solve the problem and find" in p:
      problem = p.split("Problem:\n", 1)[1].split("\n\n")[0]
      out.append(f"<value>{TRUE[problem]}</value>")
    elif "Which value does" in p:
      y = re.search(r"In the rewritten problem, (\w+) stands", p).group(1)
      original = p.split("Original problem:\n", 1)[1].split("\n\nRewritten problem:")[0]
      rewritten = p.split("Rewritten problem:\n", 1)[1].split("\n\nIn the rewritten")[0]
      gone = [
        n
        for n in numbers.numbers_in(original)
        if n not in numbers.numbers_in(rewritten)
        or numbers.numbers_in(original).count(n) > numbers.numbers_in(rewritten).count(n)
      ]
      out.append(f"<value>{gone[0] if gone else 'None'}</value> ({y})")
    else:
      out.append("<verdict>yes</verdict>")
  return out


def test_depth_three_composition_keeps_the_last_answer_and_every_part():
  [out] = comp.compose_chains([[Q1, Q2, Q3]], generic_assistant)
  assert out.reason == "accepted", out
  c = out.composed
  assert c.depth == 3 and c.ids == ("a", "b", "c") and c.problem.answer == "28"
  assert (c.x, c.y) == ("Z", "V")  # X and Y are taken by the inner composition
  # Inner Compose(Q2, Q3): X = 15 (the area), Y replaces Q3's 4, so Y = X - 11. Outer
  # Compose(Q1, inner): Z = 6 divisors, V replaces the inner problem's 7, so V = Z + 1.
  assert c.problem.text == (
    "How many positive divisors does 12 have?\n\n"
    "Let Z be the answer to the problem above.\n\n"
    "V is 1 more than Z.\n\n"
    "A rectangle has width 3 and length 5. What is its area?\n\n"
    "Let X be the answer to the problem above.\n\n"
    "Y is 11 less than X.\n\n"
    "What is Y times V?"
  )
  assert (c.v1, c.v2) == ("6", "7")


def test_depth_two_chains_equal_compose_on_pairs():
  chains = [[Q1, Q2], [Q2, Q3]]
  got = comp.compose_chains(chains, generic_assistant)
  want = comp.compose([(a, b) for a, b in chains], generic_assistant)
  assert [o.composed.problem for o in got] == [o.composed.problem for o in want]


def test_pools_have_their_size_and_chains_never_reuse_a_problem():
  problems = [Problem(f"p{i}", str(i), str(i)) for i in range(200)]
  rng = random.Random(0)
  pools = comp.surrogate_pools(problems, depth=3, pool_size=20, rng=rng)
  assert [len(p) for p in pools] == [20, 20]
  for _ in range(200):
    chain = comp.draw_chain(problems, pools, rng)
    assert len(chain) == 3 and len({p.id for p in chain}) == 3
    assert chain[0] in pools[0] and chain[1] in pools[1]
  with pytest.raises(ValueError, match="distinct"):
    comp.draw_chain(problems[:1], [problems[:1]], rng)


def test_cross_domain_pairs_take_q1_from_the_first_source_and_q2_from_the_second():
  physics = [Problem(f"phys {i}", "1", f"p{i}", "physics") for i in range(5)]
  math = [Problem(f"math {i}", "2", f"m{i}", "math") for i in range(5)]
  pairs = comp.cross_domain_pairs(physics, math, 50, random.Random(1))
  assert len(pairs) == 50
  assert all(a.source == "physics" and b.source == "math" for a, b in pairs)


def test_curriculum_switches_exactly_where_the_rule_says_and_resumes_there():
  cfg = comp.CurriculumConfig(depths=(1, 2, 3), max_steps=6, solve_all_threshold=0.5, window=3)
  cur = comp.Curriculum(cfg)
  # depth 1: solve_all 0.2, 0.6, 0.6, 0.8 -> 3-step means 0.47 (step 3), 0.67 (step 4)
  series = [0.2, 0.6, 0.6, 0.8]
  assert [cur.record(s) for s in series] == [False, False, False, True]
  assert cur.depth == 2 and cur.switches == [4]
  # depth 2: never high -> switches after max_steps = 6 steps in the stage
  flags = [cur.record(0.1) for _ in range(6)]
  assert flags == [False] * 5 + [True] and cur.depth == 3 and cur.switches == [4, 10]
  # a killed run resumes at the same depth, mid-window
  cur.record(0.9)
  saved = json_roundtrip(cur.state())
  again = comp.Curriculum(cfg)
  again.restore(saved)
  assert again.depth == 3 and again.state() == cur.state()
  assert not again.record(1.0)  # the last stage never ends


def json_roundtrip(obj):
  import json

  return json.loads(json.dumps(obj))
