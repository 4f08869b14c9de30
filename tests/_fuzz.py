"""Runs the fuzz corpus of tests/_fuzz_cases.py: a worker process that opens,
gathers and verifies hostile stores one after another, and a driver that feeds
workers case numbers, notices a worker's death (a crash) or silence (a hang),
blames the case in flight, and starts a fresh worker for the rest.

The invariants each case is held to are stated in tests/faults/test_corruption_corpus.py.

    python tests/_fuzz.py repro SEED I [DIR]   # one case in this process, files kept in DIR
"""

from __future__ import annotations

import collections
import faulthandler
import gc
import json
import os
import pickle
import re
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
MEMORY_LIMIT = 1 << 30  # RLIMIT_AS of a worker
FILE_LIMIT = 64 << 20  # RLIMIT_FSIZE of a worker: no stray multi-GiB files
GATHER_OUT_BYTES = 4 << 20


# ----------------------------------------------------------------- exceptions


def allowed(exc: BaseException) -> bool:
    """A loaderx exception: a ZrecordError, or a plain IndexError, TypeError
    or ValueError raised by a `raise` statement in loaderx's own code."""
    from loaderx.errors import ZrecordError

    if isinstance(exc, ZrecordError):
        return True
    if type(exc) not in (IndexError, TypeError, ValueError):
        return False
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return False
    code = tb.tb_frame.f_code
    import linecache

    import loaderx

    if not os.path.abspath(code.co_filename).startswith(os.path.dirname(loaderx.__file__) + os.sep):
        return False

    return linecache.getline(code.co_filename, tb.tb_lineno).lstrip().startswith("raise ")


def where(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    return " <- ".join(
        f"{os.path.basename(f.filename)}:{f.lineno} {f.name}" for f in reversed(frames[-3:])
    )


class Outcome:
    """What one case did: problems (invariant violations) and clean errors."""

    def __init__(self):
        self.problems: list[dict] = []
        self.errors: list[str] = []
        self.opened = 0
        self.verified = 0

    def call(self, stage: str, fn):
        """Runs a library call; a clean error is noted, any other exception is a problem."""
        try:
            return True, fn()
        except BaseException as e:  # noqa: BLE001 - classifying every exception is the point
            if isinstance(e, KeyboardInterrupt):
                raise
            if allowed(e):
                self.errors.append(f"{stage}: {type(e).__name__}")
            else:
                self.problems.append(
                    {
                        "kind": "exception",
                        "stage": stage,
                        "type": f"{type(e).__module__}.{type(e).__qualname__}",
                        "message": str(e)[:300],
                        "where": where(e),
                    }
                )
            return False, None


# ----------------------------------------------------------------- reading a store


def _as_bytes(x) -> bytes:
    import numpy as np

    if isinstance(x, (bytes, bytearray)):
        return bytes(x)
    return np.ascontiguousarray(x).tobytes()


def _packed_records(store, n: int) -> list:
    import numpy as np

    values, splits = store.gather(np.arange(n), packed=True)
    return [values[int(splits[i]) : int(splits[i + 1])] for i in range(n)]


def _gather_out_records(store, n: int) -> list:
    buf = bytearray(GATHER_OUT_BYTES)
    _, splits = store.gather(list(range(n)), out=buf, packed=True)
    return [bytes(buf[int(splits[i]) : int(splits[i + 1])]) for i in range(n)]


def batch_reads(store, n: int) -> list:
    """(api name, packed-layout flag, fn returning n records) for the store's class."""
    import numpy as np
    from loaderx import DenseStore, RaggedStore

    if isinstance(store, DenseStore):
        return [
            ("ds[:]", False, lambda: list(store[:])),
            (
                "ds.gather(int64 array)",
                False,
                lambda: list(store.gather(np.arange(n, dtype=np.int64))),
            ),
        ]
    if isinstance(store, RaggedStore):
        return [
            ("rs[:]", False, lambda: store[:]),
            ("rs.gather(packed=True)", True, lambda: _packed_records(store, n)),
        ]
    return [
        ("z[:]", False, lambda: store[:]),
        ("z.gather(out=, packed=True)", False, lambda: _gather_out_records(store, n)),
    ]


def matches(got, want, records, compare: str, packed: bool) -> bool:
    """Whether a returned record is the expected one (see Case.states)."""
    import numpy as np

    if want is None:
        return True
    dtype, shape, payload = records[want] if isinstance(want, int) else (None, None, want)
    if _as_bytes(got) != payload:
        return False
    if compare == "typed" and dtype is not None and not packed and isinstance(got, np.ndarray):
        return got.dtype.str == dtype and got.shape == tuple(shape)
    return True


def _describe(x) -> str:
    if isinstance(x, (bytes, bytearray)):
        return f"bytes[{len(x)}] {bytes(x[:16]).hex()}"
    try:
        return f"array {x.dtype.str}{tuple(x.shape)} {_as_bytes(x)[:16].hex()}"
    except Exception:  # noqa: BLE001 - a description must never fail
        return type(x).__name__


class Oracle:
    """Whether verify() reports record i damaged, asked of a store holding
    only record i (so verify's stop at the first damaged record does not hide it)."""

    def __init__(self, path: str, scratch: str):
        self.path = path
        self.scratch = scratch
        self.cache: dict[int, bool] = {}

    def damaged(self, i: int, out: Outcome) -> bool:
        if i not in self.cache:
            self.cache[i] = self._ask(i, out)
        return self.cache[i]

    def _ask(self, i: int, out: Outcome) -> bool:
        from _lxformat import StoreImage
        from loaderx import Zrecord
        from loaderx.errors import CorruptStoreError

        shutil.rmtree(self.scratch, ignore_errors=True)
        StoreImage.load(self.path).single_record(i).write(self.scratch)
        try:
            with Zrecord(self.scratch) as z:
                z.verify()
            return False
        except CorruptStoreError:
            return True
        except BaseException as e:  # noqa: BLE001
            out.problems.append(
                {
                    "kind": "oracle",
                    "stage": f"verify of record {i} alone",
                    "type": type(e).__name__,
                    "message": str(e)[:300],
                }
            )
            return True


# ----------------------------------------------------------------- one case


def check_handle(store, label: str, case, records: list, oracle: Oracle, out: Outcome) -> None:
    """Reads every record of an open store through each API, verifies it, and
    holds what came back to the case's states."""
    ok, n = out.call(f"{label}: len", lambda: len(store))
    if not ok:
        return
    out.call(f"{label}: stats", store.stats)
    states = [s for s in case.states if len(s) == n]
    if not states:
        out.problems.append(
            {
                "kind": "wrong count",
                "stage": label,
                "message": f"store opened with {n} records; expected "
                f"{sorted({len(s) for s in case.states})}",
            }
        )
        return
    got = []  # (api, packed, index, record)
    for api, packed, fn in batch_reads(store, n):
        ok, recs = out.call(f"{label}: {api}", fn)
        if ok:
            got.extend((api, packed, i, r) for i, r in enumerate(recs))
    for i in range(n):
        ok, r = out.call(f"{label}: [{i}]", lambda i=i: store[i])
        if ok:
            got.append((f"[{i}]", False, i, r))
    ok, _ = out.call(f"{label}: verify", store.verify)
    out.verified += ok
    _hold_to_states(got, states, label, case, records, oracle, out)
    _check_windows(store, label, ok, out)


WINDOW = 5  # seq_len of the token windows read from integer ragged stores


def _check_windows(store, label: str, verified: bool, out: Outcome) -> None:
    """A ragged store of integers is also read as TokenWindows (building or
    reading its windows.idx). Unless verify() reported damage, every window
    must be the slice of the store's own records that it names."""
    import numpy as np
    from loaderx import RaggedStore, TokenWindows

    if not isinstance(store, RaggedStore) or store.dtype.kind not in "iu":
        return
    ok, tw = out.call(f"{label}: TokenWindows", lambda: TokenWindows(store, WINDOW))
    if not ok:
        return
    # A damaged table can claim a corpus of 2^40 tokens: read a few of those windows.
    picked = np.arange(len(tw)) if len(tw) <= 4096 else np.array([0, 1, len(tw) // 2, len(tw) - 1])
    ok, windows = out.call(f"{label}: windows", lambda: tw[picked])
    if not ok or not verified:
        return
    ok, docs = out.call(f"{label}: records for windows", lambda: store[:])
    if not ok:
        return
    flat = np.concatenate([np.ravel(d) for d in docs]) if docs else np.zeros(0, store.dtype)
    n = (len(flat) - 1) // WINDOW if len(flat) else 0
    # (Shapes fixed to WINDOW + 1 columns: a store of no windows reads an empty batch.)
    same = n == len(tw)
    if same:
        want = [flat[i * WINDOW : i * WINDOW + WINDOW + 1] for i in picked.tolist()]
        want = np.array(want, dtype=store.dtype).reshape(len(picked), WINDOW + 1)
        same = np.array_equal(np.asarray(windows).reshape(len(picked), WINDOW + 1), want)
    if not same:
        out.problems.append(
            {
                "kind": "wrong windows",
                "stage": f"{label}: windows",
                "message": f"{len(tw)} windows differ from the records' token stream "
                f"({n} windows); verify() reports no damage",
            }
        )


def _hold_to_states(got, states, label, case, records, oracle: Oracle, out: Outcome) -> None:
    """Every returned record must match the state (of this length) best
    matched, unless verify() reports that record damaged."""

    def misses(state):
        return [
            (api, i, r)
            for api, packed, i, r in got
            if not matches(r, state[i], records, case.compare, packed)
        ]

    state = min(states, key=lambda s: len(misses(s)))
    for api, i, r in misses(state):
        if oracle.damaged(i, out):
            continue
        want = state[i]
        expected = _describe(records[want][2]) if isinstance(want, int) else _describe(want)
        out.problems.append(
            {
                "kind": "wrong bytes",
                "stage": f"{label}: {api}",
                "message": f"record {i}: got {_describe(r)}, expected {expected}; "
                "verify() does not report it damaged",
            }
        )


def run_case(case, records: list, workdir: str) -> dict:
    """Writes the case's store, opens it typed and via open_store, checks it."""
    from loaderx import DenseStore, RaggedStore, Zrecord
    from loaderx.dataset import open_store

    path = os.path.join(workdir, "store")
    shutil.rmtree(path, ignore_errors=True)
    case.image.write(path)
    out = Outcome()
    oracle = Oracle(path, os.path.join(workdir, "single"))
    typed = {"dense": DenseStore, "ragged": RaggedStore, "bytes": Zrecord}[case_kind(case)]
    for label, opener in (("typed", typed), ("open_store", open_store)):
        ok, store = out.call(f"{label}: open", lambda opener=opener: opener(path))
        if not ok:
            continue
        out.opened += 1
        try:
            check_handle(store, label, case, records, oracle, out)
        finally:
            out.call(f"{label}: close", store.close)
            del store
    return summarize(out)


def case_kind(case) -> str:
    from _fuzz_common import KINDS

    return KINDS[case.base]


def summarize(out: Outcome) -> dict:
    if out.problems:
        outcome = "FAIL"
    elif out.opened:
        outcome = (
            "opened, verify ok" if out.verified == out.opened else "opened, verify reports damage"
        )
    else:
        first = out.errors[0].split(": ")[-1] if out.errors else "?"
        outcome = f"refused ({first})"
    return {"outcome": outcome, "problems": out.problems, "errors": out.errors[:8]}


# ----------------------------------------------------------------- the worker process


def load_bases(path: str) -> dict:
    from _fuzz_common import Base

    with open(path, "rb") as f:
        raw = pickle.load(f)
    return {name: Base(name, kind, files, records) for name, (kind, files, records) in raw.items()}


def save_bases(bases: dict, path: str) -> None:
    with open(path, "wb") as f:
        pickle.dump({b.name: (b.kind, b.files, b.records) for b in bases.values()}, f)


def limit_resources() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT, FILE_LIMIT))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a too-large write fails with EFBIG instead


def _selftest(i: int) -> None:
    """LOADERX_FUZZ_SELFTEST="crash:I,hang:J" makes the worker die on case I
    and hang on case J (tests of the driver itself)."""
    for item in filter(None, os.environ.get("LOADERX_FUZZ_SELFTEST", "").split(",")):
        what, _, at = item.partition(":")
        if int(at) == i:
            if what == "crash":
                os.kill(os.getpid(), signal.SIGSEGV)
            time.sleep(3600)


def peak_rss_kib() -> int:
    """This process's peak RSS since exec (VmHWM). ru_maxrss would also count
    the parent's pages at fork time: a worker forked from a large pytest
    process would report the parent's size."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def open_descriptors() -> int | None:
    """File descriptors this process holds (None where /proc is missing)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return None


def _warm_up(bases: dict, workdir: str) -> None:
    """Runs each intact base once, so lazily opened descriptors exist before
    the first case is counted."""
    from _fuzz_common import Case
    from _lxformat import StoreImage

    for base in bases.values():
        case = Case(
            -1,
            base.name,
            "warm-up",
            "intact",
            StoreImage(base.files),
            [list(range(len(base.records)))],
        )
        result = run_case(case, base.records, workdir)
        if result["problems"]:
            raise RuntimeError(f"intact base {base.name} fails the checks: {result['problems']}")


def run_counted(case, records: list, workdir: str, run=None) -> dict:
    """run_case (or `run()`), plus the descriptor count: an open that fails,
    or a handle that is closed, must not leave files (or the writer lock) open."""
    before = open_descriptors()
    try:
        result = run() if run is not None else run_case(case, records, workdir)
    except Exception as e:  # noqa: BLE001 - a harness bug is reported, not hidden
        return {
            "outcome": "FAIL",
            "errors": [],
            "problems": [
                {
                    "kind": "harness",
                    "type": type(e).__name__,
                    "message": str(e)[:300],
                    "where": where(e),
                }
            ],
        }
    after = open_descriptors()
    if before is not None and after > before:
        gc.collect()
        after = open_descriptors()
        if after > before:
            result["outcome"] = "FAIL"
            result["problems"].append(
                {
                    "kind": "leaked descriptors",
                    "message": f"{after - before} file descriptor(s) stay open "
                    "after every handle was closed",
                }
            )
    return result


def _manifest_runner(bases: dict, workdir: str):
    """The manifest corpus (tests/_fuzz_manifests.py): builds the template,
    checks that its valid manifests open cleanly, returns make(seed, i) and
    run(case)."""
    import _fuzz_manifests as fm

    template = os.path.join(workdir, "template")
    shutil.rmtree(template, ignore_errors=True)
    fm.write_template(template, bases)
    for which in range(len(fm.DATASETS)):
        data = json.dumps(fm.valid_manifest(bases, which)).encode()
        case = fm.ManifestCase(-1, "warm-up", "valid", data, [], fm.template_parts())
        result = fm.run_manifest_case(case, bases, template, workdir)
        if result["problems"] or result["outcome"] != "opened, verify ok":
            raise RuntimeError(f"a valid manifest fails the checks: {result}")

    def run(case):
        return run_counted(case, [], workdir,
                           lambda: fm.run_manifest_case(case, bases, template, workdir))

    return (lambda seed, i: fm.make_manifest_case(bases, seed, i)), run


def worker_main(bases_path: str, seed: int, workdir: str, corpus: str = "stores") -> None:
    """Reads case numbers from stdin, answers one JSON line per case."""
    limit_resources()
    faulthandler.enable()
    from _fuzz_cases import make_case

    bases = load_bases(bases_path)
    if corpus == "manifests":
        make, run = _manifest_runner(bases, workdir)
    else:
        _warm_up(bases, workdir)
        make = (lambda seed, i: make_case(bases, seed, i))  # noqa: E731
        run = (lambda case: run_counted(case, bases[case.base].records, workdir))  # noqa: E731
    print("ready", flush=True)
    for line in sys.stdin:
        i = int(line)
        sys.stderr.write(f"--- case {i}\n")
        sys.stderr.flush()
        _selftest(i)
        try:
            case = make(seed, i)
        except Exception as e:  # noqa: BLE001 - a harness bug is reported, not hidden
            result = {
                "outcome": "FAIL",
                "errors": [],
                "what": "?",
                "problems": [
                    {
                        "kind": "harness",
                        "type": type(e).__name__,
                        "message": str(e)[:300],
                        "where": where(e),
                    }
                ],
            }
        else:
            result = run(case)
            result["what"] = f"{case.base}, {case.family}: {case.what}"
        result["rss_kib"] = peak_rss_kib()
        print(f"E {i} {json.dumps(result)}", flush=True)


# ----------------------------------------------------------------- the driver


class Worker:
    """One worker process and the case it is running."""

    def __init__(self, bases_path: str, seed: int, root: str, serial: int,
                 corpus: str = "stores"):
        self.corpus = corpus
        self.workdir = os.path.join(root, f"w{serial}")
        os.makedirs(self.workdir, exist_ok=True)
        self.err_path = os.path.join(root, f"w{serial}.stderr")
        env = dict(os.environ)
        import loaderx

        pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(loaderx.__file__)))
        env["PYTHONPATH"] = os.pathsep.join(
            [HERE, pkg_root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
        )
        with open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    os.path.abspath(__file__),
                    "worker",
                    bases_path,
                    str(seed),
                    self.workdir,
                    corpus,
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                env=env,
                cwd=self.workdir,
            )
        self.buf = b""
        self.case: int | None = None
        self.deadline = time.monotonic() + 120  # startup
        self.ready = False

    def send(self, i: int, timeout: float) -> None:
        self.case = i
        self.deadline = time.monotonic() + timeout
        self.proc.stdin.write(f"{i}\n".encode())
        self.proc.stdin.flush()

    def read(self) -> list[str] | None:
        """Complete lines now readable; None at end of output (the worker died)."""
        chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
        if not chunk:
            return None
        self.buf += chunk
        *lines, self.buf = self.buf.split(b"\n")
        return [x.decode() for x in lines]

    def stderr_tail(self) -> str:
        with open(self.err_path, "rb") as f:
            text = f.read().decode(errors="replace")
        marker = f"--- case {self.case}\n"
        return text[text.rfind(marker) + len(marker) :][-2000:] if marker in text else text[-2000:]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.kill()
        rc = self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass
        return rc


def _died(w: Worker) -> dict:
    rc = w.stop()
    name = signal.Signals(-rc).name if rc < 0 and -rc in signal.valid_signals() else f"exit {rc}"
    return {
        "outcome": "CRASH",
        "errors": [],
        "problems": [
            {"kind": "crash", "message": f"worker died with {name}", "stderr": w.stderr_tail()}
        ],
    }


def run_corpus(
    bases_path: str, seed: int, cases: range, root: str, jobs: int = 2, timeout: float = 20.0,
    corpus: str = "stores",
) -> dict[int, dict]:
    """Runs `cases` of `corpus` ("stores" or "manifests") on `jobs` workers;
    returns each case's result."""
    todo = collections.deque(cases)
    results: dict[int, dict] = {}
    serial = iter(range(1 << 30))
    workers = [Worker(bases_path, seed, root, next(serial), corpus)
               for _ in range(min(jobs, len(todo)))]
    try:
        while workers:
            for w in list(workers):
                if w.ready and w.case is None:
                    if todo:
                        w.send(todo.popleft(), timeout)
                    else:
                        w.stop()
                        workers.remove(w)
            if not workers:
                break
            wait = max(0.0, min(w.deadline for w in workers) - time.monotonic())
            readable, _, _ = select.select([w.proc.stdout for w in workers], [], [], wait)
            for w in list(workers):
                if w.proc.stdout in readable:
                    _collect(w, workers, results, root, bases_path, seed, serial)
                elif time.monotonic() > w.deadline:
                    _hang(w, workers, results, root, bases_path, seed, serial, timeout)
    finally:
        for w in workers:
            w.stop()
    return results


def _replace(w, workers, root, bases_path, seed, serial) -> None:
    workers[workers.index(w)] = Worker(bases_path, seed, root, next(serial), w.corpus)


def _collect(w: Worker, workers, results, root, bases_path, seed, serial) -> None:
    lines = w.read()
    if lines is None:
        if w.case is None:
            raise RuntimeError(f"a fuzz worker failed to start:\n{w.stderr_tail()}")
        results[w.case] = _died(w)
        _replace(w, workers, root, bases_path, seed, serial)
        return
    for line in lines:
        if line == "ready":
            w.ready = True
            w.deadline = float("inf")
        elif line.startswith("E "):
            _, i, payload = line.split(" ", 2)
            results[int(i)] = json.loads(payload)
            w.case = None
            w.deadline = float("inf")


def _hang(w: Worker, workers, results, root, bases_path, seed, serial, timeout) -> None:
    if w.case is None:
        raise RuntimeError(f"a fuzz worker did not start in time:\n{w.stderr_tail()}")
    w.proc.send_signal(signal.SIGABRT)  # faulthandler prints where it hung
    try:
        w.proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    results[w.case] = {
        "outcome": "HANG",
        "errors": [],
        "problems": [
            {"kind": "hang", "message": f"no answer within {timeout} s", "stderr": w.stderr_tail()}
        ],
    }
    w.stop()
    _replace(w, workers, root, bases_path, seed, serial)


# ----------------------------------------------------------------- reporting


def _signature(p: dict) -> str:
    """What a problem is, without the numbers that differ from case to case."""
    if p["kind"] in ("wrong bytes", "wrong windows", "wrong count", "leaked descriptors"):
        return p["kind"] + ": " + re.sub(r"\d+", "N", p["message"].split(";")[0].split(": got")[0])
    if p["kind"] in ("crash", "hang"):
        frames = [
            x.strip() for x in p.get("stderr", "").splitlines() if x.strip().startswith("File ")
        ]
        where = frames[0].replace('File "', "").replace('", line', ":") if frames else "?"
        return f"{p['kind']}: {p['message']}; innermost Python frame {where}"
    msg = re.sub(r"\d[\d.]*", "N", p.get("message", ""))[:120]
    return f"{p['kind']}: {p.get('type', '')}: {msg}"


def failure_groups(results: dict[int, dict], title, examples: int = 3) -> list[str]:
    """One entry per distinct problem signature: how many cases, which
    stages, and a few example cases (title(i) names case i)."""
    groups: dict[str, dict] = {}
    for i in sorted(results):
        for p in results[i]["problems"]:
            g = groups.setdefault(_signature(p), {"cases": [], "stages": set()})
            if not g["cases"] or g["cases"][-1] != i:
                g["cases"].append(i)
            g["stages"].add(re.sub(r"\[\d+\]", "[i]", p.get("stage", "")))
    lines = []
    for sig, g in sorted(groups.items(), key=lambda kv: -len(kv[1]["cases"])):
        stages = ", ".join(sorted(s for s in g["stages"] if s))[:200]
        lines.append(f"  {sig}  [{len(g['cases'])} cases" + (f"; at {stages}]" if stages else "]"))
        lines.extend(f"      e.g. case {i}: {title(i)}" for i in g["cases"][:examples])
    return lines


def case_title(bases: dict, seed: int, i: int, result: dict) -> str:
    """ "base, family: what" of case i (from the worker, or made again here after a crash)."""
    if result.get("what"):
        return result["what"]
    from _fuzz_cases import make_case

    try:
        case = make_case(bases, seed, i)
    except Exception as e:  # noqa: BLE001 - a title must never fail
        return f"? (the case cannot be made: {type(e).__name__}: {e})"
    return f"{case.base}, {case.family}: {case.what}"


def tally(results: dict[int, dict]) -> dict:
    """Counts by outcome and by invariant."""

    def cases_with(kind):
        return sum(1 for r in results.values() if any(p["kind"] == kind for p in r["problems"]))

    by_outcome = collections.Counter(r["outcome"] for r in results.values())
    return {
        "cases": len(results),
        "outcomes": dict(by_outcome.most_common()),
        "crashes": cases_with("crash"),
        "hangs": cases_with("hang"),
        "wrong bytes": cases_with("wrong bytes"),
        "wrong windows": cases_with("wrong windows"),
        "wrong count": cases_with("wrong count"),
        "foreign exceptions": cases_with("exception"),
        "leaked descriptors": cases_with("leaked descriptors"),
        "harness errors": cases_with("harness") + cases_with("oracle"),
        "max rss MiB": max((r.get("rss_kib", 0) for r in results.values()), default=0) // 1024,
    }


# ----------------------------------------------------------------- command line


def repro(seed: int, i: int, keep: str | None = None) -> dict:
    """Builds the bases, runs case i in this process (with a worker's limits), prints it."""
    limit_resources()
    faulthandler.enable()
    from _fuzz_cases import make_case
    from _fuzz_common import build_bases

    root = keep or tempfile.mkdtemp(prefix="lxfuzz-")
    bases = build_bases(os.path.join(root, "bases"))
    case = make_case(bases, seed, i)
    print(f"case {i}: base {case.base}, {case.family}: {case.what}")
    result = run_case(case, bases[case.base].records, root)
    print(json.dumps(result, indent=1))
    print(f"store files: {os.path.join(root, 'store')}")
    return result


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    if sys.argv[1] == "worker":
        worker_main(sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5])
    elif sys.argv[1] == "repro":
        repro(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] if len(sys.argv) > 4 else None)
