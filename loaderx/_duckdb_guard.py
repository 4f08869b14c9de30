"""DuckDB for `loaderx.select`: a predicate is exactly one SQL expression,
and it runs on a connection that can read the files it names and do
nothing else.

A predicate is user text pasted into ``SELECT ... FROM data WHERE (...)``,
and DuckDB's ``execute`` runs every statement of a string; so text such
as ``x = 1; COPY (SELECT 42) TO 'pwned.csv'`` or ``x = 1 UNION ALL SELECT
-3`` must never reach it as written. Two independent layers:

1. **One expression** (`_scan`, then `check_predicate`). DuckDB's own lexer
   (``duckdb.tokenize``, the one its parser uses, so quotes, comments and
   dollar quoting are read as DuckDB reads them) finds any ``;``, any
   parenthesis that closes what the predicate did not open, nesting deeper
   than `loaderx._sql.DEPTH_MAX`, and the words of a query's clauses
   (``SELECT``, ``UNION``, ``INTERSECT``, ``EXCEPT``, ``ORDER``, ...)
   outside parentheses. Then DuckDB parses the whole query
   (``json_serialize_sql``): it must be one SELECT that differs from
   ``... WHERE (TRUE)`` in its WHERE clause only, and every table function
   a subquery calls must be one that reads (`READERS`: ``read_parquet``,
   ``read_csv``, ``range``...). Statements (``COPY``, ``ATTACH``,
   ``INSTALL``, ``LOAD``, ``SET``, ``PRAGMA``, ``CREATE``...) cannot be
   part of an expression, so they fail this parse.
2. **A connection that cannot** (`connect`): extensions are neither
   installed nor loaded (autoinstall and autoload off, no community or
   unsigned extensions, no extension repositories), no persistent
   secrets, file system access off except for the files the predicate's
   string literals name (an existing file, or a glob pattern matching
   some: `allowed_paths`), and the configuration locked, so nothing in a
   query turns any of this back on. The documented join against another
   file, ``id IN (SELECT id FROM read_parquet('keep.parquet'))``, works;
   writing, attaching a database file or reading an unnamed file does not.
   (A DuckDB older than one of the other settings goes without it, see
   `_LOCKDOWN`; one before 1.2, without ``allowed_paths``, reads no file.)

Both layers raise ValueError naming the predicate.
"""
from __future__ import annotations

import glob
import json
import os
from typing import Any, Iterator, List, Optional, Tuple

from ._sql import DEPTH_MAX

__all__ = ["run", "check_predicate", "connect", "allowed_paths", "READERS"]

#: Table functions a predicate's subqueries may call: the readers of files
#: (read only the files the predicate names, see `connect`) and generators.
READERS = frozenset({
    "read_parquet", "parquet_scan", "parquet_metadata", "parquet_schema",
    "read_csv", "read_csv_auto", "sniff_csv",
    "read_json", "read_json_auto", "read_ndjson", "read_ndjson_auto", "read_json_objects",
    "read_json_objects_auto", "read_ndjson_objects", "read_ndjson_objects_auto",
    "read_text", "read_blob", "glob", "range", "generate_series", "unnest", "repeat",
})

#: Reserved words that begin a clause of a query or a statement: never part
#: of an expression outside parentheses.
_CLAUSE_WORDS = frozenset({
    "SELECT", "UNION", "INTERSECT", "EXCEPT", "WHERE", "GROUP", "HAVING", "ORDER", "LIMIT",
    "OFFSET", "QUALIFY", "WINDOW", "RETURNING", "INTO", "FETCH", "WITH", "CREATE", "TABLE",
    "SHOW", "DESCRIBE", "SUMMARIZE", "PIVOT", "UNPIVOT",
})


def _refuse(where: str, why: str) -> ValueError:
    return ValueError(f"the predicate {where!r} is not one SQL expression: {why}")


def _tokens(duckdb: Any, where: str) -> Iterator[Tuple[int, str, str]]:
    """(character position, kind, text) of each token DuckDB's lexer finds
    (it reports byte offsets; the text runs to the next token)."""
    raw = where.encode("utf-8")
    found = duckdb.tokenize(where)
    ends = [start for start, _ in found[1:]] + [len(raw)]
    char_of = _char_offsets(where, raw)
    for (start, kind), end in zip(found, ends):
        text = raw[start:end].decode("utf-8", "replace").strip()
        yield (start if char_of is None else char_of[start]), kind.name, text


def _char_offsets(text: str, raw: bytes) -> Optional[List[int]]:
    """The character offset of each byte offset of `raw` (`text` in UTF-8),
    or None where they are the same (ASCII)."""
    if len(raw) == len(text):
        return None
    offsets: List[int] = []
    for k, c in enumerate(text):
        offsets += [k] * len(c.encode("utf-8"))
    offsets.append(len(text))
    return offsets


def _scan(where: str, tokens: List[Tuple[int, str, str]]) -> None:
    """The lexical layer, over `where`'s `tokens`: no ';', parentheses the
    predicate opened itself (at most DEPTH_MAX deep), no clause word
    outside them."""
    depth = 0
    for pos, kind, text in tokens:
        if kind == "operator":
            if ";" in text:
                raise _refuse(where, f"';' at position {pos} would end the statement")
            for c in text:
                depth += (c == "(") - (c == ")")
                if depth < 0:
                    raise _refuse(where, f"the ')' at position {pos} closes a parenthesis the "
                                         "predicate did not open")
                if depth > DEPTH_MAX:
                    raise _refuse(where, f"it nests deeper than {DEPTH_MAX} parentheses (at "
                                         f"position {pos})")
        elif kind == "keyword" and depth == 0 and text.upper() in _CLAUSE_WORDS:
            raise _refuse(where, f"{text.upper()} at position {pos} begins a query clause or "
                                 "a statement (a subquery goes in parentheses)")
    if depth:
        raise _refuse(where, "a parenthesis is not closed")


def _parsed(con: Any, sql: str) -> Any:
    """DuckDB's syntax tree of `sql` (a dict), or the error it reports (a str)."""
    text = con.execute("SELECT json_serialize_sql(CAST(? AS VARCHAR))", [sql]).fetchone()[0]
    try:
        tree = json.loads(text)
    except RecursionError:
        return "its syntax tree nests too deeply to be checked"
    return tree


def check_predicate(con: Any, where: str, sql: str, prefix: str) -> None:
    """The parse layer (after `_scan`): ValueError unless `sql` (`prefix`
    + ``(`` newline + `where` + newline + ``)``) is one SELECT whose WHERE
    clause alone holds the predicate, calling no table function but
    `READERS` (see the module docs)."""
    tree = _parsed(con, sql)
    if isinstance(tree, str):
        raise _refuse(where, tree)
    if tree.get("error"):
        raise _refuse(where, _parser_error(tree, where, prefix))
    reference = _parsed(con, f"{prefix}(\nTRUE\n)")
    statements = tree.get("statements") or []
    if len(statements) != 1 or not isinstance(reference, dict):
        raise _refuse(where, f"it makes {len(statements)} statements")
    node, want = statements[0].get("node", {}), reference["statements"][0]["node"]
    if node.get("type") != "SELECT_NODE" or node.get("where_clause") is None \
            or _outside_where(node) != _outside_where(want):
        raise _refuse(where, "it changes the query around it (a set operation, a clause "
                             "after the condition)")
    for name in _table_functions(node["where_clause"]):
        if name.lower() not in READERS:
            raise _refuse(where, f"its subquery calls the table function {name}(), which "
                                 f"does not read a file; predicates may read with "
                                 f"{sorted(READERS)}")


def _outside_where(node: dict) -> dict:
    return {key: value for key, value in node.items() if key != "where_clause"}


def _parser_error(tree: dict, where: str, prefix: str) -> str:
    """DuckDB's parse error, its position made the predicate's."""
    message = f"Parser Error: {tree.get('error_message', 'it does not parse')}"
    try:
        at = int(tree["position"]) - len(prefix.encode()) - 2  # "(" and a newline
    except (KeyError, TypeError, ValueError):
        return message
    raw = where.encode("utf-8")
    at = max(0, min(at, len(raw)))
    char_of = _char_offsets(where, raw)
    return f"{message} (at position {at if char_of is None else char_of[at]})"


def _table_functions(tree: Any) -> Iterator[str]:
    """The name of every table function called anywhere in `tree` (DuckDB's
    JSON syntax tree), walked with a stack."""
    stack = [tree]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if item.get("type") == "TABLE_FUNCTION":
                function = item.get("function") or {}
                yield str(function.get("function_name", "?"))
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def allowed_paths(duckdb: Any, where: str) -> List[str]:
    """The files the predicate's string literals name: each literal naming
    an existing file, or a glob pattern matching at least one (with the
    files it matches), as written and absolute."""
    return _named_files(list(_tokens(duckdb, where)))


def _named_files(tokens: List[Tuple[int, str, str]]) -> List[str]:
    found: List[str] = []
    for _, kind, text in tokens:
        if kind != "string_const" or len(text) < 2 or text[0] != "'" or text[-1] != "'":
            continue
        path = text[1:-1].replace("''", "'")
        if any(c in path for c in "*?["):
            matches = [m for m in glob.glob(path, recursive=True) if os.path.isfile(m)]
            if matches:  # DuckDB checks the pattern, then each file it expands to
                found += [path, os.path.abspath(path)] + matches
        elif os.path.isfile(path):
            found.append(path)
    return sorted({p for name in found for p in (name, os.path.abspath(name))})


#: What a predicate's connection sets before it turns file access off and
#: locks its configuration. A DuckDB older than one of these settings goes
#: without it (their defaults are safe, or newer than what they harden).
_LOCKDOWN = (
    ("autoinstall_known_extensions", False), ("autoload_known_extensions", False),
    ("allow_community_extensions", False), ("allow_unsigned_extensions", False),
    ("allow_persistent_secrets", False), ("allow_extension_repositories", "forbidden"),
    ("enable_progress_bar", False), ("max_expression_depth", 4 * DEPTH_MAX),
)


def _set(duckdb: Any, con: Any, name: str, value: Any) -> bool:
    """``SET name = value``; False where this DuckDB has no such setting (or
    sets it only at startup, where its default is the safe value)."""
    try:
        con.execute(f"SET {name} = ?", [value])
    except (duckdb.CatalogException, duckdb.InvalidInputException):
        return False
    return True


def connect(duckdb: Any, threads: int, readable: Optional[List[str]] = None) -> Any:
    """A DuckDB connection that reads Arrow tables registered on it and the
    files `readable` names, and can do nothing else (see the module docs).
    The caller closes it."""
    con = duckdb.connect(config={"autoinstall_known_extensions": False,
                                 "autoload_known_extensions": False,
                                 "threads": max(1, int(threads))})
    try:
        for name, value in _LOCKDOWN:
            _set(duckdb, con, name, value)
        # File access off, but for the files the predicate names (a DuckDB
        # before 1.2 has no `allowed_paths`: there a predicate reads no file).
        if readable:
            _set(duckdb, con, "allowed_paths", list(readable))
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
    except BaseException:
        con.close()
        raise
    return con


def run(duckdb: Any, table: Any, prefix: str, where: str, threads: int) -> dict:
    """The result of ``prefix (where)`` over the Arrow `table` registered as
    ``data``, as numpy arrays by column name, on a connection made for it
    (`connect`), once the predicate is checked (`check_predicate`)."""
    if "\x00" in where:
        raise _refuse(where, f"it holds a NUL character (at position {where.index(chr(0))})")
    tokens = list(_tokens(duckdb, where))
    _scan(where, tokens)  # before anything is made: most refusals cost nothing
    sql = f"{prefix}(\n{where}\n)"
    con = connect(duckdb, threads, _named_files(tokens))
    try:
        con.register("data", table)
        check_predicate(con, where, sql, prefix)
        statements = con.extract_statements(sql)
        assert len(statements) == 1, "check_predicate let more than one statement through"
        return con.execute(statements[0]).fetchnumpy()
    finally:
        con.close()
