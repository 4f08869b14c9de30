"""Smoke test of scripts/bench.py: every layer runs at --size tiny and validates.

This checks the harness, never timings: every loaderx row must run and pass the
bench's own validation (exact dtype, shape, order and values against the numpy
source), and a contender that is not installed must show up as a "missing" row
rather than fail the run. A second test proves the validation really rejects
wrong data.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
sys.path.insert(0, str(SCRIPTS))

import bench  # noqa: E402
import bench_harness  # noqa: E402

LAYERS = ("sampler", "dense", "ragged", "images", "loader")


@pytest.mark.parametrize("layer", LAYERS)
def test_layer_runs_and_validates_at_tiny_size(layer, tmp_path, capsys):
    out = tmp_path / "bench.json"
    code = bench.main([layer, "--size", "tiny", "--repeat", "1", "--json", str(out), "--workdir", str(tmp_path)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "== machine ==" in printed and "cores usable" in printed
    report = json.loads(out.read_text())
    assert report["invalid"] == []
    rows = [row for section in report["sections"] for row in section["rows"]]
    assert rows, "the layer produced no rows"
    for row in rows:
        assert row["status"] == "ok" or row["status"].startswith(("missing:", "failed:")), row
        if row["group"] == "loaderx":
            assert row["status"] == "ok", row
        if row["status"] == "ok":
            assert row["gather_mib_s"] and row["gather_mib_s"] > 0, row
    for section in report["sections"]:
        for target in section["targets"]:
            settled = ("met", "NOT MET") if target["spec"] else ("context: reached", "context: below")
            assert target["status"] in settled or target["status"].startswith("n/a"), target
    # Every run leaves its stores only in its own temporary directory, and removes them.
    assert not list(tmp_path.glob("loaderx-bench-*"))


class _WrongOrder(bench_harness.Backend):
    """Returns the right records in the wrong order: validation must catch it."""

    name = "wrong order"
    writes = False

    def __init__(self, data):
        self.data = data

    def open(self, directory):
        pass

    def fetch(self, indices):
        return self.data[indices[::-1]]

    def validate(self, output, indices):
        bench_harness.check_array(output, self.data[indices], self.name)


def test_validation_rejects_wrong_order(tmp_path):
    data = np.arange(1000, dtype=np.int64).reshape(100, 10)
    plan = bench_harness.Plan([np.array([1, 2, 3])], [3 * 80], data.nbytes)
    options = bench_harness.Options(workdir=tmp_path, repeat=1, write_repeat=1, budget_s=0.01)
    (row,) = bench_harness.Measurement("wrong", [_WrongOrder(data)], plan, options, print).run()
    assert row.status.startswith("INVALID"), row.status


def test_loader_overhead_probe_runs(tmp_path):
    """The loader-overhead diagnostic runs and reports all three rows."""
    import probe_loader_overhead

    rows = probe_loader_overhead.run(30, probe_loader_overhead.RECORD_BYTES, tmp_path)
    assert [r["name"] for r in rows] == ["plain loop (one thread)", "DataLoader workers=1", "DataLoader workers=2"]
    assert all(r["wall_us"] > 0 and r["cpu_us"] >= 0 for r in rows)
