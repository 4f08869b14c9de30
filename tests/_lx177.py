"""The original loaderx 1.7.7, the real package from the package index, for
tests that compare against it: installed once into a virtualenv cached
between runs (``~/.cache/loaderx-tests/venv-1.7.7``; ``LOADERX_TEST_CACHE``
names another directory), with nothing but its requirements (numpy, cffi,
msgpack). The same import name as this package, so it only ever runs in its
own interpreter, isolated (``python -I``: no ``PYTHONPATH``, no current
directory on ``sys.path``).

Creating it takes about 12 s (``pip --python``, pip's wheel cache warm); a
second process waits for the first (a lock file). Without a reachable package
index the tests that need it are skipped, with pip's words as the reason.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys

import pytest

VERSION = "1.7.7"
REQUIREMENTS = [f"loaderx=={VERSION}", "numpy", "cffi", "msgpack"]
INSTALL_TIMEOUT_S = 300
WRITER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_lx177_writer.py")
_found: dict = {}


def cache_dir() -> str:
    base = os.environ.get("LOADERX_TEST_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "loaderx-tests")
    return base


def _python_of(venv: str) -> str:
    return os.path.join(venv, "bin", "python")


def _works(venv: str) -> bool:
    """The cached virtualenv exists, was finished, and still runs (its base
    interpreter may have moved)."""
    if not os.path.isfile(os.path.join(venv, "loaderx-tests-complete")):
        return False
    probe = subprocess.run([_python_of(venv), "-I", "-c",
                            f"import loaderx; assert loaderx.__version__ == {VERSION!r}"],
                           capture_output=True, timeout=60)
    return probe.returncode == 0


def _build(venv: str) -> str | None:
    """Builds the virtualenv at `venv` (next to it, then renamed); returns
    why it could not, or None."""
    tmp = f"{venv}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", tmp], check=True,
                       capture_output=True, timeout=120)
        pip = subprocess.run([sys.executable, "-m", "pip", "--python", _python_of(tmp),
                              "install", "--quiet", "--disable-pip-version-check",
                              *REQUIREMENTS], capture_output=True, text=True,
                             timeout=INSTALL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        shutil.rmtree(tmp, ignore_errors=True)
        return f"pip install {' '.join(REQUIREMENTS)} took over {INSTALL_TIMEOUT_S} s"
    except subprocess.CalledProcessError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        return f"python -m venv failed: {e.stderr.decode(errors='replace')[-300:]}"
    if pip.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tail = " ".join(pip.stderr.strip().splitlines()[-2:])
        return f"pip could not install {' '.join(REQUIREMENTS)} (no package index?): {tail}"
    open(os.path.join(tmp, "loaderx-tests-complete"), "w").close()
    shutil.rmtree(venv, ignore_errors=True)
    os.rename(tmp, venv)
    return None


def python177() -> str:
    """The interpreter of the cached 1.7.7 virtualenv (built on first use);
    skips the calling test, with the reason, when it cannot be had."""
    if "python" not in _found:
        _found["python"], _found["why"] = _locate()
    if _found["python"] is None:
        pytest.skip(f"the original loaderx {VERSION} is not available: {_found['why']}")
    return _found["python"]


def _locate() -> tuple[str | None, str]:
    root = cache_dir()
    venv = os.path.join(root, f"venv-{VERSION}")
    try:
        os.makedirs(root, exist_ok=True)
        if _works(venv):
            return _python_of(venv), ""
        with open(os.path.join(root, f"venv-{VERSION}.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building it
            if _works(venv):
                return _python_of(venv), ""
            why = _build(venv)
    except OSError as e:
        return None, f"cannot create {venv}: {e}"
    return (None, why) if why else (_python_of(venv), "")


def run177(code: str, cwd, timeout: float = 120) -> subprocess.CompletedProcess:
    """Runs `code` in 1.7.7's interpreter in `cwd`; fails the test (with its
    output) when it fails."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    out = subprocess.run([python177(), "-I", "-c", code], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"loaderx {VERSION} failed:\n{out.stdout}\n{out.stderr}"
    return out


def write_stores(dest) -> str:
    """Every kind of store 1.7.7 writes, and ``expected.npz``, under `dest`
    (see tests/_lx177_writer.py); returns `dest`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    out = subprocess.run([python177(), "-I", WRITER, str(dest)], env=env,
                         cwd=os.path.dirname(os.path.abspath(dest)),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"loaderx {VERSION} failed:\n{out.stdout}\n{out.stderr}"
    return str(dest)


def readme(version: str) -> str:
    """The README (the package's long description) of the original loaderx
    `version`, from its distribution's metadata: 1.7.7's from the cached
    virtualenv, the others downloaded once (``pip download``) and cached."""
    if version == VERSION:
        out = run177("import importlib.metadata as m\nprint(m.metadata('loaderx').get_payload())",
                     cwd=cache_dir())
        return out.stdout
    cached = os.path.join(cache_dir(), f"readme-{version}.md")
    if not os.path.isfile(cached):
        text = _download_readme(version)
        # On a fresh machine this may be the worker's first use of the cache.
        os.makedirs(cache_dir(), exist_ok=True)
        # Each process its own temporary name: two xdist workers may fetch
        # the same README at once (a shared name failed one of them on CI).
        tmp = f"{cached}.tmp-{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, cached)
    with open(cached, encoding="utf-8") as f:
        return f.read()


def _download_readme(version: str) -> str:
    import email
    import tarfile
    import tempfile
    import zipfile

    with tempfile.TemporaryDirectory() as tmp:
        pip = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                              "--disable-pip-version-check", f"loaderx=={version}", "-d", tmp],
                             capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
        files = os.listdir(tmp)
        if pip.returncode != 0 or not files:
            tail = " ".join(pip.stderr.strip().splitlines()[-2:])
            pytest.skip(f"cannot download loaderx=={version} (no package index?): {tail}")
        path = os.path.join(tmp, files[0])
        if path.endswith(".whl"):
            with zipfile.ZipFile(path) as z:
                name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
                raw = z.read(name)
        else:
            with tarfile.open(path) as t:
                member = next(m for m in t.getmembers() if m.name.count("/") == 1
                              and m.name.endswith("/PKG-INFO"))
                raw = t.extractfile(member).read()
    return email.message_from_bytes(raw).get_payload()
