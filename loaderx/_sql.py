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

Nothing here recurses per term or per level of nesting: comments (``--``,
``/* */``) are skipped as DuckDB skips them, a ``;`` is a syntax error (a
predicate is one expression), parentheses are matched with a stack and
each group parsed once its own groups are, AND and OR are n-ary nodes, and
the type check, the categorical folding and the evaluator walk the tree
with explicit stacks. So a chain of 10,000 terms works, and the nesting
bound (`DEPTH_MAX`, a ValueError with the position) is a promise about
predicates, not a guard for the interpreter's stack.
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

__all__ = ["parse", "NeedsDuckDB", "Node", "ColumnInfo", "check", "evaluate", "not_scalar"]


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


def _comment_end(source: str, pos: int) -> int:
    """Where the comment at `pos` ends (`pos` itself if none begins there):
    ``--`` runs to the end of the line, ``/* */`` nests, as in DuckDB."""
    if source.startswith("--", pos):
        end = source.find("\n", pos)
        return len(source) if end < 0 else end + 1
    if not source.startswith("/*", pos):
        return pos
    depth, i = 0, pos
    while i < len(source):
        if source.startswith("/*", i):
            depth, i = depth + 1, i + 2
        elif source.startswith("*/", i):
            depth, i = depth - 1, i + 2
            if depth == 0:
                return i
        else:
            i += 1
    raise _syntax(source, pos, "the comment is not closed ('/*' needs a '*/')")


def tokenize(source: str) -> List[Token]:
    tokens = []
    pos = 0
    while pos < len(source):
        skipped = _comment_end(source, pos)
        if skipped != pos:
            pos = skipped
            continue
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
            if text == ";":
                raise _syntax(source, pos, "';' ends an SQL statement; a predicate is one "
                                           "expression, with no ';' (outside quotes)")
            if text in ("||", "::", ".", "[", "]"):
                raise NeedsDuckDB(f"the operator {text!r} (at position {pos})")
            tokens.append(Token("op", text, text, pos))
        pos = m.end()
    tokens.append(Token("end", "", None, len(source)))
    return tokens


# ----------------------------------------------------------------- the tree

#: How deep a predicate may nest. Each parenthesis, NOT, unary minus and
#: operand of an operator inside another's operand adds a level; a chain of
#: AND, OR, + / - or * / / / % terms adds one however long it is. Nothing
#: here recurses per level (parentheses are parsed group by group, and the
#: tree is walked with explicit stacks), so the bound is a promise about
#: what a predicate may be, not a guard for the interpreter's stack.
DEPTH_MAX = 200


class Node:
    """One node of a parsed predicate. `op`: ``col``, ``lit``, ``not``,
    ``and``, ``or`` (n-ary), ``cmp``, ``in``, ``between``, ``like``,
    ``isnull``, ``istrue``, ``arith``, ``neg``, ``codes`` (a categorical
    condition, see `fold_categoricals`). `text` is the node's source text,
    for messages (cut from the predicate when first asked for)."""

    __slots__ = ("op", "args", "value", "pos", "type", "extra", "depth", "_text", "_span")

    def __init__(self, op: str, args: Optional[List["Node"]] = None, value: Any = None,
                 pos: int = 0, text: str = "", type: str = "",
                 extra: Optional[Dict[str, Any]] = None, depth: int = 1,
                 span: Optional[Tuple[str, int]] = None):
        self.op = op
        self.args: List[Node] = args if args is not None else []
        self.value = value  # column name, literal, operator, negation flag...
        self.pos = pos
        self.type = type  # set by check(): int, float, bool, string, timestamp, duration, null
        self.extra: Dict[str, Any] = extra if extra is not None else {}
        self.depth = depth
        self._text = text
        self._span = span  # (source, end): text is source[pos:end]

    @property
    def text(self) -> str:
        if not self._text and self._span is not None:
            source, end = self._span
            self._text = source[self.pos:end].strip()
        return self._text

    @text.setter
    def text(self, value: str) -> None:
        self._text = value

    def walk(self) -> Iterator["Node"]:
        """This node and every node under it (depth first, no recursion)."""
        stack = [self]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.args)

    def columns(self) -> set:
        return {n.value for n in self.walk() if n.op in ("col", "codes")}

    def has(self, op: str) -> bool:
        return any(n.op == op for n in self.walk())

    def __repr__(self) -> str:
        return f"Node({self.op!r}, {self.text!r})"


def post_order(root: Node) -> List[Node]:
    """The nodes under `root`, every node after its operands, operands
    left to right (the order a recursive walk would visit them)."""
    order = list(root.walk())  # right operands first: reversed, left first and parents last
    order.reverse()
    return order


_COMPARE = {"=": "=", "==": "=", "!=": "!=", "<>": "!=", "<": "<", "<=": "<=", ">": ">",
            ">=": ">="}


def _too_deep(source: str, pos: int) -> ValueError:
    return _syntax(source, pos, f"the predicate nests deeper than {DEPTH_MAX} levels (a "
                   "chain of AND, OR or arithmetic terms counts once; see docs/select.md)")


class _Parser:
    """Recursive descent over the tokens of one parenthesized group (or of
    the whole predicate), whose own groups were parsed before it (see
    `parse`): a group is a ``group`` token holding its tree, or a ``list``
    token holding the items of an ``IN (...)`` list. So the recursion here
    is bounded by the grammar's levels, not by the predicate's nesting."""

    def __init__(self, source: str, tokens: List[Token]):
        self.source = source
        self.tokens = tokens
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

    def node(self, op: str, args: List[Node], value: Any, start: int, *, chain: bool = False,
             extra: Optional[Dict[str, Any]] = None) -> Node:
        """A node over `args` spanning from `start` to the last token taken,
        refused past DEPTH_MAX levels. `chain`: the first operand continues
        a chain of the same operators (a + b + c), which adds no level."""
        depth = 1 + max((a.depth for a in args), default=0)
        if chain:
            depth = max(args[0].depth, 1 + max(a.depth for a in args[1:]))
        if depth > DEPTH_MAX:
            raise _too_deep(self.source, start)
        last = self.tokens[self.i - 1]
        return Node(op, args, value, start, extra=extra, depth=depth,
                    span=(self.source, last.pos + len(last.text)))

    def whole(self) -> Node:
        """The predicate: one condition, then the end."""
        node = self.or_()
        if not self.at("end"):
            raise self.error("expected AND, OR or the end of the predicate")
        return node

    def group(self) -> Node:
        """A parenthesized condition or value."""
        node = self.or_()
        if not self.at("close"):
            raise self.error("expected ')'")
        return node

    def items(self) -> List[Node]:
        """The values of an ``IN (...)`` list."""
        items = [self.additive()]
        while self.accept("op", ","):
            items.append(self.additive())
        if not self.at("close"):
            raise self.error("expected ',' or ')' in the IN list")
        return items

    def or_(self) -> Node:
        return self.conjunction("OR", self.and_)

    def and_(self) -> Node:
        return self.conjunction("AND", self.not_)

    def conjunction(self, word: str, operand: Callable[[], Node]) -> Node:
        """``a OR b OR c`` as one n-ary node (so a chain of any length is flat)."""
        start = self.tok.pos
        args = [operand()]
        while self.accept("keyword", word):
            args.append(operand())
        return args[0] if len(args) == 1 else self.node(word.lower(), args, None, start)

    def not_(self) -> Node:
        starts = []
        while self.at("keyword", "NOT"):
            starts.append(self.take().pos)
        node = self.predicate()
        for start in reversed(starts):
            node = self.node("not", [node], None, start)
        return node

    def predicate(self) -> Node:
        start = self.tok.pos
        left = self.additive()
        t = self.tok
        if t.kind == "op" and t.value in _COMPARE:
            self.take()
            right = self.additive()
            return self.node("cmp", [left, right], _COMPARE[t.value], start)
        negated = False
        if self.at("keyword", "NOT") and self.tokens[self.i + 1].kind == "keyword" \
                and self.tokens[self.i + 1].value in ("IN", "BETWEEN", "LIKE", "ILIKE"):
            self.take()
            negated = True
        if self.accept("keyword", "IN"):
            if not self.at("list"):
                raise self.error("expected '(' after IN")
            node = self.node("in", [left] + self.take().value, None, start)
        elif self.accept("keyword", "BETWEEN"):
            lo = self.additive()
            self.expect("keyword", "AND", "AND in BETWEEN ... AND ...")
            hi = self.additive()
            node = self.node("between", [left, lo, hi], None, start)
        elif self.at("keyword", "LIKE") or self.at("keyword", "ILIKE"):
            icase = self.take().value == "ILIKE"
            pattern = self.additive()
            escape = None
            if self.accept("keyword", "ESCAPE"):
                escape = self.expect("string", None, "a one-character string after ESCAPE")
            node = self.node("like", [left, pattern], icase, start,
                             extra={"escape": escape.value if escape else None})
        elif self.accept("keyword", "IS"):
            return self.is_(left, start)
        else:
            if negated:
                raise self.error("expected IN, BETWEEN or LIKE after NOT")
            return left
        return self.node("not", [node], None, start) if negated else node

    def is_(self, left: Node, start: int) -> Node:
        """``left IS [NOT] NULL / TRUE / FALSE`` (after IS)."""
        neg = bool(self.accept("keyword", "NOT"))
        if self.at("keyword", "TRUE") or self.at("keyword", "FALSE"):
            truth = self.take().value == "TRUE"
            test = self.node("cmp", [left, Node("lit", value=truth, pos=start, text=str(truth))],
                             "=", start)
            # x IS TRUE is never NULL: false where x is NULL.
            node = self.node("istrue", [test], None, start)
            return self.node("not", [node], None, start) if neg else node
        self.expect("keyword", "NULL", "NULL, TRUE or FALSE after IS")
        return self.node("isnull", [left], neg, start)

    def additive(self) -> Node:
        return self.arithmetic(("+", "-"), self.term)

    def term(self) -> Node:
        return self.arithmetic(("*", "/", "%"), self.unary)

    def arithmetic(self, ops: Tuple[str, ...], operand: Callable[[], Node]) -> Node:
        """A left-to-right chain of `ops` (left-deep binary nodes, one level)."""
        start = self.tok.pos
        node = operand()
        while self.tok.kind == "op" and self.tok.value in ops:
            op = self.take().value
            node = self.node("arith", [node, operand()], op, start, chain=True)
        return node

    def unary(self) -> Node:
        signs = []
        while self.at("op", "-") or self.at("op", "+"):
            signs.append(self.take())
        node = self.primary()
        for sign in reversed(signs):
            if sign.value == "+":
                continue
            if node.op == "lit" and isinstance(node.value, (int, float)) \
                    and not isinstance(node.value, bool):
                node = self.node("lit", [], -node.value, sign.pos)
            else:
                node = self.node("neg", [node], None, sign.pos)
        return node

    def primary(self) -> Node:
        t = self.tok
        if t.kind == "group":
            return self.take().value
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
            return Node("col", value=t.value, pos=t.pos, text=t.text)
        raise self.error("expected a column, a value or '('")


def parse(source: str) -> Node:
    """The tree of a predicate; ValueError for a syntax error (with its
    position) or nesting deeper than DEPTH_MAX, NeedsDuckDB for SQL beyond
    the subset.

    Parentheses are matched first, with a stack: when a group closes, its
    tokens are parsed (its own groups already are) and the group becomes
    one token of the enclosing group. So no parse recurses per level."""
    if not isinstance(source, str):
        raise TypeError(f"the predicate must be a str, not {type(source).__name__}")
    tokens = tokenize(source)
    if tokens[0].kind == "end":
        raise _syntax(source, 0, "the predicate is empty")
    open_groups: List[Tuple[Token, List[Token]]] = []  # each open '(' and the tokens before it
    current: List[Token] = []
    for t in tokens:
        if t.kind == "op" and t.value == "(":
            if len(open_groups) >= DEPTH_MAX:
                raise _too_deep(source, t.pos)
            if current and current[-1].kind == "ident":
                raise NeedsDuckDB(f"the function call {current[-1].text}(...) (at position "
                                  f"{current[-1].pos})")
            open_groups.append((t, current))
            current = []
        elif t.kind == "op" and t.value == ")":
            if not open_groups:
                raise _syntax(source, t.pos, "expected AND, OR or the end of the predicate, "
                                             "found ')'")
            opening, outer = open_groups.pop()
            outer.append(_group(source, opening, current, t, outer))
            current = outer
        else:
            current.append(t)
    if open_groups:
        raise _syntax(source, len(source), "expected ')', found the end of the predicate")
    return _Parser(source, current).whole()


def _group(source: str, opening: Token, inner: List[Token], closing: Token,
           outer: List[Token]) -> Token:
    """The group `opening` ... `closing` as one token: an IN list after
    IN, else a parenthesized expression (whose text includes the parentheses)."""
    parser = _Parser(source, inner + [Token("close", ")", None, closing.pos)])
    text = source[opening.pos:closing.pos + 1]
    if outer and outer[-1].kind == "keyword" and outer[-1].value == "IN":
        return Token("list", text, parser.items(), opening.pos)
    node = parser.group()
    node.text = text
    return Token("group", text, node, opening.pos)


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
    for n in post_order(node):
        _check(n, columns)
    if node.type == RECORDS:
        raise not_scalar(node.extra["info"])
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


#: The type of a column of records with nulls: only IS [NOT] NULL takes it.
RECORDS = "records"


def not_scalar(info: ColumnInfo, duckdb: bool = False) -> ValueError:
    """The error for a predicate over a column of records (`duckdb`: one the
    DuckDB engine was given, which never asks a records column's mask)."""
    if duckdb and info.nullable:
        return ValueError(f"column {info.name!r} holds {info.describe}; DuckDB is given scalar "
                          f"columns only ({info.name} IS NULL is asked with the arrow engine: "
                          "engine=None or 'arrow')")
    nulls = f"; of its records, only whether one is null can be asked ({info.name} IS NULL)" \
        if info.nullable else ""
    return ValueError(f"column {info.name!r} holds {info.describe}; predicates apply to "
                      f"scalar columns (numbers, bools, strings, categoricals, times){nulls}")


def _check(node: Node, columns: Dict[str, ColumnInfo]) -> None:
    """Types `node`, whose operands are typed already."""
    op = node.op
    for a in node.args if op != "isnull" else ():
        if a.type == RECORDS:
            raise not_scalar(a.extra["info"])
    if op == "col":
        info = columns.get(node.value)
        if info is None:
            raise _unknown(node.value, columns)
        if not info.type and not info.nullable:
            raise not_scalar(info)
        node.type = info.type or RECORDS
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


class _Literal:
    """A literal operand, made an Arrow scalar by the node that reads it,
    of the other operand's type where it fits (see `_scalar`)."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value


class _Frame:
    """A node being evaluated: how (`positive`: no NOT above it; `nan`:
    None for a condition, else an operand whose NaN is a null or not), and
    the values of its operands so far (an AND/OR folds them as they come)."""

    __slots__ = ("node", "positive", "nan", "next", "got")

    def __init__(self, node: Node, positive: bool, nan: Optional[bool]):
        self.node, self.positive, self.nan = node, positive, nan
        self.next = 0
        self.got: List[Any] = []


def _eval(root: Node, chunk: Chunk, positive: bool) -> Any:
    """`root` over `chunk`, as a condition: an Arrow array or scalar (a
    numpy bool array for a categorical lookup). `positive`: no NOT above
    it, so a null condition and a false one select the same rows (no null
    needs making from a NaN for an ordered comparison). Operands are
    evaluated before their node, with an explicit stack (no recursion)."""
    pa, pc = _pa()
    frames = [_Frame(root, positive, None)]
    while True:
        frame = frames[-1]
        node = frame.node
        if node.op not in ("col", "lit", "codes") and frame.next < len(node.args):
            child_positive, child_nan = _mode(node, frame.next, frame.positive)
            frames.append(_Frame(node.args[frame.next], child_positive, child_nan))
            frame.next += 1
            continue
        frames.pop()
        value = _leaf(pa, frame, chunk) if node.op in ("col", "lit", "codes") \
            else _apply(pa, pc, node, frame.got, frame.positive)
        if not frames:
            return value
        parent = frames[-1]
        if not isinstance(value, _Literal):
            value = _as_arrow(pa, value)
        if parent.node.op in ("and", "or") and parent.got:
            kleene = pc.and_kleene if parent.node.op == "and" else pc.or_kleene
            parent.got[0] = kleene(parent.got[0], value)
        else:
            parent.got.append(value)


def _mode(node: Node, k: int, positive: bool) -> Tuple[bool, Optional[bool]]:
    """How `node` reads its operand `k`: (positive, nan) as in `_Frame`.
    IEEE comparisons with NaN are false, which selects what SQL's NULL
    selects, except for != (true) and under NOT: there NaN must be a null."""
    op = node.op
    if op in ("and", "or"):
        return positive, None
    if op == "not":
        return not positive, None
    if op == "istrue":
        return False, None
    if op == "cmp":
        return False, not (positive and node.value != "!=")
    if op in ("in", "between") and k == 0:
        return False, not positive
    return False, True  # isnull, in/between values, like, arith, neg


def _leaf(pa, frame: _Frame, chunk: Chunk) -> Any:
    node = frame.node
    if node.op == "col":
        return chunk.column(node.value, True if frame.nan is None else frame.nan)
    if node.op == "codes":
        return _codes(node, chunk, frame.positive)
    if frame.nan is not None:
        return _Literal(node.value)
    # A literal condition: NULL is an unknown bool.
    return _scalar(pa, node.value, pa.bool_() if node.value is None else None)


def _value(pa, value: Any, like: Optional[Any]) -> Any:
    """An operand's value: an evaluated one as it is, a literal as a scalar."""
    return _scalar(pa, value.value, like) if isinstance(value, _Literal) else value


def _type_of(pa, value: Any) -> Optional[Any]:
    return value.type if not isinstance(value, pa.Scalar) else None


def _apply(pa, pc, node: Node, args: List[Any], positive: bool) -> Any:
    """`node` over its operands' values `args` (see `_eval`)."""
    op = node.op
    if op in ("and", "or"):  # folded as they came: args[0] is the whole
        return args[0]
    if op == "not":
        return pc.invert(args[0])
    if op == "istrue":
        value = args[0]
        return pc.fill_null(value, False) if not isinstance(value, pa.Scalar) \
            else pa.scalar(value.as_py() is True)
    if op == "isnull":
        value = _value(pa, args[0], None)
        test = pc.is_null(value) if not isinstance(value, pa.Scalar) \
            else pa.scalar(not value.is_valid)
        return pc.invert(test) if node.value else test
    if op == "cmp":
        return _compare(pa, pc, node.value, args[0], args[1])
    if op == "in":
        return _in(pa, pc, args[0], args[1:])
    if op == "between":  # x BETWEEN a AND b is two ordered comparisons
        x = _value(pa, args[0], None)
        like = _type_of(pa, x)
        ge = pc.greater_equal(x, _value(pa, args[1], like))
        le = pc.less_equal(x, _value(pa, args[2], like))
        return pc.and_kleene(ge, le)
    if op == "like":
        return _like(pa, pc, node, _value(pa, args[0], None))
    if op in ("arith", "neg"):
        return _arith(pa, pc, node, args)
    raise AssertionError(op)  # pragma: no cover


_ORDERED = {"=": "equal", "<": "less", "<=": "less_equal", ">": "greater",
            ">=": "greater_equal", "!=": "not_equal"}
_FLIPPED = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}


def _compare(pa, pc, op: str, x: Any, y: Any) -> Any:
    if isinstance(x, _Literal) and not isinstance(y, _Literal):
        x, y = y, x
        op = _FLIPPED.get(op, op)
    x = _value(pa, x, None)
    y = _value(pa, y, _type_of(pa, x))
    return getattr(pc, _ORDERED[op])(x, y)


def _in(pa, pc, x: Any, items: List[Any]) -> Any:
    x = _value(pa, x, None)
    like = _type_of(pa, x)
    if all(isinstance(i, _Literal) for i in items):
        values = [i.value for i in items if i.value is not None]
        has_null = len(values) != len(items)
        scalars = [_scalar(pa, v, like) for v in values]
        target = _common_type(pa, [x.type] + [s.type for s in scalars])
        if x.type != target:  # an int column IN (1, 2.5): compared as floats
            x = pc.cast(x, target)
        value_set = pa.array([s.cast(target).as_py() if s.type != target else s.as_py()
                              for s in scalars], type=target)
        if pa.types.is_floating(target):
            # is_in hashes bits, so -0.0 would not find 0.0; SQL's = does.
            # Adding +0.0 makes every zero +0.0 and changes nothing else.
            zero = pa.scalar(0.0, target)
            x, value_set = pc.add(x, zero), pc.add(value_set, zero)
        if isinstance(x, pa.Scalar):
            x = pa.array([x.as_py()], type=x.type)
            return _in_nulls(pa, pc, pc.is_in(x, value_set=value_set), x, has_null)[0]
        return _in_nulls(pa, pc, pc.is_in(x, value_set=value_set), x, has_null)
    out = None
    for item in items:
        eq = pc.equal(x, _value(pa, item, like))
        out = eq if out is None else pc.or_kleene(out, eq)
    return out


def _common_type(pa, types: List[Any]) -> Any:
    """The type an IN list is compared in: the left side's, or float64
    where numbers of both kinds meet (NULLs have no say)."""
    known = [t for t in types if t != pa.null()]
    if not known:
        return pa.null()
    numeric = all(pa.types.is_integer(t) or pa.types.is_floating(t) for t in known)
    if numeric and len(set(known)) > 1 and any(pa.types.is_floating(t) for t in known) \
            and not all(pa.types.is_floating(t) for t in known):
        return pa.float64()
    return known[0]


def _in_nulls(pa, pc, found, x, has_null: bool):
    """SQL's IN: NULL for a null left side, and NULL instead of FALSE when
    the list holds a NULL."""
    if has_null:
        found = pc.if_else(found, True, pa.scalar(None, pa.bool_()))
    if x.null_count:
        found = pc.if_else(pc.is_valid(x), found, pa.scalar(None, pa.bool_()))
    return found


def _like(pa, pc, node: Node, text: Any) -> Any:
    pattern = node.args[1].value
    if pattern is None:
        return pa.scalar(None, pa.bool_())
    escape = node.extra.get("escape")
    # SQL has no escape character unless ESCAPE names one; Arrow's is "\\".
    pattern = _reescape(pattern, escape) if escape is not None else pattern.replace("\\", "\\\\")
    return pc.match_like(text, pattern, ignore_case=bool(node.value))


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


def _arith(pa, pc, node: Node, args: List[Any]) -> Any:
    if node.op == "neg":
        return pc.negate_checked(_value(pa, args[0], None))
    x = _value(pa, args[0], None)
    y = _value(pa, args[1], _type_of(pa, x))
    if node.value == "/":  # SQL engines differ; this one divides as DuckDB does (float)
        return pc.divide(pc.cast(x, pa.float64()), pc.cast(y, pa.float64()))
    if node.value == "%":
        return _modulo(pa, pc, x, y)
    fn = {"+": pc.add_checked, "-": pc.subtract_checked, "*": pc.multiply_checked}[node.value]
    return fn(x, y)


def _modulo(pa, pc, x, y):
    """C's remainder (the sign of the dividend), as DuckDB and SQL engines
    compute %. pyarrow's ``modulo`` is Python's (the sign of the divisor):
    where the two differ (a remainder, not 0, of the other sign than the
    dividend), C's is Python's minus the divisor."""
    if not hasattr(pc, "modulo"):  # pragma: no cover - pyarrow < 20 (truncating divide)
        return pc.subtract(x, pc.multiply(pc.divide(x, y), y))
    python = pc.modulo(x, y)
    other_sign = pc.and_(pc.not_equal(python, 0), pc.not_equal(pc.less(python, 0), pc.less(x, 0)))
    return pc.if_else(other_sign, pc.subtract(python, y), python)


# ----------------------------------------------------------------- categoricals

def fold_categoricals(node: Node, columns: Dict[str, ColumnInfo]) -> Node:
    """Replaces each condition that reads one categorical column and
    nothing else (no IS NULL) by a lookup: the condition evaluated once over
    the categories, then indexed by every row's code. Top down, the
    outermost such condition first, with an explicit stack."""
    folded = _folded(node, columns)
    if folded is not None:
        return folded
    stack = [node]
    while stack:
        parent = stack.pop()
        for k, arg in enumerate(parent.args):
            folded = _folded(arg, columns)
            if folded is not None:
                parent.args[k] = folded
            else:
                stack.append(arg)
    return node


def _folded(node: Node, columns: Dict[str, ColumnInfo]) -> Optional[Node]:
    """`node` as a lookup (see `fold_categoricals`), or None."""
    if node.type != "bool" or node.op == "codes":
        return None
    cols = node.columns()
    if len(cols) != 1 or node.has("isnull") or node.has("istrue"):
        return None
    (name,) = cols
    return _lookup(node, columns[name]) if columns[name].categories is not None else None


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
