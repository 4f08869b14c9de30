"""Fetch the pinned upstream zstd sources into vendor/zstd/ (git-ignored).

zstd is a build dependency, never committed. The pin lives in vendor/zstd.lock.json:
the PyPI sdist of `zstandard` (which ships zstd's single-file amalgamation) is
downloaded through pip and the configured package index, its sha256 is checked,
and the few files the build needs are unpacked and checked one by one.

Usage: python scripts/fetch_zstd.py [--archive PATH]   (PATH: a pre-downloaded sdist)
"""
from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "vendor" / "zstd.lock.json"
DEST = ROOT / "vendor" / "zstd"


class FetchError(RuntimeError):
    pass


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _lock() -> dict:
    return json.loads(LOCK.read_text())


def is_current(lock: dict | None = None) -> bool:
    """True when vendor/zstd already holds exactly the pinned files."""
    lock = lock or _lock()
    for name, digest in lock["files"].items():
        p = DEST / name
        if not p.is_file() or _sha256(p) != digest:
            return False
    return True


def _download(lock: dict, workdir: Path) -> Path:
    spec = f"{lock['package']}=={lock['version']}"
    cmd = [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
           "--disable-pip-version-check", "-q", spec, "-d", str(workdir)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    archive = workdir / lock["archive"]
    if not archive.is_file():
        raise FetchError(
            f"could not download {spec} (the pinned zstd source) with pip.\n{proc.stderr.strip()}\n"
            "Check that pip can reach your package index, or download the sdist by hand and run\n"
            f"  python scripts/fetch_zstd.py --archive /path/to/{lock['archive']}")
    return archive


def fetch(archive: Path | None = None) -> Path:
    lock = _lock()
    if archive is None and is_current(lock):
        return DEST
    with tempfile.TemporaryDirectory() as tmp:
        tmpdir = Path(tmp)
        if archive is None:
            archive = _download(lock, tmpdir)
        got = _sha256(archive)
        if got != lock["archive_sha256"]:
            raise FetchError(
                f"sha256 mismatch for {archive}: got {got}, expected {lock['archive_sha256']} "
                f"(vendor/zstd.lock.json). Refusing to build with unverified zstd sources; "
                "delete the file and fetch again, or update the pin deliberately.")
        prefix = f"{lock['package']}-{lock['version']}/zstd/"
        DEST.mkdir(parents=True, exist_ok=True)
        with tarfile.open(archive, "r:gz") as tar:
            for name in lock["files"]:
                member = tar.getmember(prefix + name)
                data = tar.extractfile(member).read()
                if hashlib.sha256(data).hexdigest() != lock["files"][name]:
                    raise FetchError(f"sha256 mismatch for {name} inside {archive}")
                (DEST / name).write_bytes(data)
    return DEST


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--archive", type=Path, help="use this pre-downloaded sdist")
    args = ap.parse_args()
    try:
        dest = fetch(args.archive)
    except FetchError as e:
        print(f"fetch_zstd: {e}", file=sys.stderr)
        return 1
    print(f"zstd sources ready in {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
