"""Fetch the pinned third-party C sources the build compiles into vendor/ (git-ignored).

Third-party code is a build dependency, never committed. Each pin is a lock file in
vendor/ (`*.lock.json`): where the archive comes from, its sha256, and which files
to unpack into `vendor/<dest>/`:

- zstd (vendor/zstd.lock.json): the PyPI sdist of `zstandard`, which ships zstd's
  single-file amalgamation, downloaded with pip through the configured index; each
  unpacked file is checked against its own sha256 too.
- libjpeg-turbo (vendor/libjpeg-turbo.lock.json): Debian's upstream tarball of the
  source package, from the Debian mirror this machine's apt is configured with
  (/etc/apt/sources.list*), or from the mirrors in LOADERX_DEBIAN_MIRROR
  (space-separated base URLs). No registry host is written in this repository.

A fetch that cannot reach its registry says so, with the way around it: download
the archive by hand and pass it with --archive NAME=PATH.

Usage: python scripts/fetch_vendor.py [--archive NAME=PATH ...]
"""
from __future__ import annotations

import argparse
import fnmatch
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parent.parent
VENDOR = ROOT / "vendor"
#: The stamp a pin without per-file hashes leaves next to what it unpacked.
STAMP = ".loaderx-fetched.json"
DOWNLOAD_TIMEOUT_S = 60


class FetchError(RuntimeError):
    pass


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def locks() -> Dict[str, dict]:
    """Every pin, by name."""
    found = {}
    for path in sorted(VENDOR.glob("*.lock.json")):
        lock = json.loads(path.read_text())
        found[lock["name"]] = lock
    return found


def is_current(lock: dict) -> bool:
    """True when vendor/<dest> holds exactly the pinned files."""
    dest = VENDOR / lock["dest"]
    files = lock.get("files")
    if files is None:
        stamp = dest / STAMP
        if not stamp.is_file():
            return False
        recorded = json.loads(stamp.read_text())
        if recorded.get("archive_sha256") != lock["archive_sha256"]:
            return False
        files = recorded["files"]
    for name, digest in files.items():
        p = dest / name
        if not p.is_file() or _sha256(p) != digest:
            return False
    return True


def _pypi(lock: dict, workdir: Path) -> Path:
    spec = f"{lock['package']}=={lock['version']}"
    cmd = [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
           "--disable-pip-version-check", "-q", spec, "-d", str(workdir)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    archive = workdir / lock["archive"]
    if not archive.is_file():
        raise FetchError(
            f"could not download {spec} (the pinned {lock['name']} source) with pip.\n"
            f"{proc.stderr.strip()}\nCheck that pip can reach your package index, or "
            f"download the sdist by hand and run\n  python scripts/fetch_vendor.py "
            f"--archive {lock['name']}=/path/to/{lock['archive']}")
    return archive


def debian_mirrors() -> List[str]:
    """Base URLs of Debian archives: LOADERX_DEBIAN_MIRROR first, then apt's own
    configuration (one-line `deb URI suite` entries and deb822 `URIs:` fields)."""
    mirrors = os.environ.get("LOADERX_DEBIAN_MIRROR", "").split()
    for path in ["/etc/apt/sources.list"] + sorted(glob.glob("/etc/apt/sources.list.d/*")):
        try:
            text = Path(path).read_text(errors="replace")
        except OSError:
            continue
        if not path.endswith((".list", ".sources")):
            continue
        mirrors += re.findall(r"^\s*deb(?:-src)?\s+(?:\[[^\]]*\]\s+)?(\S+)", text, re.M)
        mirrors += [u for line in re.findall(r"^\s*URIs:\s*(.+)$", text, re.M)
                    for u in line.split()]
    # The main archive, not the security one (its pool holds only security uploads).
    keep = [m.rstrip("/") for m in mirrors if m.startswith(("http://", "https://", "file:"))]
    return list(dict.fromkeys(m for m in keep if "security" not in m))


def _debian(lock: dict, workdir: Path) -> Path:
    package = lock["debian_package"]
    section = package[:4] if package.startswith("lib") else package[0]
    mirrors = debian_mirrors()
    archive = workdir / lock["archive"]
    tried = []
    for base in mirrors:
        url = f"{base}/pool/main/{section}/{package}/{lock['archive']}"
        try:
            with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as r, \
                    open(archive, "wb") as out:
                shutil.copyfileobj(r, out)
            return archive
        except OSError as e:
            tried.append(f"  {url}: {e}")
    where = "\n".join(tried) or "  (no Debian mirror is configured: no apt sources found)"
    raise FetchError(
        f"could not download {lock['archive']} (the pinned {lock['name']} source) from "
        f"a Debian mirror:\n{where}\nSet LOADERX_DEBIAN_MIRROR to a Debian mirror's base "
        f"URL, or download the file by hand and run\n  python scripts/fetch_vendor.py "
        f"--archive {lock['name']}=/path/to/{lock['archive']}")


def _members(tar: tarfile.TarFile, lock: dict) -> Dict[str, tarfile.TarInfo]:
    """The archive members to unpack, by their name inside vendor/<dest>."""
    prefix = lock["prefix"]
    if "files" in lock:
        return {name: tar.getmember(prefix + name) for name in lock["files"]}
    picked = {}
    for m in tar.getmembers():
        name = m.name[len(prefix):] if m.name.startswith(prefix) else None
        if not name or "/" in name or not m.isfile():
            continue
        if any(fnmatch.fnmatch(name, pattern) for pattern in lock["include"]):
            picked[name] = m
    if not picked:
        raise FetchError(f"{lock['archive']} holds none of {lock['include']} under {prefix}")
    return picked


def _unpack(lock: dict, archive: Path) -> None:
    dest = VENDOR / lock["dest"]
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    written = {}
    with tarfile.open(archive, "r:gz") as tar:
        for name, member in _members(tar, lock).items():
            data = tar.extractfile(member).read()
            digest = hashlib.sha256(data).hexdigest()
            if "files" in lock and digest != lock["files"][name]:
                raise FetchError(f"sha256 mismatch for {name} inside {archive}")
            (dest / name).write_bytes(data)
            written[name] = digest
    if "files" not in lock:
        stamp = {"archive_sha256": lock["archive_sha256"], "files": written}
        (dest / STAMP).write_text(json.dumps(stamp, indent=1, sort_keys=True))


def fetch_one(lock: dict, archive: Optional[Path] = None) -> Path:
    """Makes vendor/<dest> hold the pinned files of `lock` (downloading and
    checking the archive unless it already does)."""
    if archive is None and is_current(lock):
        return VENDOR / lock["dest"]
    with tempfile.TemporaryDirectory() as tmp:
        if archive is None:
            download = _pypi if lock["source"] == "pypi" else _debian
            archive = download(lock, Path(tmp))
        got = _sha256(archive)
        if got != lock["archive_sha256"]:
            raise FetchError(
                f"sha256 mismatch for {archive}: got {got}, expected "
                f"{lock['archive_sha256']} (vendor/{lock['name']}.lock.json). Refusing to "
                "build with unverified sources; delete the file and fetch again, or "
                "update the pin deliberately.")
        _unpack(lock, archive)
    return VENDOR / lock["dest"]


def fetch(archives: Optional[Dict[str, Path]] = None) -> List[Path]:
    """Every pin into vendor/ (the build's one fetch step)."""
    archives = archives or {}
    pins = locks()
    unknown = set(archives) - set(pins)
    if unknown:
        raise FetchError(f"--archive names {sorted(unknown)}; the pins are {sorted(pins)}")
    return [fetch_one(lock, archives.get(name)) for name, lock in pins.items()]


def _archive_arg(text: str):
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=PATH, got {text!r}")
    return name, Path(path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--archive", type=_archive_arg, action="append", default=[],
                    metavar="NAME=PATH", help="use this pre-downloaded archive for pin NAME")
    args = ap.parse_args()
    try:
        dests = fetch(dict(args.archive))
    except FetchError as e:
        print(f"fetch_vendor: {e}", file=sys.stderr)
        return 1
    for dest in dests:
        print(f"sources ready in {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
