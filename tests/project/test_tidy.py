"""Tidy: the shape rules the project guide sets for src/*.zig and loaderx/**/*.py,
checked mechanically (as TigerBeetle's tidy does).

- every function is at most 70 lines (Zig: from the `fn` line to its closing brace;
  Python: the `def` line to the last line of the body);
- every line is at most 100 columns (generated files, whose first line says
  "Generated", are exempt: they mirror their source);
- every Zig file under src/ is at most 1,000 lines (generated ones exempt, as
  above): a file past it is split by responsibility (src/capi/ holds the C
  ABI's areas, store_*.zig the store's operations);
- src/ has no `@panic`, and every `unreachable` carries a comment, on its line or
  the line above, naming the invariant that makes it unreachable;
- every file starts with a doc comment (Zig `//!`, Python a module docstring);
- the Zig sources are formatted as `zig fmt` formats them;
- loaderx/ never reaches into /proc/self/fd (descriptors the native handle
  owns are the library's business: see the after-fork hook in src/Store.zig);
- streams are recognised by the stream protocol (loaderx/streams.py:
  ``native_parts()``, ``native_windows()``, ``prefetch``...), never by a
  private ``__loaderx_*__`` dunder (loaderx/ and tests/) nor by a type-name
  test such as ``type(x).__name__ == "..."`` (loaderx/);
- a private name stays private: no module imports an underscore name
  (``_x``, not a dunder) from a public module (one whose own name has no
  leading underscore: ``dataset``, ``tokens``, ``subset``...; its ``_x`` are
  its own internals), nor from a private module of another package
  (``loaderx/converters/`` never imports ``loaderx._store._x``). A private
  module (``_ring``, ``converters/_columns``) shares its underscore names with
  the modules of its own package only. Importing a private *module* is
  allowed, also from a sub-package: ``loaderx._lib`` (the one owner of the
  native library), ``loaderx._store`` (the store base) and the other core
  ``_modules`` are the core's internals that its sub-packages build on.
  (Checked over every ``from X import Y`` in loaderx/, inside functions too.);
- no import cycles among loaderx modules: the module-level imports (what runs
  at import) form no cycle, and neither do all imports, the ones inside
  functions included, so a function-level import never hides a cycle. No
  module is exempt: object storage (``loaderx.remote``) builds on the core
  and registers the opener of URLs in ``loaderx._openers``, through which
  the core reaches it, so no store or dataset module imports it. One kind of
  edge is left out of the second graph: an import of an ancestor package
  (``from .. import __version__``: Python has imported the package before
  any of its modules). ``if TYPE_CHECKING:`` imports are not imports at run
  time and are skipped; only the package and the command line import
  ``loaderx.remote``, which imports no dataset module;
- every exception class loaderx defines (a class deriving, directly or
  through other loaderx classes, from an ``...Error``, ``...Exception`` or
  ``...Warning`` base) is importable from the ``loaderx`` package, so users
  catch it by name; `INTERNAL_EXCEPTIONS` lists the ones that never leave
  loaderx, with the reason;
- no test file (``tests/**/test_*.py``, the shared ``_*.py`` modules and the
  ``conftest.py`` files) is over 1,000 lines: split a larger one by what its
  tests pin, as tests/remote/ is split.

Each test lists every violation as `file:line: what`, so one run shows them all.
Run as a script (`python tests/project/test_tidy.py`) it prints the counts and the largest
file and function."""
import ast
import glob
import importlib.util
import os
import re
import subprocess
import sys

import pytest

# (tests/project/test_tidy.py: the repository is three levels up; computed here, not
# taken from tests/_helpers.py, so the file also runs as a script)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FUNCTION_LINES_MAX = 70
LINE_COLUMNS_MAX = 100
ZIG_FILE_LINES_MAX = 1000


def zig_files():
    return sorted(glob.glob(os.path.join(ROOT, "src", "**", "*.zig"), recursive=True))


def python_files():
    return sorted(glob.glob(os.path.join(ROOT, "loaderx", "**", "*.py"), recursive=True))


def all_files():
    return zig_files() + python_files()


def rel(path):
    return os.path.relpath(path, ROOT)


def read_lines(path):
    with open(path, encoding="utf-8") as f:
        return f.read().split("\n")


# --- Zig source without comments and literals -------------------------------------------


def zig_code_line(line):
    """The code of one Zig line: comments removed, string and character literal
    contents blanked (so braces, `fn` and `unreachable` inside them do not count),
    multiline string lines (`\\\\...`) empty."""
    if line.lstrip().startswith("\\\\"):
        return ""
    out = []
    i = 0
    while i < len(line):
        ch = line[i]
        if ch == "/" and line.startswith("//", i):
            break
        if ch in "\"'":
            end = i + 1
            while end < len(line) and line[end] != ch:
                end += 2 if line[end] == "\\" else 1
            out.append(ch + " " * (min(end, len(line)) - i - 1) + ch)
            i = end + 1
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def zig_comment(line):
    """The `//` comment of one Zig line, or "" (a `//` inside a literal is not one)."""
    code = zig_code_line(line)
    if line.lstrip().startswith("\\\\") or len(code) >= len(line):
        return ""
    return line[len(code):].strip()


FN_RE = re.compile(r"\bfn\s+(@\"[^\"]*\"|[A-Za-z_]\w*)\s*\(")
# A `{` right after one of these opens a type in a signature, not the function body
# (`error{...}!T`, `struct {...}`, `enum(u8) {...}`, `union(enum) {...}`).
TYPE_OPENER = re.compile(r"(\b(error|struct|union|enum|opaque)|\b(enum|union)\s*\([^()]*\))$")


def zig_functions(lines):
    """(name, first line, last line) of every Zig function with a body (1-based)."""
    code = [zig_code_line(line) for line in lines]
    found = []
    for row, text in enumerate(code):
        for m in FN_RE.finditer(text):
            end = zig_function_end(code, row, m.end())
            if end is not None:
                found.append((m.group(1), row + 1, end + 1))
    return found


def zig_function_end(code, row, col):
    """The row of the brace closing the body of the `fn` whose parameter list opens
    just before (row, col); None for a declaration without a body (`extern fn`)."""
    parens = 1
    braces = 0
    in_body = False
    while row < len(code):
        text = code[row]
        while col < len(text):
            ch = text[col]
            if ch in "([":
                parens += 1
            elif ch in ")]":
                parens -= 1
            elif ch == ";" and parens == 0 and braces == 0 and not in_body:
                return None
            elif ch == "{":
                if braces == 0 and parens == 0 and not in_body:
                    in_body = not TYPE_OPENER.search(text[:col].rstrip())
                braces += 1
            elif ch == "}":
                braces -= 1
                if braces == 0 and in_body:
                    return row
            col += 1
        row += 1
        col = 0
    return None


# --- checks -----------------------------------------------------------------------------


def function_sizes():
    """(file, line, name, length) of every function in src/ and loaderx/."""
    sizes = []
    for path in zig_files():
        for name, first, last in zig_functions(read_lines(path)):
            sizes.append((rel(path), first, name, last - first + 1))
    for path in python_files():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                sizes.append((rel(path), node.lineno, node.name,
                              node.end_lineno - node.lineno + 1))
    return sizes


def is_generated(lines):
    return bool(lines) and "Generated" in lines[0]


def long_zig_files():
    """`file: N lines` for every Zig file under src/ over ZIG_FILE_LINES_MAX
    (lines as `wc -l` counts them)."""
    found = []
    for path in zig_files():
        lines = read_lines(path)
        if is_generated(lines):
            continue
        count = len(lines) - (lines[-1] == "")
        if count > ZIG_FILE_LINES_MAX:
            found.append(f"{rel(path)}: {count} lines (max {ZIG_FILE_LINES_MAX}): split it by "
                         "responsibility")
    return found


def long_lines():
    found = []
    for path in all_files():
        lines = read_lines(path)
        if is_generated(lines):
            continue
        for number, line in enumerate(lines, 1):
            if len(line) > LINE_COLUMNS_MAX:
                found.append(f"{rel(path)}:{number}: {len(line)} columns")
    return found


def panics_and_unreachables():
    found = []
    for path in zig_files():
        lines = read_lines(path)
        for number, line in enumerate(lines, 1):
            code = zig_code_line(line)
            if "@panic" in code:
                found.append(f"{rel(path)}:{number}: @panic (return an error, or assert)")
            if re.search(r"\bunreachable\b", code):
                above = lines[number - 2].strip() if number >= 2 else ""
                if not zig_comment(line) and not above.startswith("//"):
                    found.append(f"{rel(path)}:{number}: `unreachable` without a comment "
                                 "naming the invariant")
    return found


def missing_doc_comments():
    found = []
    for path in zig_files():
        if not read_lines(path)[0].startswith("//!"):
            found.append(f"{rel(path)}:1: no `//!` doc comment at the top")
    for path in python_files():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        if ast.get_docstring(tree) is None:
            found.append(f"{rel(path)}:1: no module docstring")
    return found


def report(what, violations):
    return f"{len(violations)} {what}:\n" + "\n".join(violations)


def test_functions_are_short():
    over = [f"{path}:{line}: {name} is {size} lines (max {FUNCTION_LINES_MAX})"
            for path, line, name, size in function_sizes() if size > FUNCTION_LINES_MAX]
    assert not over, report("functions too long", over)


def test_lines_are_short():
    found = long_lines()
    assert not found, report(f"lines over {LINE_COLUMNS_MAX} columns", found)


def test_zig_files_stay_within_their_lines():
    found = long_zig_files()
    assert not found, report(f"Zig files over {ZIG_FILE_LINES_MAX} lines", found)


def test_no_panic_and_unreachable_is_explained():
    found = panics_and_unreachables()
    assert not found, report("panics or unexplained unreachables", found)


def test_files_start_with_a_doc_comment():
    found = missing_doc_comments()
    assert not found, report("files without a doc comment", found)


def test_python_never_touches_the_library_s_descriptors():
    found = [f"{rel(path)}:{number}: /proc/self/fd (the library owns its descriptors)"
             for path in python_files()
             for number, line in enumerate(read_lines(path), 1) if "/proc/self/fd" in line]
    assert not found, report("reaches into /proc/self/fd", found)


# --- imports and exceptions ---------------------------------------------------------------

#: Exceptions loaderx defines that never reach a caller, and why.
INTERNAL_EXCEPTIONS = {
    "NeedsDuckDB": "loaderx/_sql.py's signal that a predicate needs DuckDB; "
                   "loaderx.select catches every one",
}


def module_name(path):
    """`loaderx/x/y.py` -> `loaderx.x.y` (a package's __init__: the package)."""
    name = os.path.splitext(rel(path))[0].replace(os.sep, ".")
    return name[: -len(".__init__")] if name.endswith(".__init__") else name


def loaderx_modules():
    return {module_name(path): path for path in python_files()}


def is_type_checking(node):
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def import_nodes(tree):
    """(import node, at module level?) of a module, `if TYPE_CHECKING:` blocks left out."""
    found = []

    def visit(node, top):
        for child in ast.iter_child_nodes(node):
            if is_type_checking(child):
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append((child, top))
            inner = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda,
                                       ast.ClassDef))
            visit(child, top and not inner)

    visit(tree, True)
    return found


def imported(module, is_package, node, modules):
    """(source module, imported name or None, target module) of each name an
    import brings in; the target is the loaderx module it makes a dependency on
    (the name itself when it is a module). Non-loaderx imports are skipped."""
    if isinstance(node, ast.Import):
        return [(a.name, None, a.name) for a in node.names if a.name in modules]
    if node.level:
        parts = module.split(".") if is_package else module.split(".")[:-1]
        parts = parts[: len(parts) - (node.level - 1)]
        source = ".".join(parts + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    if source not in modules:
        return []
    out = []
    for alias in node.names:
        full = f"{source}.{alias.name}"
        out.append((source, alias.name, full if full in modules else source))
    return out


def module_imports():
    """(module, path, import node, at module level?, source, name, target) of
    every loaderx -> loaderx import in loaderx/ (see `imported`)."""
    modules = loaderx_modules()
    for module, path in modules.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        for node, top in import_nodes(tree):
            for source, name, target in imported(module, path.endswith("__init__.py"), node,
                                                 modules):
                yield module, path, node, top, source, name, target


def import_edges():
    """(importer, target, at module level?, line) of every loaderx -> loaderx import."""
    return [(module, target, top, node.lineno)
            for module, _, node, top, _, _, target in module_imports() if target != module]


def is_private_module(module):
    return module.rsplit(".", 1)[-1].startswith("_")


def package_of(module, modules):
    path = modules[module]
    return module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]


def private_name_imports():
    modules = loaderx_modules()
    found = []
    for module, path, node, _, source, name, target in module_imports():
        if name is None or not name.startswith("_") or name.startswith("__") or target != source:
            continue  # not an underscore name, or a (private) module
        if is_private_module(source) \
                and package_of(source, modules) == package_of(module, modules):
            continue  # a private module's internals, shared within its package
        found.append(f"{rel(path)}:{node.lineno}: imports {name} from {source}, "
                     "which is private to it")
    return found


def cycles(edges):
    """The strongly connected components of more than one module (Tarjan)."""
    graph = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def connect(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


def describe_cycles(found, edges):
    lines = []
    for component in found:
        inside = sorted({(a, b, line) for a, b, _, line in edges
                         if a in component and b in component})
        lines.append(" <-> ".join(component) + ": " + ", ".join(
            f"{a}:{line} -> {b}" for a, b, line in inside))
    return lines


def lazy_edge_allowed(importer, target, top):
    """Whether an import is left out of the cycle check: only an import of
    an ancestor package (imported before any of its modules)."""
    return target == importer.split(".")[0] or importer.startswith(target + ".")


def exception_classes():
    """(file, line, name) of every exception class defined in loaderx/."""
    classes = []
    for path in python_files():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases = [ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases]
                classes.append((rel(path), node.lineno, node.name, bases))
    known = set()
    changed = True
    while changed:  # close over loaderx classes that derive from loaderx exceptions
        changed = False
        for _, _, name, bases in classes:
            if name not in known and any(b in known or b.endswith(("Error", "Exception",
                                                                    "Warning"))
                                         for b in bases):
                known.add(name)
                changed = True
    return [(path, line, name) for path, line, name, _ in classes if name in known]


def test_no_private_name_is_imported_from_another_module_s_internals():
    found = private_name_imports()
    assert not found, report("imports of another module's private names", found)


def test_module_level_imports_form_no_cycle():
    edges = [e for e in import_edges() if e[2]]
    found = describe_cycles(cycles((a, b) for a, b, _, _ in edges), edges)
    assert not found, report("import cycles at module level", found)


def test_no_function_level_import_hides_a_cycle():
    edges = [e for e in import_edges() if not lazy_edge_allowed(e[0], e[1], e[2])]
    found = describe_cycles(cycles((a, b) for a, b, _, _ in edges), edges)
    assert not found, report("import cycles (function-level imports included)", found)


#: The modules that may import loaderx.remote: the package (which imports it
#: so that it registers the opener of URLs) and the command line's `cache`.
REMOTE_IMPORTERS = {"loaderx", "loaderx.__main__"}
#: What loaderx.remote never imports: it builds on the stores, below the
#: datasets that open them (the manifest is loaderx._manifest's).
BELOW_REMOTE = {"loaderx.dataset", "loaderx.zrecord", "loaderx.shardset", "loaderx.subset",
                "loaderx.converters"}


def layering_violations(edges):
    found = [f"{a}:{line}: imports loaderx.remote (reach object storage through "
             "loaderx._openers)" for a, b, _, line in edges
             if b == "loaderx.remote" and a not in REMOTE_IMPORTERS]
    found += [f"{a}:{line}: loaderx.remote imports {b}, which opens stores above it"
              for a, b, _, line in edges if a == "loaderx.remote" and b in BELOW_REMOTE]
    return found


def test_object_storage_is_a_backend_the_core_never_imports():
    found = layering_violations(import_edges())
    assert not found, report("imports across the remote layer", found)
    assert layering_violations([("loaderx._store", "loaderx.remote", False, 9),
                                ("loaderx.remote", "loaderx.dataset", True, 4)]) == [
        "loaderx._store:9: imports loaderx.remote (reach object storage through "
        "loaderx._openers)",
        "loaderx.remote:4: loaderx.remote imports loaderx.dataset, which opens stores above it"]


def test_the_import_scanners():
    modules = {"loaderx": "loaderx/__init__.py", "loaderx.a": "loaderx/a.py",
               "loaderx._b": "loaderx/_b.py", "loaderx.sub": "loaderx/sub/__init__.py"}
    tree = ast.parse("from . import a\nfrom ._b import _x, y\nimport numpy\n"
                     "def f():\n    from .a import z\n"
                     "if TYPE_CHECKING:\n    from .sub import T\n")
    found = [(imported("loaderx.c", False, node, modules), top)
             for node, top in import_nodes(tree)]
    assert found == [([("loaderx", "a", "loaderx.a")], True),
                     ([("loaderx._b", "_x", "loaderx._b"), ("loaderx._b", "y", "loaderx._b")],
                      True),
                     ([], True),
                     ([("loaderx.a", "z", "loaderx.a")], False)]
    assert cycles([("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")]) == [["a", "b", "c"]]
    assert cycles([("a", "b"), ("b", "c")]) == []
    assert lazy_edge_allowed("loaderx.converters._dest", "loaderx", False)
    assert not lazy_edge_allowed("loaderx._store", "loaderx.remote", False)
    assert not lazy_edge_allowed("loaderx._store", "loaderx.remote", True)
    assert not lazy_edge_allowed("loaderx.shardset", "loaderx.dataset", False)


def test_every_exception_is_exported_from_the_package():
    import loaderx

    classes = exception_classes()
    names = {name for _, _, name in classes}
    assert {"CorruptStoreError", "ConvertError", "RemoteIOError"} <= names  # the scan works
    found = [f"{path}:{line}: {name} is not importable from loaderx"
             for path, line, name in classes
             if name not in INTERNAL_EXCEPTIONS and not hasattr(loaderx, name)]
    assert not found, report("exceptions users cannot catch by name", found)
    missing = [name for name in loaderx.__all__ if not hasattr(loaderx, name)]
    assert not missing, f"loaderx.__all__ names what loaderx lacks: {missing}"
    assert set(INTERNAL_EXCEPTIONS) <= names, "INTERNAL_EXCEPTIONS names a class that is gone"


TEST_FILE_LINES_MAX = 1000


def suite_files():
    """The suite's Python files: test modules, shared helpers, conftest.py."""
    found = set()
    for pattern in ("test_*.py", "_*.py", "conftest.py"):
        found |= set(glob.glob(os.path.join(ROOT, "tests", "**", pattern), recursive=True))
    return sorted(p for p in found if "__pycache__" not in p)


def long_test_files():
    found = []
    for path in suite_files():
        with open(path, encoding="utf-8") as f:
            count = sum(1 for _ in f)
        if count > TEST_FILE_LINES_MAX:
            found.append(f"{rel(path)}: {count:,} lines (at most {TEST_FILE_LINES_MAX:,}: "
                         "split it by what its tests pin)")
    return found


def test_test_files_are_short():
    assert any(p.endswith(os.path.join("project", "test_tidy.py")) for p in suite_files())
    found = long_test_files()
    assert not found, report("test files over the line limit", found)


#: The old private stream dunders (split so this file does not match itself).
OLD_DUNDER = re.compile("__" + r"loaderx_[a-z_]+__")
TYPE_NAME_TEST = re.compile(r"(type\([^()]*\)|__class__)\.__name__\s*[!=]=")


def stream_protocol_violations():
    tests = sorted(glob.glob(os.path.join(ROOT, "tests", "**", "*.py"), recursive=True))
    found = []
    for path in python_files() + tests:
        for number, line in enumerate(read_lines(path), 1):
            if OLD_DUNDER.search(line):
                found.append(f"{rel(path)}:{number}: a private stream dunder "
                             "(use native_parts()/native_windows(), loaderx.streams)")
            if path in tests:
                continue
            if TYPE_NAME_TEST.search(line):
                found.append(f"{rel(path)}:{number}: a type-name test (use the stream "
                             "protocol, isinstance or a capability)")
    return found


def test_streams_are_recognised_by_the_protocol():
    found = stream_protocol_violations()
    assert not found, report("streams recognised outside the protocol", found)
    assert OLD_DUNDER.search("x." + "__loaderx_" + "parts__()")
    assert TYPE_NAME_TEST.search('if type(s).__name__ == "TokenSegments":')
    assert TYPE_NAME_TEST.search("stream.__class__.__name__ != 'View'")
    assert not TYPE_NAME_TEST.search("f'got {type(x).__name__}'")


@pytest.mark.skipif(importlib.util.find_spec("ziglang") is None,
                    reason="ziglang (the test extra) is not installed")
def test_zig_sources_are_formatted():
    files = [os.path.join(ROOT, "build.zig")] + zig_files()
    files = [f for f in files if os.path.exists(f)]
    if not files:
        pytest.skip("no Zig sources here (an installed wheel's suite)")
    done = subprocess.run([sys.executable, "-m", "ziglang", "fmt", "--check", *files],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"zig fmt would change:\n{done.stdout}{done.stderr}"


def test_zig_function_scanner():
    """The scanner finds bodies, skips literals, type openers and body-less decls."""
    src = [
        "//! doc",
        'extern fn ZSTD_x(a: usize) usize;',
        "fn a(x: u32) error{Bad}!u32 {",
        '    const s = "}{ fn b(";',
        "    // } fn c() {",
        "    return x;",
        "}",
        "pub fn d() void { return; }",
        "const T = *const fn (u32) void;",
        "fn e() enum(u8) { x, y } {",
        "    \\\\ } multiline {",
        "    return .x;",
        "}",
    ]
    assert zig_functions(src) == [("a", 3, 7), ("d", 8, 8), ("e", 10, 13)]
    assert zig_comment("    x catch unreachable; // count >= 1") == "// count >= 1"
    assert zig_comment('    const s = "// not a comment";') == ""


if __name__ == "__main__":
    sizes = function_sizes()
    over = [s for s in sizes if s[3] > FUNCTION_LINES_MAX]
    print(f"long lines: {len(long_lines())}")
    print(f"Zig files over {ZIG_FILE_LINES_MAX} lines: {long_zig_files() or 'none'}")
    print(f"functions over {FUNCTION_LINES_MAX} lines: {len(over)}")
    for path, line, name, size in sorted(over, key=lambda s: -s[3]):
        print(f"  {path}:{line}: {name} {size}")
    print("largest function:", max(sizes, key=lambda s: s[3]))
    largest = max(all_files(), key=lambda p: len(read_lines(p)))
    print("largest file:", rel(largest), len(read_lines(largest)) - 1, "lines")
    print("unreachable/panic:", panics_and_unreachables())
    print("doc comments:", missing_doc_comments())
    edges = import_edges()
    checked = [(a, b) for a, b, top, _ in edges if not lazy_edge_allowed(a, b, top)]
    print("import cycles (function-level imports included):",
          [len(c) for c in cycles(checked)] or "none")
    lazy = {(a, line) for a, _, top, line in edges if not top}
    print(f"function-level imports of loaderx modules: {len(lazy)}")
