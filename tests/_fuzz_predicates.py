"""The seeded fuzz corpus of predicates (tests/select/test_select_hostile.py).

A small dataset (`write_dataset`: an int column ``i``, a float32 column
``f`` with NaNs, a nullable int ``n`` and a nullable bool ``b``, both with
their ``.valid`` masks) and case i of seed s (`make_case`): a random
expression tree over those columns (comparisons, AND/OR/NOT, BETWEEN, IN,
IS [NOT] NULL, arithmetic ``+ - * %``, literals and NULL), rendered as
SQL, and, for most cases, made hostile: a ``;`` and a statement after it
(COPY, ATTACH, INSTALL, LOAD, PRAGMA, SET, CREATE, DROP, EXPORT, CALL), a
set operation (UNION, INTERSECT, EXCEPT) after it or after a parenthesis
that breaks out of the WHERE clause, a statement keyword between two
tokens, comments (``--``, ``/* */``) that hide or try to unhide any of
those, or a soup of such tokens. Every case runs on the default engine,
and a share on DuckDB (`engine="duckdb"`).

What a correct `select` does with a case (`run_case`):

* **plain** (the tree as rendered, perhaps with comments between its
  tokens): a selection whose rows equal `reference` — the tree evaluated
  with numpy under SQL's three-valued logic (NaN and masked values are
  NULL, a row is selected where the condition is TRUE);
* **hostile**: a ``ValueError``, or a valid selection (rows sorted,
  unique, inside the dataset);
* never another exception, and never a file written in the working
  directory (the caller runs the corpus in an empty one and looks).

Literals are small integers and quarters, so every engine computes every
value exactly and the reference needs no rounding rules.

    PYTHONPATH=. python tests/_fuzz_predicates.py [CASES] [SEED]   # a longer run, with counts
"""
from __future__ import annotations

import dataclasses
import os
import random
import sys
from typing import Any, List, Optional, Tuple

import numpy as np

ROWS = 240

STATEMENTS = (
    "COPY (SELECT 42 AS a) TO 'fz-pwned.csv'", "COPY data TO 'fz-data.parquet'",
    "ATTACH 'fz-evil.db' AS e", "ATTACH 'fz-evil.db' AS e; CREATE TABLE e.t AS SELECT 1",
    "INSTALL httpfs", "LOAD httpfs", "PRAGMA threads=1", "SET threads = 1",
    "SET enable_external_access = true", "CREATE TABLE t AS SELECT 1", "DROP TABLE data",
    "EXPORT DATABASE 'fz-export'", "CALL enable_logging(storage='file', storage_path='fz-log')",
    "SELECT 1", "CREATE MACRO m(a) AS a",
)
SET_OPERATIONS = ("UNION ALL SELECT -3", "UNION SELECT 99999", "INTERSECT SELECT 1",
                  "EXCEPT SELECT 2", "UNION ALL SELECT i FROM data")
KEYWORDS = ("COPY", "ATTACH", "INSTALL", "LOAD", "PRAGMA", "SET", "CREATE", "DROP", "SELECT",
            "UNION", "EXPORT", "CALL", "FROM", "WHERE", "ORDER BY 1", "LIMIT 1", "TO")
SOUP = ("(", ")", ";", "--", "/*", "*/", "'", '"', "\n", "i", "f", "n", "b", "=", "<", "AND",
        "OR", "NOT", "1", "0.5", "'x'", "NULL", "IN", "BETWEEN") + KEYWORDS
FAMILIES = ("plain", "comment", "separator", "set operation", "breakout", "keyword",
            "comment escape", "soup", "plain", "separator", "set operation", "comment")


@dataclasses.dataclass
class PredicateCase:
    index: int
    family: str
    text: str
    tree: Optional[tuple]  # the plain tree (None: hostile, no reference)
    engine: Optional[str]


# ----------------------------------------------------------------- the dataset

def columns() -> dict:
    """The dataset's values: numpy arrays and null masks (True: null)."""
    rng = np.random.default_rng(20260101)
    i = rng.integers(-6, 7, ROWS).astype(np.int64)
    f = (rng.integers(-16, 17, ROWS) / 4).astype(np.float32)
    f[rng.random(ROWS) < 0.1] = np.nan
    n = rng.integers(-3, 4, ROWS).astype(np.int64)
    n_null = rng.random(ROWS) < 0.15
    b = rng.random(ROWS) < 0.5
    b_null = rng.random(ROWS) < 0.15
    return {"i": (i, np.zeros(ROWS, bool)), "f": (f.astype(np.float64), np.isnan(f)),
            "n": (n, n_null), "b": (b, b_null), "_f32": f}


def write_dataset(path: str) -> Any:
    """The dataset at `path` (converted from pandas: nullable columns get masks)."""
    import pandas as pd

    import loaderx

    cols = columns()
    n, n_null = cols["n"]
    b, b_null = cols["b"]
    frame = pd.DataFrame({
        "i": cols["i"][0],
        "f": cols["_f32"],
        "n": pd.array(np.where(n_null, None, n).tolist(), dtype="Int64"),
        "b": pd.array(np.where(b_null, None, b).tolist(), dtype="boolean"),
    })
    frame.to_parquet(path + ".parquet")
    try:
        return loaderx.convert(path + ".parquet", path, mode="overwrite", progress="off")
    finally:
        os.remove(path + ".parquet")


# ----------------------------------------------------------------- trees

def _literal(rng: random.Random, kind: str) -> tuple:
    if rng.random() < 0.05:
        return ("null",)
    if kind == "int" or rng.random() < 0.5:
        return ("lit", rng.randint(-6, 6))
    return ("lit", rng.randint(-24, 24) / 4)


def _expr(rng: random.Random, depth: int) -> Tuple[tuple, str]:
    """(a numeric expression, "int" or "float")."""
    roll = rng.random()
    if depth <= 0 or roll < 0.45:
        name = rng.choice(("i", "f", "n", "i", "n"))
        return ("col", name), ("float" if name == "f" else "int")
    if roll < 0.6:
        lit = _literal(rng, "any")
        return lit, ("float" if lit[0] == "lit" and isinstance(lit[1], float) else "int")
    if roll < 0.7:
        inner, kind = _expr(rng, depth - 1)
        return ("neg", inner), kind
    left, lk = _expr(rng, depth - 1)
    if lk == "int" and rng.random() < 0.25:
        return ("arith", "%", left, ("lit", rng.randint(1, 5))), "int"
    right, rk = _expr(rng, depth - 1)
    return ("arith", rng.choice("+-*"), left, right), ("float" if "float" in (lk, rk) else "int")


def _condition(rng: random.Random, depth: int) -> tuple:
    roll = rng.random()
    if depth <= 0 or roll < 0.35:
        a, _ = _expr(rng, 1)
        b, _ = _expr(rng, 1)
        return ("cmp", rng.choice(("=", "!=", "<>", "<", "<=", ">", ">=")), a, b)
    if roll < 0.55:
        return (rng.choice(("and", "or")),) + tuple(_condition(rng, depth - 1)
                                                     for _ in range(rng.randint(2, 4)))
    if roll < 0.63:
        return ("not", _condition(rng, depth - 1))
    if roll < 0.71:
        x, kind = _expr(rng, 1)
        lo, hi = sorted((rng.randint(-4, 4), rng.randint(-4, 4)))
        return ("between", rng.random() < 0.3, x, ("lit", lo), ("lit", hi))
    if roll < 0.79:
        x, kind = _expr(rng, 1)
        items = tuple(_literal(rng, kind) for _ in range(rng.randint(1, 4)))
        return ("in", rng.random() < 0.3, x) + items
    if roll < 0.88:
        return ("isnull", rng.random() < 0.5, _expr(rng, 1)[0])
    if roll < 0.95:
        return ("col", "b")
    return ("isnull", rng.random() < 0.5, ("col", "b"))


def render(tree: tuple) -> str:
    op = tree[0]
    if op == "col":
        return tree[1]
    if op == "lit":
        return repr(tree[1])
    if op == "null":
        return "NULL"
    if op == "neg":
        return f"-({render(tree[1])})"
    if op == "arith":
        return f"({render(tree[2])} {tree[1]} {render(tree[3])})"
    if op == "cmp":
        return f"{render(tree[2])} {tree[1]} {render(tree[3])}"
    if op in ("and", "or"):
        return "(" + f" {op.upper()} ".join(render(t) for t in tree[1:]) + ")"
    if op == "not":
        return f"NOT ({render(tree[1])})"
    if op == "between":
        neg = "NOT " if tree[1] else ""
        return f"{render(tree[2])} {neg}BETWEEN {render(tree[3])} AND {render(tree[4])}"
    if op == "in":
        neg = "NOT " if tree[1] else ""
        return f"{render(tree[2])} {neg}IN ({', '.join(render(t) for t in tree[3:])})"
    if op == "isnull":
        return f"({render(tree[2])}) IS {'NOT ' if tree[1] else ''}NULL"
    raise AssertionError(op)


# ----------------------------------------------------------------- the reference

def _value(tree: tuple, cols: dict) -> Tuple[np.ndarray, np.ndarray]:
    """(values as float64, null mask) of a numeric expression."""
    op = tree[0]
    if op == "col":
        values, null = cols[tree[1]]
        return values.astype(np.float64), null.copy()
    if op == "lit":
        return np.full(ROWS, float(tree[1])), np.zeros(ROWS, bool)
    if op == "null":
        return np.zeros(ROWS), np.ones(ROWS, bool)
    if op == "neg":
        v, null = _value(tree[1], cols)
        return -v, null
    (a, an), (b, bn) = _value(tree[2], cols), _value(tree[3], cols)
    if tree[1] == "%":
        return np.fmod(a, b), an | bn
    return {"+": a + b, "-": a - b, "*": a * b}[tree[1]], an | bn


_ORDER = {"=": np.equal, "!=": np.not_equal, "<>": np.not_equal, "<": np.less,
          "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal}


def _truth(tree: tuple, cols: dict) -> Tuple[np.ndarray, np.ndarray]:
    """(true, null) masks of a condition under three-valued logic."""
    op = tree[0]
    if op == "col":
        values, null = cols[tree[1]]
        return values & ~null, null.copy()
    if op == "cmp":
        (a, an), (b, bn) = _value(tree[2], cols), _value(tree[3], cols)
        null = an | bn
        return _ORDER[tree[1]](a, b) & ~null, null
    if op in ("and", "or"):
        parts = [_truth(t, cols) for t in tree[1:]]
        whole = parts[0]
        for part in parts[1:]:
            whole = _and(whole, part) if op == "and" else _or(whole, part)
        return whole
    if op == "not":
        t, n = _truth(tree[1], cols)
        return ~t & ~n, n
    if op == "between":
        ge = _truth(("cmp", ">=", tree[2], tree[3]), cols)
        le = _truth(("cmp", "<=", tree[2], tree[4]), cols)
        t, n = _and(ge, le)
        return (~t & ~n, n) if tree[1] else (t, n)
    if op == "in":
        x, xn = _value(tree[2], cols)
        hit = np.zeros(ROWS, bool)
        has_null = False
        for item in tree[3:]:
            if item[0] == "null":
                has_null = True
            else:
                hit |= x == float(item[1])
        n = xn | (~hit & has_null)
        t = hit & ~n
        return (~t & ~n, n) if tree[1] else (t, n)
    if op == "isnull":
        null = cols["b"][1].copy() if tree[2] == ("col", "b") else _value(tree[2], cols)[1]
        t = ~null if tree[1] else null
        return t, np.zeros(ROWS, bool)
    raise AssertionError(op)


def _and(a: Tuple[np.ndarray, np.ndarray], b: Tuple[np.ndarray, np.ndarray]):
    """Kleene AND of two (true, null) pairs: FALSE wins over NULL."""
    (t1, n1), (t2, n2) = a, b
    false = (~t1 & ~n1) | (~t2 & ~n2)
    return t1 & t2, ~false & (n1 | n2)


def _or(a: Tuple[np.ndarray, np.ndarray], b: Tuple[np.ndarray, np.ndarray]):
    """Kleene OR: TRUE wins over NULL."""
    (t1, n1), (t2, n2) = a, b
    true = t1 | t2
    return true, ~true & (n1 | n2)


def reference(tree: tuple, cols: dict) -> np.ndarray:
    """The rows where `tree` is TRUE."""
    return np.flatnonzero(_truth(tree, cols)[0])


# ----------------------------------------------------------------- hostile text

def _tokens_of(text: str) -> List[str]:
    return text.replace("(", " ( ").replace(")", " ) ").split()


def _between_tokens(rng: random.Random, text: str, *pieces: str) -> str:
    """`text` with each of `pieces` put between two of its tokens (or at an end)."""
    words: List[str] = _tokens_of(text)
    slots: List[List[str]] = [[] for _ in range(len(words) + 1)]
    for piece in pieces:
        slots[rng.randrange(len(slots))].append(piece)
    out = slots[0][:]
    for word, slot in zip(words, slots[1:]):
        out += [word] + slot
    return " ".join(out)


def _comment(rng: random.Random) -> str:
    hidden = rng.choice(STATEMENTS + SET_OPERATIONS + (") UNION ALL (SELECT -3", "'", "*/ x"))
    if rng.random() < 0.5:
        return f"/* {hidden.replace('*/', '* /')} */"
    return f"-- {hidden}\n"


def make_case(seed: int, i: int) -> PredicateCase:
    """Case number i of the corpus seeded by `seed` (a pure function of both)."""
    rng = random.Random(f"loaderx-fuzz-predicate/{seed}/{i}")
    family = FAMILIES[i % len(FAMILIES)]
    tree = _condition(rng, rng.randint(0, 3))
    text = render(tree)
    plain: Optional[tuple] = None
    if family == "plain":
        plain = tree
    elif family == "comment":
        text = _between_tokens(rng, text, *[_comment(rng) for _ in range(rng.randint(1, 3))])
        plain = tree
    elif family == "separator":
        text = f"{text}{rng.choice(('; ', ';', ' ;; '))}{rng.choice(STATEMENTS)}"
    elif family == "set operation":
        text = f"{text} {rng.choice(SET_OPERATIONS)}"
    elif family == "breakout":
        text = f"{text}) {rng.choice(SET_OPERATIONS + STATEMENTS)} {rng.choice(('--', '', '('))}"
    elif family == "keyword":
        text = _between_tokens(rng, text, rng.choice(KEYWORDS))
    elif family == "comment escape":
        escape = rng.choice(("*/ ; COPY (SELECT 1) TO 'fz-esc.csv' /*", "*/ UNION ALL SELECT -3 /*",
                             "\n; INSTALL httpfs --", "/* unterminated", "*/", "-- )\n) OR (1=1"))
        text = _between_tokens(rng, text, escape)
    else:
        text = " ".join(rng.choice(SOUP) for _ in range(rng.randint(1, 14)))
    engine = "duckdb" if rng.random() < (0.12 if plain is not None else 0.3) else None
    return PredicateCase(i, family, text, plain, engine)


# ----------------------------------------------------------------- running a case

def run_case(ds: dict, case: PredicateCase, cols: dict) -> dict:
    """{"outcome": ..., "problem": None or what went wrong}."""
    import loaderx

    try:
        got = loaderx.select(ds, case.text, engine=case.engine)
    except ValueError as e:
        if case.tree is not None:
            return {"outcome": "ValueError", "problem": f"a plain predicate was refused: {e}"}
        return {"outcome": "ValueError", "problem": None}
    except Exception as e:  # noqa: BLE001 - classifying every exception is the point
        return {"outcome": type(e).__name__, "problem": f"{type(e).__name__}: {e}"}
    rows = np.asarray(got["i"].rows)
    if rows.dtype != np.int64 or (len(rows) and (rows[0] < 0 or rows[-1] >= ROWS
                                                 or not np.all(np.diff(rows) > 0))):
        return {"outcome": "selection", "problem": f"rows not sorted, unique and in range: "
                                                   f"{rows[:10]}"}
    if case.tree is not None:
        want = reference(case.tree, cols)
        if not np.array_equal(rows, want):
            extra, missing = np.setdiff1d(rows, want), np.setdiff1d(want, rows)
            return {"outcome": "selection", "problem": f"rows differ from the reference: "
                                                       f"extra {extra[:5]}, missing {missing[:5]}"}
    return {"outcome": "selection", "problem": None}


def run_corpus(ds: dict, seed: int, cases: int) -> Tuple[dict, list]:
    """(counts by (plain or hostile, outcome), failures) of cases 0..cases-1."""
    cols = columns()
    counts: dict = {}
    failures = []
    for i in range(cases):
        case = make_case(seed, i)
        result = run_case(ds, case, cols)
        key = ("plain" if case.tree is not None else "hostile", result["outcome"])
        counts[key] = counts.get(key, 0) + 1
        if result["problem"]:
            failures.append((i, case.family, case.engine, case.text, result["problem"]))
    return counts, failures


def main(argv: List[str]) -> int:
    import tempfile

    cases = int(argv[1]) if len(argv) > 1 else 2000
    seed = int(argv[2]) if len(argv) > 2 else 11
    with tempfile.TemporaryDirectory() as work:
        os.chdir(work)
        ds = write_dataset(os.path.join(work, "ds"))
        counts, failures = run_corpus(ds, seed, cases)
        left = sorted(set(os.listdir(work)) - {"ds"})
    for (kind, outcome), count in sorted(counts.items()):
        print(f"{kind:8} {outcome:12} {count}")
    for failure in failures[:20]:
        print("FAIL", failure)
    print(f"files left in the working directory: {left}")
    return 1 if failures or left else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
