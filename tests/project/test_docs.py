"""Examples are code: every Python block of README.md and docs/*.md runs, as
written and as a user pastes them: a page's blocks in page order, each in a
fresh process, all of them in one fresh working directory per page. A block
may use what an earlier block of its page made; one that collides with an
earlier block's leftovers (a store created twice) fails here as it would
for the user.

Each block is its own test. Running one alone (``-k 'README.md:300'``) first
runs the blocks above it on its page, in order; a block whose predecessor
failed is skipped, naming it. A block that imports a package this
environment lacks is skipped (tests/_user_code.py); a later block of its page
that then fails is skipped too, naming the one it may have needed.

The pages whose blocks read or write a bucket (``s3://`` or ``AWS_`` in any
block) get their own local S3 server (moto), with the environment a user
sets for one (docs/remote.md) and the bucket ``my-bucket``: anything else a
page needs (a public-read bucket) its blocks make themselves.

A block right after the line ``<!-- loaderx 1.7.7 -->`` is code for the
original loaderx 1.7.7 (docs/migrating.md: what a user did there): it runs in
1.7.7's own interpreter (tests/_lx177.py; skipped without it), in the page's
directory, just before the next block, so that block reads what the real
1.7.7 wrote."""
from __future__ import annotations

import dataclasses
import os
import re
from typing import List, Optional

import pytest

from _user_code import run_python
from _helpers import ROOT, c_abi_exports

DOCS = [os.path.join(ROOT, "README.md")] + sorted(
    os.path.join(ROOT, "docs", name) for name in os.listdir(os.path.join(ROOT, "docs"))
    if name.endswith(".md"))
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
MARKER_177 = "<!-- loaderx 1.7.7 -->"


@dataclasses.dataclass
class Block:
    page: str  # the page's path relative to the repository
    line: int  # of the block's first line of code
    code: str
    setup: Optional[str]  # loaderx 1.7.7 code to run just before it

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def page_blocks(path: str) -> List[Block]:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    page, setup, out = os.path.relpath(path, ROOT), None, []
    for match in BLOCK.finditer(text):
        line = text.count("\n", 0, match.start()) + 2
        if text[:match.start()].rstrip().endswith(MARKER_177):
            assert setup is None, f"{page}:{line}: two loaderx 1.7.7 blocks in a row"
            setup = match.group(1)  # runs in 1.7.7, before the next block
            continue
        out.append(Block(page, line, match.group(1), setup))
        setup = None
    assert setup is None, f"{page}: a loaderx 1.7.7 block with no block after it"
    return out


PAGES = {os.path.relpath(path, ROOT): page_blocks(path) for path in DOCS}


def uses_s3(code: str) -> bool:
    return "s3://" in code or "AWS_" in code


class Page:
    """One page's run: its directory, its server, and how far it got."""

    def __init__(self, blocks: List[Block], directory, s3=None):
        self.blocks = blocks
        self.directory = directory
        self.s3 = s3  # () -> the session's MotoS3 (the conftest's `s3` fixture)
        self.done = 0  # blocks run so far, in page order
        self.failed: Optional[Block] = None
        self.skipped: List[str] = []  # "page:line (why)" of blocks skipped
        self.server = None
        self.env: Optional[dict] = None

    def start_server(self) -> None:
        pytest.importorskip("moto")
        pytest.importorskip("obstore")
        # The suite's one S3 server, with the pages' bucket made anew for this page.
        self.server = self.s3().fresh_bucket("my-bucket")
        self.env = self.server.env
        self.restore = heads_as_on_aws()

    def run(self, block: Block) -> None:
        """Runs `block` (the next one of the page) and records how it went."""
        assert self.blocks[self.done] is block
        self.done += 1
        if uses_s3(block.code) and self.server is None:
            self.start_server()
        try:
            if block.setup is not None:
                from _lx177 import run177

                run177(block.setup, self.directory)
            run_python(block.page, block.code, ["-c", block.code], self.directory, self.env)
        except pytest.skip.Exception as skip:
            self.skipped.append(f"{block.id} ({skip})")
            raise
        except BaseException:
            self.failed = block
            if self.skipped:
                pytest.skip(f"{block.id} failed after {self.skipped[0]} was skipped")
            raise

    def run_through(self, block: Block) -> None:
        """Runs the blocks before `block` that have not run, then `block`."""
        while self.failed is None and self.done < self.blocks.index(block):
            before = self.blocks[self.done]
            try:
                self.run(before)
            except pytest.skip.Exception:
                pass  # recorded; the later blocks may not need it
            except Exception as exc:  # its own test reports it; this one says why it stops
                pytest.fail(f"{before.id}, above this block on its page, fails:\n{exc}")
        if self.failed is not None:
            pytest.skip(f"{self.failed.id}, above this block on its page, failed")
        self.run(block)

    def stop(self) -> None:
        if self.server is not None:
            self.restore()


def heads_as_on_aws():
    """moto (5.2) checks an anonymous HEAD of an object against a bucket
    policy as the action ``s3:HeadObject``, which AWS does not have (a
    policy naming it is refused): AWS authorizes HeadObject by
    ``s3:GetObject``, the action of the public-read policy docs/remote.md
    shows. The server runs in this process; this makes it check HEAD as AWS
    does, until the returned function undoes it."""
    from moto.s3.models import FakeBucket

    original = FakeBucket.get_permission

    def get_permission(bucket, action, resource):
        return original(bucket, "s3:GetObject" if action == "s3:HeadObject" else action,
                        resource)

    FakeBucket.get_permission = get_permission
    return lambda: setattr(FakeBucket, "get_permission", original)


@pytest.fixture(scope="module")
def pages(tmp_path_factory, request):
    """Each page's run, made when its first block runs (the S3 server is
    started when a page's first object-storage block runs)."""
    runs: dict = {}

    def get(page: str) -> Page:
        if page not in runs:
            name = re.sub(r"[^A-Za-z0-9]+", "-", page)
            runs[page] = Page(PAGES[page], tmp_path_factory.mktemp(name),
                              lambda: request.getfixturevalue("s3"))
        return runs[page]

    yield get
    for run in runs.values():
        run.stop()


@pytest.mark.slow
@pytest.mark.parametrize("block", [pytest.param(b, marks=pytest.mark.xdist_group(b.page))
                                   for blocks in PAGES.values() for b in blocks],
                         ids=lambda b: b.id)
def test_python_block_runs(block, pages):
    pages(block.page).run_through(block)


def test_every_doc_has_its_blocks_found():
    assert sum(len(blocks) for blocks in PAGES.values()) >= 5
    assert len(PAGES["README.md"]) >= 5


def test_a_page_runs_its_blocks_in_one_directory(tmp_path):
    """A block sees what the blocks above it on its page left, and a block
    that collides with them fails: what a user pasting the page gets."""
    blocks = [Block("page.md", 1, "open('made', 'w').write('x')\n", None),
              Block("page.md", 5, "assert open('made').read() == 'x'\n", None),
              Block("page.md", 9, "import os\nos.mkdir('made')\n", None)]
    page = Page(blocks, tmp_path)
    page.run_through(blocks[1])  # runs the first block too
    assert page.done == 2
    with pytest.raises(AssertionError, match="FileExistsError"):
        page.run_through(blocks[2])
    assert page.failed is blocks[2]


def test_design_names_every_export_of_the_c_abi():
    """docs/design.md lists the library's exported functions: all of them,
    and the count it states."""
    exports = set(c_abi_exports())
    with open(os.path.join(ROOT, "docs", "design.md"), encoding="utf-8") as f:
        design = f.read()
    named = set(re.findall(r"`(lx_\w+)`", design))
    assert exports - named == set(), "exports design.md does not name"
    assert named - exports == set(), "names design.md gives that are not exports"
    assert f"Its {len(exports)} functions" in design


def test_the_readme_gives_the_command_ci_runs():
    """README.md's one test command is the one .ci/run runs, word for word, and
    it runs the fast tier before the slow one."""
    with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as f:
        (command,) = [line for line in f.read().splitlines() if line.startswith("pip install")]
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        assert f"\n    {command}\n" in f.read()
    assert 0 < command.index('-m "not slow"') < command.index("-m slow")
