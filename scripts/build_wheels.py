"""Pack the release: one `py3-none-<platform>` wheel per target plus the sdist.

    python -m ziglang build dist && python scripts/build_wheels.py
    python scripts/build_wheels.py [--dist zig-out/dist] [--out dist] [--skip-sdist] [--partial]

`zig build dist` leaves one folder per release target in zig-out/dist/, named by
its wheel platform tag (the table `release_targets` in build.zig). This script
never runs Zig: it zips each folder's library together with the Python package,
the metadata from pyproject.toml and the license files (loaderx's and zstd's,
because every library embeds compiled zstd) into a wheel, writes the sdist with
the project's PEP 517 backend, and then checks what it wrote:

- each wheel holds exactly one native library, named as loaderx/_lib.py expects,
  for its own OS and architecture (read from the binary's headers);
- the library exports exactly the `lx_*` functions of src/capi.zig;
- manylinux libraries need no glibc symbol version newer than the tag's, musllinux
  ones link musl's libc.so, macOS ones ask for no newer macOS than the tag's;
- RECORD hashes, WHEEL tags and METADATA are right;
- the sdist holds sources only: no zstd sources, no library, no build output.

The binary readers below are small and dependency-free (ELF, Mach-O and PE
headers only), so a release can be packed and checked on any OS.
"""
from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import os
import re
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "loaderx"

# The library file name per OS, exactly as loaderx/_lib.py looks for it.
LIB_NAMES = {"linux": "libloaderx.so", "macosx": "libloaderx.dylib", "win": "loaderx.dll"}
NATIVE_SUFFIXES = (".so", ".dylib", ".dll", ".pyd", ".a", ".lib", ".pdb")

# Every wheel carries loaderx's license and zstd's (BSD or GPLv2, at the user's choice).
# Source path (relative to the repository) -> name under <dist-info>/licenses/.
LICENSE_FILES = {
    "LICENSE": "LICENSE",
    "vendor/zstd/LICENSE": "zstd/LICENSE",
    "vendor/zstd/COPYING": "zstd/COPYING",
}

# Paths in the sdist that must be there, and prefixes that must not.
SDIST_REQUIRED = (
    "PKG-INFO", "pyproject.toml", "setup.py", "build.zig", "LICENSE", "README.md",
    "vendor/zstd.lock.json", "scripts/fetch_zstd.py", "src/capi.zig",
    "loaderx/__init__.py", "loaderx/_lib.py",
)
SDIST_FORBIDDEN_DIRS = ("vendor/zstd/", "loaderx/lib/", "zig-out/", ".zig-cache/", "dist/", "build/")


class PackError(RuntimeError):
    """The release cannot be packed or a packed file failed a check."""


# ---------------------------------------------------------------------------
# The release table (build.zig) and wheel platform tags

def release_targets(build_zig: Path = ROOT / "build.zig") -> list[tuple[str, str]]:
    """The (zig triple, wheel platform tag) pairs of build.zig's `release_targets`."""
    text = build_zig.read_text()
    m = re.search(r"release_targets\s*=\s*\[_\]struct\s*\{[^}]*\}\s*\{(.*?)\n\};", text, re.S)
    if not m:
        raise PackError(f"{build_zig}: no `release_targets` table found")
    pairs = re.findall(r'\.triple\s*=\s*"([^"]+)"\s*,\s*\.tag\s*=\s*"([^"]+)"', m.group(1))
    if not pairs:
        raise PackError(f"{build_zig}: `release_targets` has no entries")
    tags = [t for _, t in pairs]
    if len(set(tags)) != len(tags):
        raise PackError(f"{build_zig}: duplicate wheel tags in `release_targets`: {tags}")
    return pairs


@dataclass(frozen=True)
class Platform:
    """What a wheel platform tag promises: OS, CPU, libc and the oldest OS/libc."""

    tag: str
    os: str                      # "linux", "macosx" or "win"
    arch: str                    # "x86_64" or "aarch64"
    libc: str | None = None      # "glibc" or "musl" on Linux
    min_version: tuple[int, int] | None = None  # glibc, musl or macOS version

    @property
    def lib_name(self) -> str:
        return LIB_NAMES[self.os]

    def describe(self) -> str:
        v = ".".join(map(str, self.min_version)) if self.min_version else ""
        arch = {"x86_64": "x86-64", "aarch64": "arm64"}[self.arch]
        if self.libc == "glibc":
            return f"Linux {arch}, glibc >= {v}"
        if self.libc == "musl":
            return f"Linux {arch}, musl >= {v}"
        if self.os == "macosx":
            return f"macOS >= {v}, {arch}"
        return f"Windows {arch}"


_ARCH = {"x86_64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64", "amd64": "x86_64"}


def parse_tag(tag: str) -> Platform:
    """A wheel platform tag (manylinux_2_17_x86_64, macosx_11_0_arm64, win_amd64...)."""
    m = re.fullmatch(r"(manylinux|musllinux|macosx)_(\d+)_(\d+)_(x86_64|aarch64|arm64)", tag)
    if m:
        kind, major, minor, arch = m.groups()
        if kind == "macosx":
            return Platform(tag, "macosx", _ARCH[arch], None, (int(major), int(minor)))
        libc = "glibc" if kind == "manylinux" else "musl"
        return Platform(tag, "linux", _ARCH[arch], libc, (int(major), int(minor)))
    m = re.fullmatch(r"win_(amd64|arm64)", tag)
    if m:
        return Platform(tag, "win", _ARCH[m.group(1)])
    raise PackError(f"unsupported wheel platform tag {tag!r}")


# ---------------------------------------------------------------------------
# Project metadata (pyproject.toml)

def _load_toml(path: Path) -> dict:
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        try:
            import tomli as tomllib
        except ImportError:
            raise PackError("reading pyproject.toml needs Python >= 3.11 or `pip install tomli`") from None
    with open(path, "rb") as f:
        return tomllib.load(f)


def _norm_extra(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _with_extra(req: str, extra: str) -> str:
    name, sep, marker = req.partition(";")
    if sep:
        return f'{name.strip()}; ({marker.strip()}) and extra == "{extra}"'
    return f'{req.strip()}; extra == "{extra}"'


@dataclass
class Project:
    name: str
    version: str
    summary: str
    license: str
    requires_python: str | None
    dependencies: list[str]
    extras: dict[str, list[str]]
    entry_points: dict[str, dict[str, str]]
    readme: str | None = None
    readme_type: str | None = None
    extra_headers: list[tuple[str, str]] = field(default_factory=list)

    @property
    def dist_name(self) -> str:
        """The distribution name as it appears in file names (PEP 427 / 503)."""
        return re.sub(r"[-_.]+", "_", self.name).lower()


def load_project(root: Path = ROOT) -> Project:
    """[project] of pyproject.toml, checked against loaderx/__init__.py's version."""
    data = _load_toml(root / "pyproject.toml")["project"]
    for key in data.get("dynamic", []):
        if key in ("version", "dependencies", "optional-dependencies", "scripts", "readme"):
            raise PackError(f"pyproject.toml: dynamic `{key}` is not supported by build_wheels.py")
    lic = data.get("license", "")
    if isinstance(lic, dict):
        lic = lic.get("text") or (root / lic["file"]).read_text().splitlines()[0]
    readme, readme_type = None, None
    rd = data.get("readme")
    if isinstance(rd, str):
        readme = (root / rd).read_text(encoding="utf-8")
        readme_type = "text/markdown" if rd.lower().endswith(".md") else "text/x-rst" if rd.lower().endswith(".rst") else "text/plain"
    elif isinstance(rd, dict):
        readme = rd.get("text") or (root / rd["file"]).read_text(encoding="utf-8")
        readme_type = rd.get("content-type", "text/plain")
    entry_points: dict[str, dict[str, str]] = {}
    if data.get("scripts"):
        entry_points["console_scripts"] = dict(data["scripts"])
    if data.get("gui-scripts"):
        entry_points["gui_scripts"] = dict(data["gui-scripts"])
    for group, eps in data.get("entry-points", {}).items():
        entry_points[group] = dict(eps)
    headers: list[tuple[str, str]] = []
    for person_key, field_name in (("authors", "Author"), ("maintainers", "Maintainer")):
        people = data.get(person_key, [])
        names = [p["name"] for p in people if "name" in p and "email" not in p]
        emails = [f'{p["name"]} <{p["email"]}>' if "name" in p else p["email"] for p in people if "email" in p]
        if names:
            headers.append((field_name, ", ".join(names)))
        if emails:
            headers.append((field_name + "-email", ", ".join(emails)))
    if data.get("keywords"):
        headers.append(("Keywords", ",".join(data["keywords"])))
    headers += [("Classifier", c) for c in data.get("classifiers", [])]
    headers += [("Project-URL", f"{k}, {v}") for k, v in data.get("urls", {}).items()]
    project = Project(
        name=data["name"], version=data["version"], summary=data.get("description", ""),
        license=lic, requires_python=data.get("requires-python"),
        dependencies=list(data.get("dependencies", [])),
        extras={k: list(v) for k, v in data.get("optional-dependencies", {}).items()},
        entry_points=entry_points, readme=readme, readme_type=readme_type, extra_headers=headers)
    init = (root / PACKAGE / "__init__.py").read_text()
    m = re.search(r'^__version__\s*=\s*["\']([^"\']+)["\']', init, re.M)
    if m and m.group(1) != project.version:
        raise PackError(f"version mismatch: pyproject.toml says {project.version}, "
                        f"{PACKAGE}/__init__.py says {m.group(1)}")
    capi = root / "src" / "capi.zig"
    if capi.is_file():
        parts = [re.search(rf"\bversion_{p}\s*=\s*(\d+)\s*;", capi.read_text()) for p in ("major", "minor", "patch")]
        native = ".".join(p.group(1) for p in parts) if all(parts) else None
        if native and re.fullmatch(r"\d+\.\d+\.\d+", project.version) and native != project.version:
            raise PackError(f"version mismatch: pyproject.toml says {project.version}, "
                            f"src/capi.zig (lx_version) says {native}")
    return project


def metadata_text(project: Project) -> str:
    """The METADATA file (core metadata 2.1, RFC 822 style headers + README body)."""
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {project.name}",
        f"Version: {project.version}",
    ]
    if project.summary:
        lines.append(f"Summary: {project.summary}")
    lines += [f"{k}: {v}" for k, v in project.extra_headers]
    if project.license:
        lines.append(f"License: {project.license}")
    if project.requires_python:
        lines.append(f"Requires-Python: {project.requires_python}")
    lines += [f"Requires-Dist: {r}" for r in project.dependencies]
    for extra, reqs in project.extras.items():
        name = _norm_extra(extra)
        lines.append(f"Provides-Extra: {name}")
        lines += [f"Requires-Dist: {_with_extra(r, name)}" for r in reqs]
    lines += [f"License-File: {name}" for name in LICENSE_FILES.values()]
    if project.readme_type:
        lines.append(f"Description-Content-Type: {project.readme_type}")
    text = "\n".join(lines) + "\n"
    if project.readme:
        text += "\n" + project.readme
    return text


def entry_points_text(project: Project) -> str:
    out = []
    for group, eps in project.entry_points.items():
        out.append(f"[{group}]")
        out += [f"{name} = {target}" for name, target in eps.items()]
        out.append("")
    return "\n".join(out)


# ---------------------------------------------------------------------------
# Writing a wheel

def package_files(root: Path = ROOT) -> list[tuple[str, Path]]:
    """The Python package's files as (archive name, path): no library, caches or tests."""
    pkg = root / PACKAGE
    out = []
    for path in sorted(pkg.rglob("*")):
        rel = path.relative_to(root)
        parts = rel.parts
        if not path.is_file():
            continue
        if parts[1] == "lib" or "__pycache__" in parts or any(p in ("tests", "test") for p in parts[1:-1]):
            continue
        if path.suffix in (".pyc", ".pyo") or path.name.startswith("test_") or path.suffix in NATIVE_SUFFIXES:
            continue
        if path.name.startswith("."):
            continue
        out.append((rel.as_posix(), path))
    if not any(name == f"{PACKAGE}/__init__.py" for name, _ in out):
        raise PackError(f"{pkg}: no __init__.py")
    return out


def _record_hash(data: bytes) -> str:
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def _zip_time() -> tuple[int, int, int, int, int, int]:
    """A fixed timestamp (SOURCE_DATE_EPOCH if set) so that wheels are reproducible."""
    import time
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "315532800"))  # 1980-01-01, the zip minimum
    return time.gmtime(max(epoch, 315532800))[:6]


def wheel_filename(project: Project, tag: str) -> str:
    return f"{project.dist_name}-{project.version}-py3-none-{tag}.whl"


def find_library(lib_dir: Path, platform: Platform) -> Path:
    """The one library in a dist folder; anything else there is an error."""
    files = sorted(p for p in lib_dir.iterdir() if p.is_file())
    names = [p.name for p in files]
    if names != [platform.lib_name]:
        raise PackError(f"{lib_dir}: expected exactly {platform.lib_name}, found {names or 'nothing'}")
    return files[0]


def build_wheel(lib_dir: Path, tag: str, out_dir: Path, root: Path = ROOT,
                project: Project | None = None) -> Path:
    """Zip one wheel for `tag` from the library in `lib_dir` and the package in `root`."""
    platform = parse_tag(tag)
    project = project or load_project(root)
    library = find_library(lib_dir, platform)
    dist_info = f"{project.dist_name}-{project.version}.dist-info"
    entries: list[tuple[str, bytes, int]] = []  # (archive name, bytes, unix mode)
    for name, path in package_files(root):
        entries.append((name, path.read_bytes(), 0o644))
    entries.append((f"{PACKAGE}/lib/{platform.lib_name}", library.read_bytes(), 0o755))
    for src, dest in LICENSE_FILES.items():
        path = root / src
        if not path.is_file():
            hint = " (run python scripts/fetch_zstd.py)" if src.startswith("vendor/") else ""
            raise PackError(f"license file {path} is missing{hint}")
        entries.append((f"{dist_info}/licenses/{dest}", path.read_bytes(), 0o644))
    entries.append((f"{dist_info}/METADATA", metadata_text(project).encode("utf-8"), 0o644))
    wheel_meta = ("Wheel-Version: 1.0\n"
                  "Generator: loaderx scripts/build_wheels.py\n"
                  "Root-Is-Purelib: false\n"
                  f"Tag: py3-none-{tag}\n")
    entries.append((f"{dist_info}/WHEEL", wheel_meta.encode(), 0o644))
    if project.entry_points:
        entries.append((f"{dist_info}/entry_points.txt", entry_points_text(project).encode(), 0o644))
    entries.append((f"{dist_info}/top_level.txt", f"{PACKAGE}\n".encode(), 0o644))

    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for name, data, _ in entries:
        writer.writerow([name, _record_hash(data), len(data)])
    writer.writerow([f"{dist_info}/RECORD", "", ""])
    entries.append((f"{dist_info}/RECORD", record.getvalue().encode(), 0o644))

    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / wheel_filename(project, tag)
    tmp = target.with_suffix(".whl.part")
    stamp = _zip_time()
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data, mode in entries:
            info = zipfile.ZipInfo(name, stamp)
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data, compresslevel=9)
    os.replace(tmp, target)
    return target


# ---------------------------------------------------------------------------
# Reading native libraries (ELF, Mach-O, PE): just enough to check a release

@dataclass
class Binary:
    format: str                          # "ELF", "Mach-O" or "PE"
    arch: str                            # "x86_64", "aarch64" or "unknown:<n>"
    exports: list[str]                   # exported function/data names (no Mach-O underscore)
    needed: list[str]                    # shared libraries / DLLs it links
    symbol_versions: dict[str, str] = field(default_factory=dict)  # ELF: imported symbol -> version
    min_os: tuple[int, int] | None = None  # Mach-O: minimum macOS version
    signed: bool = False                   # Mach-O: has a code signature (required on arm64)

    def glibc_max(self) -> tuple[int, ...] | None:
        vers = [_glibc_version(v) for v in self.symbol_versions.values()]
        vers = [v for v in vers if v is not None]
        return max(vers) if vers else None


def _glibc_version(tag: str) -> tuple[int, ...] | None:
    m = re.fullmatch(r"GLIBC_(\d+(?:\.\d+)*)", tag)
    return tuple(int(x) for x in m.group(1).split(".")) if m else None


def _cstr(data: bytes, offset: int) -> str:
    end = data.index(b"\0", offset)
    return data[offset:end].decode("utf-8", "replace")


def inspect_library(data: bytes) -> Binary:
    if data[:4] == b"\x7fELF":
        return _inspect_elf(data)
    if data[:4] == b"\xcf\xfa\xed\xfe":
        return _inspect_macho(data)
    if data[:2] == b"MZ":
        return _inspect_pe(data)
    raise PackError(f"not an ELF, 64-bit Mach-O or PE file (magic {data[:4].hex()})")


def _inspect_elf(data: bytes) -> Binary:
    if data[4] != 2 or data[5] != 1:
        raise PackError("only 64-bit little-endian ELF is supported")
    machine = struct.unpack_from("<H", data, 0x12)[0]
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    sections = []
    for i in range(shnum):
        name, typ, _flags, _addr, off, size, link, info, _align, entsize = struct.unpack_from(
            "<IIQQQQIIQQ", data, shoff + i * shentsize)
        sections.append((typ, off, size, link, info, entsize))

    def by_type(typ):
        return [s for s in sections if s[0] == typ]

    SHT_DYNAMIC, SHT_DYNSYM, SHT_VERNEED, SHT_VERSYM = 6, 11, 0x6FFFFFFE, 0x6FFFFFFF
    needed: list[str] = []
    for _, off, size, link, _, _ in by_type(SHT_DYNAMIC):
        stroff = sections[link][1]
        for pos in range(off, off + size, 16):
            tag, val = struct.unpack_from("<qQ", data, pos)
            if tag == 0:
                break
            if tag == 1:  # DT_NEEDED
                needed.append(_cstr(data, stroff + val))

    # Version requirements: vna_other index -> version name (GLIBC_2.17...).
    version_names: dict[int, str] = {}
    for _, off, _size, link, count, _ in by_type(SHT_VERNEED):
        stroff = sections[link][1]
        pos = off
        for _ in range(count):
            _ver, cnt, _file, aux, nxt = struct.unpack_from("<HHIII", data, pos)
            apos = pos + aux
            for _ in range(cnt):
                _hash, _flags, other, name, anext = struct.unpack_from("<IHHII", data, apos)
                version_names[other] = _cstr(data, stroff + name)
                apos += anext
            pos += nxt

    exports: list[str] = []
    symbol_versions: dict[str, str] = {}
    dynsym = by_type(SHT_DYNSYM)
    versym = by_type(SHT_VERSYM)
    for _, off, size, link, _, entsize in dynsym:
        stroff = sections[link][1]
        count = size // (entsize or 24)
        for i in range(1, count):
            st_name, st_info, st_other, st_shndx, _v, _s = struct.unpack_from("<IBBHQQ", data, off + i * 24)
            name = _cstr(data, stroff + st_name)
            bind, typ, vis = st_info >> 4, st_info & 0xF, st_other & 3
            if st_shndx == 0:  # undefined: an import
                if versym:
                    idx = struct.unpack_from("<H", data, versym[0][1] + 2 * i)[0] & 0x7FFF
                    if idx in version_names:
                        symbol_versions[name] = version_names[idx]
                continue
            if bind in (1, 2) and vis in (0, 3) and typ not in (3, 4):  # GLOBAL/WEAK, visible, not SECTION/FILE
                exports.append(name)
    arch = {62: "x86_64", 183: "aarch64"}.get(machine, f"unknown:{machine}")
    return Binary("ELF", arch, sorted(exports), needed, symbol_versions)


def _uleb(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return result, pos


def _macho_trie(data: bytes, start: int, size: int) -> list[str]:
    """Names in a Mach-O export trie (what dyld actually resolves against)."""
    out: list[str] = []
    stack = [(0, "")]
    seen = set()
    while stack:
        node, prefix = stack.pop()
        if node in seen or node >= size:
            raise PackError("malformed Mach-O export trie")
        seen.add(node)
        pos = start + node
        terminal, pos = _uleb(data, pos)
        if terminal:
            out.append(prefix)
        pos += terminal
        children = data[pos]
        pos += 1
        for _ in range(children):
            end = data.index(b"\0", pos)
            edge = data[pos:end].decode()
            child, pos = _uleb(data, end + 1)
            stack.append((child, prefix + edge))
    return out


def _inspect_macho(data: bytes) -> Binary:
    _magic, cputype, _sub, _ftype, ncmds, _size, _flags, _res = struct.unpack_from("<IiiIIIII", data, 0)
    pos = 32
    trie: list[str] | None = None
    symtab: list[str] = []
    needed: list[str] = []
    min_os = None
    signed = False
    for _ in range(ncmds):
        cmd, cmdsize = struct.unpack_from("<II", data, pos)
        base = cmd & 0x7FFFFFFF
        if cmd == 0x2:  # LC_SYMTAB
            symoff, nsyms, stroff, _ = struct.unpack_from("<IIII", data, pos + 8)
            for i in range(nsyms):
                n_strx, n_type, _sect, _desc, _val = struct.unpack_from("<IBBHQ", data, symoff + 16 * i)
                if n_type & 0xE0 == 0 and n_type & 0x01 and n_type & 0x0E == 0x0E:  # external, defined in a section
                    symtab.append(_cstr(data, stroff + n_strx))
        elif cmd == 0x80000033:  # LC_DYLD_EXPORTS_TRIE
            off, size = struct.unpack_from("<II", data, pos + 8)
            trie = _macho_trie(data, off, size)
        elif base == 0x22:  # LC_DYLD_INFO(_ONLY)
            off, size = struct.unpack_from("<II", data, pos + 40)
            if size:
                trie = _macho_trie(data, off, size)
        elif base in (0xC, 0x18, 0x1F):  # LC_LOAD_DYLIB, LC_LOAD_WEAK_DYLIB, LC_REEXPORT_DYLIB
            name_off, = struct.unpack_from("<I", data, pos + 8)
            needed.append(_cstr(data, pos + name_off))
        elif cmd == 0x32:  # LC_BUILD_VERSION
            minos, = struct.unpack_from("<I", data, pos + 12)
            min_os = (minos >> 16, (minos >> 8) & 0xFF)
        elif cmd == 0x1D:  # LC_CODE_SIGNATURE
            signed = True
        elif cmd == 0x24:  # LC_VERSION_MIN_MACOSX
            ver, = struct.unpack_from("<I", data, pos + 8)
            min_os = (ver >> 16, (ver >> 8) & 0xFF)
        pos += cmdsize
    names = trie if trie is not None else symtab
    exports = sorted(n[1:] if n.startswith("_") else n for n in names)
    arch = {0x01000007: "x86_64", 0x0100000C: "aarch64"}.get(cputype, f"unknown:{cputype:#x}")
    return Binary("Mach-O", arch, exports, needed, min_os=min_os, signed=signed)


def _inspect_pe(data: bytes) -> Binary:
    pe, = struct.unpack_from("<I", data, 0x3C)
    if data[pe:pe + 4] != b"PE\0\0":
        raise PackError("MZ file without a PE header")
    machine, nsect, _t, _p, _n, opt_size, _c = struct.unpack_from("<HHIIIHH", data, pe + 4)
    opt = pe + 24
    if struct.unpack_from("<H", data, opt)[0] != 0x20B:
        raise PackError("only PE32+ (64-bit) DLLs are supported")
    ndirs, = struct.unpack_from("<I", data, opt + 108)
    dirs = [struct.unpack_from("<II", data, opt + 112 + 8 * i) for i in range(ndirs)]
    sects = []
    for i in range(nsect):
        _name, vsize, vaddr, rawsize, rawptr = struct.unpack_from("<8sIIII", data, opt + opt_size + 40 * i)
        sects.append((vaddr, max(vsize, rawsize), rawptr))

    def rva(addr: int) -> int:
        for vaddr, size, rawptr in sects:
            if vaddr <= addr < vaddr + size:
                return rawptr + addr - vaddr
        raise PackError(f"PE: address {addr:#x} is in no section")

    exports: list[str] = []
    if ndirs > 0 and dirs[0][0]:
        e = rva(dirs[0][0])
        nnames, = struct.unpack_from("<I", data, e + 24)
        names_rva, = struct.unpack_from("<I", data, e + 32)
        for i in range(nnames):
            exports.append(_cstr(data, rva(struct.unpack_from("<I", data, rva(names_rva) + 4 * i)[0])))
    needed: list[str] = []
    if ndirs > 1 and dirs[1][0]:
        pos = rva(dirs[1][0])
        while True:
            _ilt, _ts, _fwd, name, iat = struct.unpack_from("<IIIII", data, pos)
            if name == 0 and iat == 0:
                break
            needed.append(_cstr(data, rva(name)))
            pos += 20
    arch = {0x8664: "x86_64", 0xAA64: "aarch64"}.get(machine, f"unknown:{machine:#x}")
    return Binary("PE", arch, sorted(exports), needed)


# ---------------------------------------------------------------------------
# Checking what was packed

def capi_exports(root: Path = ROOT) -> set[str] | None:
    """The `export fn` names of src/capi.zig: what every library must export, exactly."""
    capi = root / "src" / "capi.zig"
    if not capi.is_file():
        return None
    return set(re.findall(r"\bexport\s+fn\s+(\w+)\s*\(", capi.read_text()))


_FORMAT = {"linux": "ELF", "macosx": "Mach-O", "win": "PE"}

# Zig's Mach-O linker exports two symbols it synthesizes in every dylib (Apple's ld64
# keeps them private). They are harmless under macOS's two-level namespace, and
# nothing in the build can hide them, so they are the only non-lx_ names allowed.
MACHO_LINKER_SYMBOLS = {"_mh_dylib_header", "__dso_handle"}


def check_library(data: bytes, platform: Platform, expected_exports: set[str] | None) -> tuple[Binary, str]:
    """Check one library against its platform tag; returns it and a one-line summary."""
    b = inspect_library(data)
    where = f"{platform.tag}/{platform.lib_name}"
    if b.format != _FORMAT[platform.os]:
        raise PackError(f"{where}: is {b.format}, expected {_FORMAT[platform.os]}")
    if b.arch != platform.arch:
        raise PackError(f"{where}: built for {b.arch}, expected {platform.arch}")
    if not b.exports:
        raise PackError(f"{where}: exports nothing")
    allowed = MACHO_LINKER_SYMBOLS if b.format == "Mach-O" else set()
    foreign = [n for n in b.exports if not n.startswith("lx_") and n not in allowed]
    if foreign:
        raise PackError(f"{where}: exports non-lx_ symbols: {foreign[:10]}")
    ours = {n for n in b.exports if n.startswith("lx_")}
    if expected_exports is not None and ours != expected_exports:
        missing = sorted(expected_exports - ours)
        extra = sorted(ours - expected_exports)
        raise PackError(f"{where}: exports differ from src/capi.zig: missing {missing}, extra {extra}")
    if platform.libc == "glibc":
        newest = b.glibc_max()
        too_new = sorted({f"{s}@{v}" for s, v in b.symbol_versions.items()
                          if (_glibc_version(v) or ()) > platform.min_version})
        if too_new:
            raise PackError(f"{where}: needs glibc newer than {platform.min_version}: {too_new}")
        if not any(n.startswith("libc.so.") for n in b.needed):
            raise PackError(f"{where}: does not link glibc (NEEDED {b.needed})")
        req = f"GLIBC <= {'.'.join(map(str, newest))}" if newest else "no versioned glibc symbols"
    elif platform.libc == "musl":
        if b.symbol_versions and any(v.startswith("GLIBC") for v in b.symbol_versions.values()):
            raise PackError(f"{where}: uses glibc-versioned symbols in a musllinux wheel")
        if "libc.so" not in b.needed or any(n.startswith("libc.so.") for n in b.needed):
            raise PackError(f"{where}: expected to link musl's libc.so, NEEDED {b.needed}")
        req = "NEEDED " + ",".join(b.needed)
    elif platform.os == "macosx":
        if b.min_os is None:
            raise PackError(f"{where}: no minimum macOS version in the load commands")
        if b.min_os > platform.min_version:
            raise PackError(f"{where}: needs macOS {b.min_os}, tag promises {platform.min_version}")
        if platform.arch == "aarch64" and not b.signed:
            raise PackError(f"{where}: arm64 macOS refuses to load code without a (linker ad-hoc) signature")
        req = f"minos {b.min_os[0]}.{b.min_os[1]}{', signed' if b.signed else ''}"
    else:
        req = f"{len(b.needed)} DLLs"
    linker = len(b.exports) - len(ours)
    return b, f"{len(ours)} lx_*{f' (+{linker} linker)' if linker else ''}, {req}"


def check_wheel(path: Path, root: Path = ROOT, project: Project | None = None,
                inspect_binary: bool = True) -> dict:
    """Check a packed wheel; returns a row for the summary table."""
    project = project or load_project(root)
    m = re.fullmatch(rf"{project.dist_name}-{re.escape(project.version)}-py3-none-(\w+)\.whl", path.name)
    if not m:
        raise PackError(f"{path.name}: not a {project.dist_name} {project.version} py3-none wheel name")
    platform = parse_tag(m.group(1))
    dist_info = f"{project.dist_name}-{project.version}.dist-info"
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
        if len(set(names)) != len(names):
            raise PackError(f"{path.name}: duplicate archive members")
        bad = zf.testzip()
        if bad:
            raise PackError(f"{path.name}: corrupt member {bad}")
        files = {n: zf.read(n) for n in names}

    def text(name: str) -> str:
        if name not in files:
            raise PackError(f"{path.name}: missing {name}")
        return files[name].decode("utf-8")

    wheel = text(f"{dist_info}/WHEEL").splitlines()
    if "Root-Is-Purelib: false" not in wheel or "Wheel-Version: 1.0" not in wheel:
        raise PackError(f"{path.name}: WHEEL must say Wheel-Version 1.0 and Root-Is-Purelib false")
    tags = [line.split(":", 1)[1].strip() for line in wheel if line.startswith("Tag:")]
    if tags != [f"py3-none-{platform.tag}"]:
        raise PackError(f"{path.name}: WHEEL tags {tags}, expected py3-none-{platform.tag}")
    meta = text(f"{dist_info}/METADATA")
    head = meta.split("\n\n", 1)[0].splitlines()
    for want in (f"Name: {project.name}", f"Version: {project.version}"):
        if want not in head:
            raise PackError(f"{path.name}: METADATA lacks {want!r}")
    for dep in project.dependencies:
        if f"Requires-Dist: {dep}" not in head:
            raise PackError(f"{path.name}: METADATA lacks Requires-Dist {dep}")
    if "console_scripts" in project.entry_points and "[console_scripts]" not in text(f"{dist_info}/entry_points.txt"):
        raise PackError(f"{path.name}: entry_points.txt lacks the console scripts")
    for dest in LICENSE_FILES.values():
        text(f"{dist_info}/licenses/{dest}")

    # RECORD: every member listed once with the right hash and size, and nothing else.
    rows = list(csv.reader(io.StringIO(text(f"{dist_info}/RECORD"))))
    listed = {r[0]: r for r in rows}
    if set(listed) != set(names) or len(rows) != len(names):
        raise PackError(f"{path.name}: RECORD does not list exactly the archive members "
                        f"(unlisted {sorted(set(names) - set(listed))}, extra {sorted(set(listed) - set(names))})")
    for name, digest, size in rows:
        if name == f"{dist_info}/RECORD":
            if digest or size:
                raise PackError(f"{path.name}: RECORD must not hash itself")
            continue
        if digest != _record_hash(files[name]) or int(size) != len(files[name]):
            raise PackError(f"{path.name}: RECORD hash or size wrong for {name}")

    # Exactly one native library, this platform's, where _lib.py looks for it.
    natives = [n for n in names if n.endswith(NATIVE_SUFFIXES) or ".so." in n]
    lib_member = f"{PACKAGE}/lib/{platform.lib_name}"
    if natives != [lib_member]:
        raise PackError(f"{path.name}: native files {natives}, expected only {lib_member}")
    if any(n.startswith(f"{PACKAGE}/lib/") and n != lib_member for n in names):
        raise PackError(f"{path.name}: unexpected files in {PACKAGE}/lib/")
    py = sorted(n for n in names if n.startswith(f"{PACKAGE}/") and n != lib_member)
    expected_py = sorted(n for n, _ in package_files(root))
    if py != expected_py:
        raise PackError(f"{path.name}: package files differ from the source tree: "
                        f"missing {sorted(set(expected_py) - set(py))}, extra {sorted(set(py) - set(expected_py))}")
    junk = [n for n in names if "__pycache__" in n or n.endswith((".pyc", ".pyo")) or "/tests/" in n]
    if junk:
        raise PackError(f"{path.name}: caches or tests packed: {junk}")
    outside = [n for n in names if not (n.startswith(f"{PACKAGE}/") or n.startswith(f"{dist_info}/"))]
    if outside:
        raise PackError(f"{path.name}: files outside the package: {outside}")

    row = {"wheel": path.name, "size": path.stat().st_size, "platform": platform.describe(),
           "library": platform.lib_name, "python files": len(py), "binary": "not inspected"}
    if inspect_binary:
        b, summary = check_library(files[lib_member], platform, capi_exports(root))
        row["binary"] = f"{b.format} {b.arch}, {summary}"
    return row


# ---------------------------------------------------------------------------
# The sdist

# Never copied into the sdist's staging tree: build output, caches, fetched sources.
_STAGING_SKIP_TOP = {".git", "zig-out", ".zig-cache", "dist", "build", "bench-out", ".pytest_cache", ".benchmarks"}
_STAGING_SKIP_ANY = ("__pycache__", "*.egg-info", ".venv*", "*.py[cod]")


def _staging_ignore(root: Path):
    import fnmatch

    def ignore(directory: str, names: list[str]) -> set[str]:
        rel = Path(directory).resolve().relative_to(root.resolve()).as_posix()
        skip = {n for n in names if any(fnmatch.fnmatch(n, pat) for pat in _STAGING_SKIP_ANY)}
        if rel == ".":
            skip |= _STAGING_SKIP_TOP & set(names)
        elif rel == "vendor":
            skip |= {"zstd"} & set(names)
        elif rel == PACKAGE:
            skip |= {"lib"} & set(names)
        return skip
    return ignore


def build_sdist(out_dir: Path, root: Path = ROOT) -> Path:
    """The sdist from the project's own PEP 517 backend, run in this environment.

    It runs in a staging copy of the tree without build output, fetched zstd or a
    stale *.egg-info (whose old SOURCES.txt setuptools would otherwise reuse), so
    the sdist depends only on the sources and MANIFEST.in, and the repository is
    left untouched.
    """
    backend = _load_toml(root / "pyproject.toml")["build-system"]["build-backend"]
    module, _, obj = backend.partition(":")
    code = ("import importlib, sys\n"
            f"b = importlib.import_module({module!r})\n"
            + (f"b = getattr(b, {obj!r})\n" if obj else "")
            + "print(b.build_sdist(sys.argv[1]))\n")
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        staging, built = Path(tmp) / "src", Path(tmp) / "out"
        shutil.copytree(root, staging, ignore=_staging_ignore(root))
        proc = subprocess.run([sys.executable, "-c", code, str(built)], cwd=staging, capture_output=True, text=True)
        if proc.returncode != 0:
            raise PackError(f"building the sdist with {backend} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        name = proc.stdout.strip().splitlines()[-1]
        target = out_dir / name
        shutil.move(str(built / name), target)
    return target


def check_sdist(path: Path, root: Path = ROOT, project: Project | None = None) -> dict:
    """Sources only, and everything `pip install` of it needs to build from source."""
    project = project or load_project(root)
    prefix = f"{project.dist_name}-{project.version}/"
    if path.name != f"{project.dist_name}-{project.version}.tar.gz":
        raise PackError(f"{path.name}: unexpected sdist name")
    with tarfile.open(path, "r:gz") as tar:
        members = [m for m in tar.getmembers() if m.isfile()]
    names = []
    for m in members:
        if not m.name.startswith(prefix):
            raise PackError(f"{path.name}: member {m.name} outside {prefix}")
        names.append(m.name[len(prefix):])
    missing = [n for n in SDIST_REQUIRED if n not in names]
    if missing:
        raise PackError(f"{path.name}: missing {missing}")
    forbidden = [n for n in names if n.startswith(SDIST_FORBIDDEN_DIRS) or n.endswith(NATIVE_SUFFIXES)
                 or "__pycache__" in n or n.endswith((".pyc", ".pyo", ".whl"))]
    if forbidden:
        raise PackError(f"{path.name}: holds built or third-party files: {forbidden[:10]}")
    zig = sorted(p.relative_to(root).as_posix() for p in (root / "src").rglob("*.zig"))
    py = sorted(n for n, _ in package_files(root))
    lost = [n for n in zig + py if n not in names]
    if lost:
        raise PackError(f"{path.name}: source files not in the sdist: {lost}")
    return {"wheel": path.name, "size": path.stat().st_size, "platform": "any (builds from source with Zig)",
            "library": "-", "python files": sum(n.startswith(f"{PACKAGE}/") for n in names),
            "binary": f"{len(names)} files, no zstd sources, no libraries"}


# ---------------------------------------------------------------------------
# Command line

def dist_folders(dist: Path, build_zig: Path = ROOT / "build.zig", partial: bool = False) -> list[tuple[str, Path]]:
    """(tag, folder) per folder of `dist`, checked against build.zig's release table."""
    if not dist.is_dir():
        raise PackError(f"{dist} does not exist: run `python -m ziglang build dist` first")
    table = [tag for _, tag in release_targets(build_zig)]
    found = sorted(p.name for p in dist.iterdir() if p.is_dir())
    unknown = [t for t in found if t not in table]
    if unknown:
        raise PackError(f"{dist}: folders {unknown} are not tags of build.zig's release_targets {table}")
    absent = [t for t in table if t not in found]
    if absent and not partial:
        raise PackError(f"{dist}: no build for {absent} (rebuild with `python -m ziglang build dist`, "
                        "or pass --partial to pack only what is there)")
    if not found:
        raise PackError(f"{dist}: no target folders")
    return [(t, dist / t) for t in table if t in found]


def print_table(rows: list[dict]) -> None:
    cols = ["wheel", "size", "platform", "binary"]
    cells = [[str(r[c]) if c != "size" else f"{r[c] / 1024:.0f} KiB" for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)))
    print("  ".join("-" * w for w in widths))
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dist", type=Path, default=ROOT / "zig-out" / "dist",
                    help="folder of per-tag library folders (default: zig-out/dist)")
    ap.add_argument("--out", type=Path, default=ROOT / "dist", help="where wheels and sdist go (default: dist/)")
    ap.add_argument("--skip-sdist", action="store_true", help="pack wheels only")
    ap.add_argument("--partial", action="store_true",
                    help="pack only the targets present in --dist instead of requiring all of build.zig's")
    args = ap.parse_args(argv)
    try:
        project = load_project()
        folders = dist_folders(args.dist, partial=args.partial)
        args.out.mkdir(parents=True, exist_ok=True)
        stale = list(args.out.glob(f"{project.dist_name}-{project.version}-*.whl"))
        if not args.skip_sdist:
            stale += list(args.out.glob(f"{project.dist_name}-{project.version}.tar.gz"))
        for p in stale:
            p.unlink()
        rows = []
        for tag, folder in folders:
            wheel = build_wheel(folder, tag, args.out, project=project)
            rows.append(check_wheel(wheel, project=project))
        if not args.skip_sdist:
            sdist = build_sdist(args.out)
            rows.append(check_sdist(sdist, project=project))
    except PackError as e:
        print(f"build_wheels: {e}", file=sys.stderr)
        return 1
    print_table(rows)
    print(f"\n{len(folders)} wheel(s){'' if args.skip_sdist else ' + 1 sdist'} in {args.out}, all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
