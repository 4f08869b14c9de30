"""The SQL boolean expressions of `loaderx.select`: a parser for the subset
users write in a WHERE clause, a type check against the dataset's columns,
and an evaluator over pyarrow.compute.

Why our own parser: pyarrow has no SQL front end (its ``Expression`` is built
in Python), and DuckDB, which has one, is optional. Parsing the subset here
(comparisons, ``AND``/``OR``/``NOT``, ``IN``, ``BETWEEN``, ``LIKE``/``ILIKE``,
``IS [NOT] NULL``, arithmetic ``+ - * / %``, literals: numbers, 'strings',
TRUE/FALSE/NULL, ``TIMESTAMP '...'``, ``DATE '...'``) costs a few hundred
lines and buys errors that name the problem — the unknown column, the
position of a syntax error, the two types of a mismatch — before any data
is read. Anything else (subqueries, function calls, CASE) raises
`NeedsDuckDB`, which `select` turns into a DuckDB query when DuckDB is
installed.

Semantics are SQL's: three-valued logic (a comparison with NULL is NULL;
``NULL AND FALSE`` is FALSE; ``NOT NULL`` is NULL), and a row is selected
only where the condition is TRUE. A float NaN is a null (it is what a null
float became at conversion), as is a NaT timestamp. A number compared with
a column takes the column's type when it fits (``score > 0.5`` on a float32
column compares in float32, as numpy does).

Evaluation runs on chunks of rows (memory-mapped, zero-copy), on every
usable core, each chunk one pyarrow.compute pass per operator. A condition
on a categorical column alone is computed once over its categories and
looked up by code.
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

__all__ = ["parse", "NeedsDuckDB", "Node", "ColumnInfo", "check", "evaluate"]


class NeedsDuckDB(Exception):
    """The predicate uses SQL beyond the subset parsed here (a subquery, a
    function call, ...); ``what`` names it."""

    def __init__(self, what: str):
        super().__init__(what)
        self.what = what


# ----------------------------------------------------------------- tokens

_KEYWORDS = {"AND", "OR", "NOT", "IN", "BETWEEN", "LIKE", "ILIKE", "ESCAPE", "IS", "NULL",
             "TRUE", "FALSE", "TIMESTAMP", "DATE"}
_DUCKDB_WORDS = {"SELECT", "CASE", "EXISTS", "CAST", "WITH", "FROM", "WHERE", "JOIN", "SIMILAR",
                 "GLOB", "ANY", "ALL", "SOME", "OVER", "INTERVAL", "COLLATE", "REGEXP"}
_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<number>(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)
  | (?P<string>'(?:[^']|'')*')
  | (?P<qident>"(?:[^"]|"")*"|`(?:[^`]|``)*`)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op><=|>=|<>|!=|==|\|\||::|[=<>+\-*/%(),.;\[\]])
""", re.VERBOSE)


@dataclass
class Token:
    kind: str  # number, string, ident, keyword, op, end
    text: str
    value: Any
    pos: int


def _syntax(source: str, pos: int, message: str) -> ValueError:
    caret = " " * min(pos, len(source)) + "^"
    return ValueError(f"syntax error in the predicate at position {pos}: {message}\n"
                      f"  {source}\n  {caret}")


def tokenize(source: str) -> List[Token]:
    tokens = []
    pos = 0
    while pos < len(source):
        m = _TOKEN.match(source, pos)
        if m is None:
            raise _syntax(source, pos, f"unexpected character {source[pos]!r}")
        kind = m.lastgroup
        text = m.group()
        if kind == "number":
            value: Any = float(text) if any(c in text for c in ".eE") else int(text)
            tokens.append(Token("number", text, value, pos))
        elif kind == "string":
            tokens.append(Token("string", text, text[1:-1].replace("''", "'"), pos))
        elif kind == "qident":
            q = text[0]
            tokens.append(Token("ident", text, text[1:-1].replace(q + q, q), pos))
        elif kind == "ident":
            up = text.upper()
            if up in _KEYWORDS:
                tokens.append(Token("keyword", text, up, pos))
            elif up in _DUCKDB_WORDS:
                raise NeedsDuckDB(f"{up} (at position {pos})")
            else:
                tokens.append(Token("ident", text, text, pos))
        elif kind == "op":
            if text in ("||", "::", ".", ";", "[", "]"):
                raise NeedsDuckDB(f"the operator {text!r} (at position {pos})")
            tokens.append(Token("op", text, text, pos))
        pos = m.end()
    tokens.append(Token("end", "", None, len(source)))
    return tokens


# ----------------------------------------------------------------- the tree

@dataclass
class Node:
    """One node of a parsed predicate. `op`: ``col``, ``lit``, ``not``,
    ``and``, ``or``, ``cmp``, ``in``, ``between``, ``like``, ``isnull``,
    ``arith``, ``neg``, ``codes`` (a categorical condition, see `_fold`)."""

    op: str
    args: List["Node"] = field(default_factory=list)
    value: Any = None  # column name, literal, operator, negation flag...
    pos: int = 0
    text: str = ""  # the source text of this node, for messages
    type: str = ""  # set by check(): int, float, bool, string, timestamp, duration, null
    extra: Dict[str, Any] = field(default_factory=dict)

    def columns(self) -> set:
        if self.op == "col":
            return {self.value}
        found: set = set()
        for a in self.args:
            found |= a.columns()
        if self.op == "codes":
            found.add(self.value)
        return found

    def has(self, op: str) -> bool:
        return self.op == op or any(a.has(op) for a in self.args)


_COMPARE = {"=": "=", "==": "=", "!=": "!=", "<>": "!=", "<": "<", "<=": "<=", ">": ">",
            ">=": ">="}


class _Parser:
    def __init__(self, source: str):
        self.source = source
        self.tokens = tokenize(source)
        self.i = 0

    @property
    def tok(self) -> Token:
        return self.tokens[self.i]

    def take(self) -> Token:
        t = self.tokens[self.i]
        self.i += 1
        return t

    def at(self, kind: str, value: Any = None) -> bool:
        t = self.tok
        return t.kind == kind and (value is None or t.value == value)

    def accept(self, kind: str, value: Any = None) -> Optional[Token]:
        return self.take() if self.at(kind, value) else None

    def expect(self, kind: str, value: Any, what: str) -> Token:
        if not self.at(kind, value):
            raise self.error(f"expected {what}")
        return self.take()

    def error(self, message: str) -> ValueError:
        t = self.tok
        found = "the end of the predicate" if t.kind == "end" else repr(t.text)
        return _syntax(self.source, t.pos, f"{message}, found {found}")

    def span(self, start: int) -> str:
        end = self.tokens[self.i - 1]
        return self.source[start:end.pos + len(end.text)].strip()

    def parse(self) -> Node:
        if self.at("end"):
            raise _syntax(self.source, 0, "the predicate is empty")
        node = self.or_()
        if not self.at("end"):
            raise self.error("expected AND, OR or the end of the predicate")
        return node

    def or_(self) -> Node:
        start = self.tok.pos
        node = self.and_()
        while self.accept("keyword", "OR"):
            node = Node("or", [node, self.and_()], pos=start, text=self.span(start))
        return node

    def and_(self) -> Node:
        start = self.tok.pos
        node = self.not_()
        while self.accept("keyword", "AND"):
            node = Node("and", [node, self.not_()], pos=start, text=self.span(start))
        return node

    def not_(self) -> Node:
        start = self.tok.pos
        if self.accept("keyword", "NOT"):
            inner = self.not_()
            return Node("not", [inner], pos=start, text=self.span(start))
        return self.predicate()

    def predicate(self) -> Node:
        start = self.tok.pos
        left = self.additive()
        t = self.tok
        if t.kind == "op" and t.value in _COMPARE:
            self.take()
            right = self.additive()
            return Node("cmp", [left, right], _COMPARE[t.value], start, self.span(start))
        negated = False
        if self.at("keyword", "NOT") and self.tokens[self.i + 1].kind == "keyword" \
                and self.tokens[self.i + 1].value in ("IN", "BETWEEN", "LIKE", "ILIKE"):
            self.take()
            negated = True
        if self.accept("keyword", "IN"):
            self.expect("op", "(", "'(' after IN")
            items = [self.additive()]
            while self.accept("op", ","):
                items.append(self.additive())
            self.expect("op", ")", "',' or ')' in the IN list")
            node = Node("in", [left] + items, pos=start, text=self.span(start))
        elif self.accept("keyword", "BETWEEN"):
            lo = self.additive()
            self.expect("keyword", "AND", "AND in BETWEEN ... AND ...")
            hi = self.additive()
            node = Node("between", [left, lo, hi], pos=start, text=self.span(start))
        elif self.at("keyword", "LIKE") or self.at("keyword", "ILIKE"):
            icase = self.take().value == "ILIKE"
            pattern = self.additive()
            escape = None
            if self.accept("keyword", "ESCAPE"):
                escape = self.expect("string", None, "a one-character string after ESCAPE")
            node = Node("like", [left, pattern], icase, start, self.span(start),
                        extra={"escape": escape.value if escape else None})
        elif self.accept("keyword", "IS"):
            neg = bool(self.accept("keyword", "NOT"))
            if self.at("keyword", "TRUE") or self.at("keyword", "FALSE"):
                truth = self.take().value == "TRUE"
                test = Node("cmp", [left, Node("lit", value=truth, pos=start, text=str(truth))],
                            "=", start, self.span(start))
                # x IS TRUE is never NULL: false where x is NULL.
                node = Node("istrue", [test], pos=start, text=self.span(start))
                return Node("not", [node], pos=start, text=node.text) if neg else node
            self.expect("keyword", "NULL", "NULL, TRUE or FALSE after IS")
            return Node("isnull", [left], neg, start, self.span(start))
        else:
            if negated:
                raise self.error("expected IN, BETWEEN or LIKE after NOT")
            return left
        return Node("not", [node], pos=start, text=node.text) if negated else node

    def additive(self) -> Node:
        start = self.tok.pos
        node = self.term()
        while self.at("op", "+") or self.at("op", "-"):
            op = self.take().value
            node = Node("arith", [node, self.term()], op, start, self.span(start))
        return node

    def term(self) -> Node:
        start = self.tok.pos
        node = self.unary()
        while self.at("op", "*") or self.at("op", "/") or self.at("op", "%"):
            op = self.take().value
            node = Node("arith", [node, self.unary()], op, start, self.span(start))
        return node

    def unary(self) -> Node:
        start = self.tok.pos
        if self.accept("op", "-"):
            inner = self.unary()
            if inner.op == "lit" and isinstance(inner.value, (int, float)) \
                    and not isinstance(inner.value, bool):
                return Node("lit", value=-inner.value, pos=start, text=self.span(start))
            return Node("neg", [inner], pos=start, text=self.span(start))
        if self.accept("op", "+"):
            return self.unary()
        return self.primary()

    def primary(self) -> Node:
        t = self.tok
        if t.kind == "number" or t.kind == "string":
            self.take()
            return Node("lit", value=t.value, pos=t.pos, text=t.text)
        if t.kind == "keyword" and t.value in ("TRUE", "FALSE", "NULL"):
            self.take()
            value = None if t.value == "NULL" else t.value == "TRUE"
            return Node("lit", value=value, pos=t.pos, text=t.text)
        if t.kind == "keyword" and t.value in ("TIMESTAMP", "DATE"):
            self.take()
            s = self.expect("string", None, f"a quoted time after {t.value}")
            try:
                value = np.datetime64(s.value)
            except ValueError:
                raise _syntax(self.source, s.pos, f"{s.text} is not a {t.value.lower()}") \
                    from None
            return Node("lit", value=value, pos=t.pos, text=f"{t.text} {s.text}",
                        extra={"time": True})
        if t.kind == "ident":
            self.take()
            if self.at("op", "("):
                raise NeedsDuckDB(f"the function call {t.text}(...) (at position {t.pos})")
            return Node("col", value=t.value, pos=t.pos, text=t.text)
        if self.accept("op", "("):
            start = t.pos
            node = self.or_()
            self.expect("op", ")", "')'")
            node.text = self.span(start)
            return node
        raise self.error("expected a column, a value or '('")


def parse(source: str) -> Node:
    """The tree of a predicate; ValueError for a syntax error (with its
    position), NeedsDuckDB for SQL beyond the subset."""
    if not isinstance(source, str):
        raise TypeError(f"the predicate must be a str, not {type(source).__name__}")
    return _Parser(source).parse()


# ----------------------------------------------------------------- types

@dataclass
class ColumnInfo:
    """What the predicate may know about a column: its SQL type, numpy
    dtype, and the names of a categorical's codes (or of integer labels)."""

    name: str
    type: str  # int, float, bool, string, timestamp, duration, or "" (not scalar)
    dtype: Optional[np.dtype] = None
    categories: Optional[Sequence] = None  # a categorical: its names (values of type `type`)
    labels: Optional[Sequence] = None  # integer labels with names (ClassLabel)
    nullable: bool = False
    describe: str = ""


def sql_type(dtype: np.dtype) -> str:
    kind = np.dtype(dtype).kind
    return {"i": "int", "u": "int", "f": "float", "b": "bool", "M": "timestamp",
            "m": "duration"}.get(kind, "")


def _literal_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    if isinstance(value, np.datetime64):
        return "timestamp"
    raise TypeError(f"literal {value!r}")


_NUMERIC = ("int", "float")


def _comparable(a: str, b: str) -> bool:
    if "null" in (a, b):
        return True
    if a in _NUMERIC and b in _NUMERIC:
        return True
    return a == b


def check(node: Node, columns: Dict[str, ColumnInfo], source: str) -> None:
    """Types every node; ValueError naming an unknown column, a column that
    is not scalar, or the two sides of a type mismatch."""
    _check(node, columns, source)
    if node.type not in ("bool", "null"):
        raise ValueError(f"the predicate {source!r} is a {node.type} value, not a condition "
                         "(compare it: ... = ..., ... > ...)")


def _unknown(name: str, columns: Dict[str, ColumnInfo]) -> ValueError:
    close = difflib.get_close_matches(name, list(columns), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ValueError(f"unknown column {name!r} in the predicate{hint}; the columns are "
                      f"{list(columns)}")


def _mismatch(node: Node, a: Node, b: Node) -> ValueError:
    def side(n: Node) -> str:
        if n.op == "col":
            return f"column {n.value!r} holds {n.extra.get('describe') or n.type}"
        if n.op == "lit":
            article = "an" if n.type[0] in "aeiou" else "a"
            return f"{n.text} is {article + ' ' + n.type if n.type != 'null' else 'NULL'}"
        return f"{n.text!r} is {n.type}"
    return ValueError(f"type mismatch in {node.text!r}: {side(a)}, {side(b)}")


def _check(node: Node, columns: Dict[str, ColumnInfo], source: str) -> None:
    for a in node.args:
        _check(a, columns, source)
    op = node.op
    if op == "col":
        info = columns.get(node.value)
        if info is None:
            raise _unknown(node.value, columns)
        if not info.type:
            raise ValueError(f"column {node.value!r} holds {info.describe}; predicates apply to "
                             "scalar columns (numbers, bools, strings, categoricals, times)")
        node.type = info.type
        node.extra["info"] = info
        node.extra["describe"] = info.describe
    elif op == "lit":
        node.type = _literal_type(node.value)
    elif op in ("and", "or", "not", "istrue"):
        for a in node.args:
            if a.type not in ("bool", "null"):
                word = {"and": "AND", "or": "OR", "not": "NOT", "istrue": "IS"}[op]
                raise ValueError(f"{word} needs conditions, but {a.text!r} is a {a.type} value "
                                 f"(in {node.text!r})")
        node.type = "bool"
    elif op == "cmp":
        a, b = node.args
        _label_literals(a, [b])
        _label_literals(b, [a])
        _time_literals(a, [b])
        _time_literals(b, [a])
        if not _comparable(a.type, b.type):
            raise _mismatch(node, a, b)
        node.type = "bool"
    elif op in ("in", "between"):
        left, rest = node.args[0], node.args[1:]
        _label_literals(left, rest)
        _time_literals(left, rest)
        for item in rest:
            if not _comparable(left.type, item.type):
                raise _mismatch(node, left, item)
        node.type = "bool"
    elif op == "like":
        text, pattern = node.args
        for n in (text, pattern):
            if n.type not in ("string", "null"):
                raise ValueError(f"LIKE compares strings, but {n.text!r} is {n.type} "
                                 f"(in {node.text!r})")
        if pattern.op != "lit":
            raise NeedsDuckDB(f"LIKE with a pattern that is not a literal ({pattern.text!r})")
        node.type = "bool"
    elif op == "isnull":
        node.type = "bool"
    elif op in ("arith", "neg"):
        for a in node.args:
            if a.type not in _NUMERIC + ("null",):
                raise ValueError(f"arithmetic needs numbers, but {a.text!r} is {a.type} "
                                 f"(in {node.text!r})")
        types = {a.type for a in node.args}
        node.type = "float" if "float" in types or node.value == "/" else "int"
    else:  # pragma: no cover - the parser makes no other node
        raise AssertionError(op)


def _label_literals(col: Node, others: Sequence[Node]) -> None:
    """``label = 'cat'`` on an integer label column with names: the name's
    number (an unknown name is an error naming the known ones)."""
    info = col.extra.get("info") if col.op == "col" else None
    if info is None or info.labels is None:
        return
    for lit in others:
        if lit.op == "lit" and lit.type == "string":
            names = list(info.labels)
            if lit.value not in names:
                raise ValueError(f"{lit.text} is not one of the label names of column "
                                 f"{info.name!r}: {names[:20]}")
            lit.value, lit.type = names.index(lit.value), "int"


def _time_literals(col: Node, others: Sequence[Node]) -> None:
    """A string compared with a timestamp column is read as a time ('2024-01-31')."""
    if col.type != "timestamp":
        return
    for lit in others:
        if lit.op == "lit" and lit.type == "string":
            try:
                lit.value = np.datetime64(lit.value)
            except ValueError:
                raise ValueError(f"{lit.text} is not a timestamp (compared with "
                                 f"{col.text!r})") from None
            lit.type = "timestamp"


# ----------------------------------------------------------------- evaluation

#: Rows per evaluation chunk: big enough that pyarrow's per-call cost is
#: nothing, small enough that a chunk's temporaries stay in cache-sized
#: pieces and every core gets several.
CHUNK_ROWS = 1 << 21


class Chunk:
    """The columns of rows ``[start, stop)`` as pyarrow arrays, made on
    demand by `fetch(name, start, stop, nan_as_null)`."""

    def __init__(self, start: int, stop: int, fetch: Callable[..., Any]):
        self.start, self.stop = start, stop
        self._fetch = fetch
        self._cache: Dict[Tuple[str, Any], Any] = {}

    def column(self, name: str, nan_as_null: bool) -> Any:
        key = (name, nan_as_null)
        if key not in self._cache:
            self._cache[key] = self._fetch(name, self.start, self.stop, nan_as_null)
        return self._cache[key]

    def codes(self, name: str) -> np.ndarray:
        key = (name, "codes")
        if key not in self._cache:
            self._cache[key] = self._fetch(name, self.start, self.stop, "codes")
        return self._cache[key]


def _pa():
    import pyarrow as pa
    import pyarrow.compute as pc
    return pa, pc


def _scalar(pa, value: Any, like: Optional[Any]) -> Any:
    """A literal as an Arrow scalar, of the column's type when it fits."""
    if value is None:
        return pa.scalar(None, type=like if like is not None else pa.null())
    if like is not None and not isinstance(value, bool):
        try:
            if pa.types.is_integer(like) and isinstance(value, (int, np.integer)):
                return pa.scalar(int(value), type=like)
            if pa.types.is_floating(like) and isinstance(value, (int, float)):
                return pa.scalar(float(value), type=like)
            if pa.types.is_timestamp(like) and isinstance(value, np.datetime64):
                return pa.scalar(value.astype(f"datetime64[{like.unit}]"), type=like)
            if pa.types.is_duration(like) and isinstance(value, np.timedelta64):
                return pa.scalar(value.astype(f"timedelta64[{like.unit}]"), type=like)
            if pa.types.is_large_string(like) and isinstance(value, str):
                return pa.scalar(value, type=like)
        except (pa.ArrowInvalid, OverflowError, ValueError):
            pass  # out of the column's range: compare in a wider type
    if isinstance(value, np.datetime64):
        unit = np.datetime_data(value.dtype)[0]
        unit = unit if unit in ("s", "ms", "us", "ns") else "s"
        return pa.scalar(value.astype(f"datetime64[{unit}]"))
    return pa.scalar(value)


def _column_type(node: Node, chunk: Chunk) -> Optional[Any]:
    if node.op == "col":
        return chunk.column(node.value, True).type
    return None


def evaluate(node: Node, chunk: Chunk) -> np.ndarray:
    """The rows of `chunk` where `node` is TRUE, as int64 offsets from its start."""
    pa, pc = _pa()
    result = _eval(node, chunk, True)
    if isinstance(result, np.ndarray):  # a categorical lookup, already bool
        return np.flatnonzero(result)
    if isinstance(result, pa.Scalar):
        return np.arange(chunk.stop - chunk.start) if result.as_py() is True \
            else np.zeros(0, np.int64)
    if result.null_count:
        result = pc.fill_null(result, False)
    return pc.indices_nonzero(result).to_numpy().astype(np.int64, copy=False)


def _as_arrow(pa, value: Any) -> Any:
    return pa.array(value) if isinstance(value, np.ndarray) else value


def _eval(node: Node, chunk: Chunk, positive: bool) -> Any:
    """`node` over `chunk`: an Arrow array or scalar (a numpy bool array
    for a categorical lookup). `positive`: no NOT above this node, so a null
    condition and a false one select the same rows (no null needs making
    from a NaN for an ordered comparison)."""
    pa, pc = _pa()
    op = node.op
    if op == "lit":  # here a condition: NULL is an unknown bool
        return _scalar(pa, node.value, pa.bool_() if node.value is None else None)
    if op == "col":
        return chunk.column(node.value, True)
    if op == "codes":
        return _codes(node, chunk, positive)
    if op == "and" or op == "or":
        a = _as_arrow(pa, _eval(node.args[0], chunk, positive))
        b = _as_arrow(pa, _eval(node.args[1], chunk, positive))
        return (pc.and_kleene if op == "and" else pc.or_kleene)(a, b)
    if op == "not":
        return pc.invert(_as_arrow(pa, _eval(node.args[0], chunk, not positive)))
    if op == "istrue":
        value = _as_arrow(pa, _eval(node.args[0], chunk, False))
        return pc.fill_null(value, False) if not isinstance(value, pa.Scalar) \
            else pa.scalar(value.as_py() is True)
    if op == "isnull":
        value = _operand(node.args[0], chunk, True, None)
        test = pc.is_null(value) if not isinstance(value, pa.Scalar) \
            else pa.scalar(not value.is_valid)
        return pc.invert(test) if node.value else test
    if op == "cmp":
        return _compare(node, chunk, positive)
    if op == "in":
        return _in(node, chunk, positive)
    if op == "between":
        left, lo, hi = node.args
        raw = positive  # x BETWEEN a AND b is two ordered comparisons
        x = _operand(left, chunk, not raw, None)
        like = x.type if not isinstance(x, pa.Scalar) else None
        ge = pc.greater_equal(x, _operand(lo, chunk, True, like))
        le = pc.less_equal(x, _operand(hi, chunk, True, like))
        return pc.and_kleene(ge, le)
    if op == "like":
        text = _operand(node.args[0], chunk, True, None)
        pattern = node.args[1].value
        if pattern is None:
            return pa.scalar(None, pa.bool_())
        escape = node.extra.get("escape")
        # SQL has no escape character unless ESCAPE names one; Arrow's is "\\".
        pattern = _reescape(pattern, escape) if escape is not None \
            else pattern.replace("\\", "\\\\")
        return pc.match_like(text, pattern, ignore_case=bool(node.value))
    if op in ("arith", "neg"):
        return _arith(node, chunk)
    raise AssertionError(op)  # pragma: no cover


def _operand(node: Node, chunk: Chunk, nan_as_null: bool, like: Optional[Any]) -> Any:
    pa, _ = _pa()
    if node.op == "col":
        return chunk.column(node.value, nan_as_null)
    if node.op == "lit":
        return _scalar(pa, node.value, like)
    return _as_arrow(pa, _eval(node, chunk, False))


_ORDERED = {"=": "equal", "<": "less", "<=": "less_equal", ">": "greater",
            ">=": "greater_equal", "!=": "not_equal"}


def _compare(node: Node, chunk: Chunk, positive: bool) -> Any:
    pa, pc = _pa()
    a, b = node.args
    # IEEE comparisons with NaN are false, which selects what SQL's NULL
    # selects, except for != (true) and under NOT: there NaN must be a null.
    raw = positive and node.value != "!="
    if a.op == "lit" and b.op != "lit":
        a, b = b, a
        flipped = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}
        op = flipped.get(node.value, node.value)
    else:
        op = node.value
    x = _operand(a, chunk, not raw, None)
    like = x.type if not isinstance(x, pa.Scalar) else None
    y = _operand(b, chunk, not raw, like)
    return getattr(pc, _ORDERED[op])(x, y)


def _in(node: Node, chunk: Chunk, positive: bool) -> Any:
    pa, pc = _pa()
    left, items = node.args[0], node.args[1:]
    x = _operand(left, chunk, not positive, None)
    like = x.type if not isinstance(x, pa.Scalar) else None
    if all(i.op == "lit" for i in items):
        values = [i.value for i in items if i.value is not None]
        has_null = len(values) != len(items)
        scalars = [_scalar(pa, v, like) for v in values]
        target = like if like is not None else (scalars[0].type if scalars else pa.null())
        value_set = pa.array([s.cast(target).as_py() if s.type != target else s.as_py()
                              for s in scalars], type=target)
        if isinstance(x, pa.Scalar):
            x = pa.array([x.as_py()], type=x.type)
            return _in_nulls(pa, pc, pc.is_in(x, value_set=value_set), x, has_null)[0]
        return _in_nulls(pa, pc, pc.is_in(x, value_set=value_set), x, has_null)
    out = None
    for item in items:
        eq = pc.equal(x, _operand(item, chunk, True, like))
        out = eq if out is None else pc.or_kleene(out, eq)
    return out


def _in_nulls(pa, pc, found, x, has_null: bool):
    """SQL's IN: NULL for a null left side, and NULL instead of FALSE when
    the list holds a NULL."""
    if has_null:
        found = pc.if_else(found, True, pa.scalar(None, pa.bool_()))
    if x.null_count:
        found = pc.if_else(pc.is_valid(x), found, pa.scalar(None, pa.bool_()))
    return found


def _reescape(pattern: str, escape: str) -> str:
    """A LIKE pattern with a custom ESCAPE character, in Arrow's backslash form."""
    if len(escape) != 1:
        raise ValueError(f"ESCAPE takes one character, not {escape!r}")
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if c == escape and i + 1 < len(pattern):
            out.append("\\" + pattern[i + 1])
            i += 2
            continue
        out.append("\\\\" if c == "\\" else c)
        i += 1
    return "".join(out)


def _arith(node: Node, chunk: Chunk) -> Any:
    pa, pc = _pa()
    if node.op == "neg":
        return pc.negate_checked(_operand(node.args[0], chunk, True, None))
    a, b = node.args
    x = _operand(a, chunk, True, None)
    y = _operand(b, chunk, True, x.type if not isinstance(x, pa.Scalar) else None)
    if node.value == "/":  # SQL engines differ; this one divides as DuckDB does (float)
        return pc.divide(pc.cast(x, pa.float64()), pc.cast(y, pa.float64()))
    if node.value == "%":
        return _modulo(pa, pc, x, y)
    fn = {"+": pc.add_checked, "-": pc.subtract_checked, "*": pc.multiply_checked}[node.value]
    return fn(x, y)


def _modulo(pa, pc, x, y):
    """C's remainder (the sign of the dividend), as SQL engines compute %."""
    if hasattr(pc, "modulo"):
        return pc.modulo(x, y)
    whole = pc.multiply(pc.divide(x, y), y)  # pragma: no cover - pyarrow < 20
    return pc.subtract(x, whole)  # pragma: no cover


# ----------------------------------------------------------------- categoricals

def fold_categoricals(node: Node, columns: Dict[str, ColumnInfo]) -> Node:
    """Replaces each condition that reads one categorical column and
    nothing else (no IS NULL) by a lookup: the condition evaluated once over
    the categories, then indexed by every row's code."""
    cols = node.columns()
    if node.type == "bool" and len(cols) == 1 and node.op != "codes" \
            and not node.has("isnull") and not node.has("istrue"):
        (name,) = cols
        if columns[name].categories is not None:
            return _lookup(node, columns[name])
    node.args = [fold_categoricals(a, columns) for a in node.args]
    return node


def _lookup(node: Node, info: ColumnInfo) -> Node:
    pa, _ = _pa()
    cats = list(info.categories or [])
    table = pa.array(cats)
    chunk = Chunk(0, len(cats), lambda name, a, b, nan: table)
    hit = _eval(node, chunk, True)
    if isinstance(hit, pa.Scalar):
        bits = np.full(len(cats), hit.as_py() is True)
        nulls = np.full(len(cats), not hit.is_valid)
    else:
        bits = hit.fill_null(False).to_numpy(zero_copy_only=False).astype(bool)
        nulls = hit.is_null().to_numpy(zero_copy_only=False).astype(bool)
    # Code -1 (a null row) reads the last entry: NULL.
    lut = np.append(bits, False)
    lut_null = np.append(nulls, True)
    return Node("codes", [], info.name, node.pos, node.text, "bool",
                extra={"lut": lut, "lut_null": lut_null})


def _codes(node: Node, chunk: Chunk, positive: bool) -> Any:
    pa, _ = _pa()
    codes = chunk.codes(node.value)
    hit = node.extra["lut"][codes]
    if positive:
        return hit
    nulls = node.extra["lut_null"][codes]
    return pa.array(hit, mask=nulls) if nulls.any() else pa.array(hit)
