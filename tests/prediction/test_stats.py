"""The report equals a plain numpy computation of the definitions, on several chunkings."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

import l5dask
from l5dask.errors import IntervalError
from l5dask.prediction import format as fmt
from l5dask.prediction.joins import Joins
from l5dask.prediction.report import compute_report, public
from tests.conftest import read_all

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
from numpy_reference import reference_report  # noqa: E402


def assert_report_equal(got, want, path="report"):
    """Integers exactly, floats to 1e-9 relative, every key of the reference present."""
    if isinstance(want, dict):
        for k in want:
            assert k in got, f"{path}.{k} missing"
            assert_report_equal(got[k], want[k], f"{path}.{k}")
    elif isinstance(want, list):
        assert len(got) == len(want), f"{path}: length {len(got)} != {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            assert_report_equal(g, w, f"{path}[{i}]")
    elif isinstance(want, float):
        assert math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12), f"{path}: {got} != {want}"
    else:
        assert got == want and type(got) is type(want) or (isinstance(got, int) and got == want), (
            f"{path}: {got!r} != {want!r}"
        )


def check(path: str, **kw):
    got = compute_report(path, **kw)
    want = reference_report(read_all(path), fmt.LABELS)
    assert_report_equal(public(got), want)
    json.dumps(public(got))  # serialisable
    return got


CHUNKINGS = [
    {fmt.SCENES: 1, fmt.FRAMES: 97, fmt.AGENTS: 1_000, fmt.TL_FACES: 333},
    {fmt.SCENES: 2, fmt.FRAMES: 300, fmt.AGENTS: 5_000, fmt.TL_FACES: 2_000},
    {fmt.SCENES: 3, fmt.FRAMES: 1_000, fmt.AGENTS: 7_777, fmt.TL_FACES: 10_000},
]


@pytest.mark.parametrize("chunks", CHUNKINGS)
def test_report_matches_numpy_on_chunkings(tmp_path, chunks):
    path = str(tmp_path / "d.zarr")
    l5dask.synthesize(path, num_scenes=4, seed=21, chunk_rows=chunks)
    check(path)


def test_report_with_label_ties_matches_numpy(tmp_path):
    """Ties between label probabilities: the report counts the first maximum, as numpy's argmax."""
    path = str(tmp_path / "ties.zarr")
    l5dask.synthesize(path, num_scenes=3, seed=9, label_ties=0.4, chunk_rows={fmt.AGENTS: 3_000})
    probs = read_all(path)["agents"]["label_probabilities"]
    top = probs.max(1, keepdims=True)
    assert ((probs == top).sum(1) > 1).mean() > 0.2  # the data has ties, two-way and all-equal
    rep = check(path)
    assert rep["agents"]["label_counts"]["PERCEPTION_LABEL_NOT_SET"] > 0  # all-equal rows go to label 0


def test_report_default_chunks_and_grouped_tasks(default_ds, small_ds):
    check(default_ds)
    check(small_ds, chunks_per_task=3)


def test_the_report_is_the_same_bits_whatever_its_tasks(tmp_path, monkeypatch):
    """The speed sum is each stored chunk's, added exactly: tasks of any size, any number of
    stored chunks a call, the sync scheduler or threads give the same report, bit for bit (before,
    the float sum's order followed the tasks)."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from l5dask.prediction import reading
    from l5dask.prediction.stats import exact_add, exact_merge, exact_total

    path = str(tmp_path / "d.zarr")
    l5dask.synthesize(path, num_scenes=6, seed=5, chunk_rows={fmt.AGENTS: 1_000, fmt.FRAMES: 200})
    want = public(compute_report(path, scheduler="sync", chunks_per_task=1))
    for group, per_task, scheduler in [(1, 5, None), (2, 3, "sync"), (3, 7, None), (4, 64, None)]:
        monkeypatch.setattr(reading, "PIECE_ROWS", group * 1_000)  # (the agents' chunks of 1,000 rows)
        assert public(compute_report(path, scheduler=scheduler, chunks_per_task=per_task)) == want

    # (speeds are at most float32's largest times sqrt 2: sums far within float64's range)
    floats = st.one_of(st.floats(-1e300, 1e300, width=64), st.sampled_from([math.inf, -math.inf, math.nan]))

    @settings(max_examples=300, deadline=None)
    @given(st.lists(floats, max_size=40), st.integers(0, 40), st.randoms())
    def same_in_any_order(values, cut, rnd):
        exact = math.fsum(v for v in values if math.isfinite(v))
        special = sum((v for v in values if not math.isfinite(v)), 0.0)
        shuffled = list(values)
        rnd.shuffle(shuffled)
        a, b = exact_add((), shuffled[:cut]), exact_add((), shuffled[cut:])
        for got in (exact_total(exact_add((), values)), exact_total(exact_merge(b, a))):
            if math.isnan(special) or special:
                assert math.isnan(got) if math.isnan(special) else got == special
            else:
                assert got == exact  # (fsum: the exact sum, rounded once)

    same_in_any_order()


def test_floats_are_the_same_bits_whatever_the_task_groups(tmp_path):
    """Every float of the report (the ego's distance in all and per scene, its mean speed, the
    agents' mean speed) and of the catalog is the same bits however the stored chunks are grouped
    into tasks: scenes that straddle frame chunks of 37 rows, tasks of 1, 2, 3, 5 and 64 chunks
    (as a remote and a local run, or a dataset before and after it grew, group them). Before, the
    ego's sums were added task by task: 1.406194018201451 km in tasks of one chunk, ...4514 in
    tasks of two."""
    from l5dask.prediction.catalog import catalog_table

    path = str(tmp_path / "d.zarr")
    l5dask.synthesize(path, num_scenes=8, seed=5, chunk_rows={fmt.AGENTS: 1_000, fmt.FRAMES: 37})
    ds = l5dask.open_dataset(path)
    assert ds[fmt.FRAMES].nchunks > 40  # (many pairs of frames across two chunks, and scenes across many)
    want = public(compute_report(path, scheduler="sync", chunks_per_task=1))
    want_catalog = catalog_table(path, scheduler="sync", chunks_per_task=1).to_pydict()
    for per_task in (2, 3, 5, 64):
        got = public(compute_report(path, scheduler="sync", chunks_per_task=per_task))
        assert json.dumps(got) == json.dumps(want), per_task  # (bit for bit: repr of each float)
        got_catalog = catalog_table(path, scheduler="sync", chunks_per_task=per_task).to_pydict()
        assert json.dumps(got_catalog, default=str) == json.dumps(want_catalog, default=str), per_task
    # and still the definition: the numpy computation to 1e-9
    assert_report_equal(want, reference_report(read_all(path), fmt.LABELS))


def test_one_scene(tmp_path):
    path = str(tmp_path / "one.zarr")
    l5dask.synthesize(path, num_scenes=1, seed=2, chunk_rows={fmt.AGENTS: 4_000, fmt.FRAMES: 50})
    rep = check(path)
    assert rep["counts"]["scenes"] == 1 and len(rep["per_scene"]["num_tracks"]) == 1


def test_no_traffic_lights(tmp_path):
    path = str(tmp_path / "old.zarr")
    l5dask.synthesize(path, num_scenes=2, seed=3, traffic_lights=False, chunk_rows={fmt.AGENTS: 6_000})
    with pytest.warns(RuntimeWarning):
        rep = compute_report(path)
    want = reference_report(read_all(path), fmt.LABELS)
    assert_report_equal(public(rep), want)
    assert rep["counts"]["tl_faces"] == 0 and rep["tl_faces"]["status_counts"] == {
        "ACTIVE": 0,
        "INACTIVE": 0,
        "UNKNOWN": 0,
    }


def test_empty_arrays(tmp_path):
    path = str(tmp_path / "empty.zarr")
    l5dask.synthesize(path, num_scenes=0)
    rep = check(path)
    assert rep["summary"]["frame_frequency_hz"] == 10.0
    assert rep["agents"]["speed_mps"]["histogram"]["counts"] == [0] * 101
    assert rep["agents"]["distance_to_ego_m"]["histogram"]["counts"] == [0] * 41


def test_one_pass_reads_each_chunk_once(small_ds, monkeypatch):
    """Every stored chunk is read once (the agents' gathered from their bytes, the others decoded),
    the frames too: their pass holds the join rows the agent tasks take (small: within
    ``HELD_ROWS_BYTES``, beyond which they are made again and the frames read twice)."""
    import l5dask.prediction.reading as reading
    from l5dask.core.store import Store

    reads, decodes = [], []
    get, get_into = Store.get, Store.get_into  # (on a local disk every read ends in one of them)
    monkeypatch.setattr(  # (whole reads: opening reads the header of each array's last chunk)
        Store, "get", lambda self, key, **kw: (kw.get("end") is None and reads.append(key)) or get(self, key, **kw)
    )
    monkeypatch.setattr(
        Store, "get_into", lambda self, key, *a, **kw: reads.append(key) or get_into(self, key, *a, **kw)
    )
    original = reading.decode_chunk
    monkeypatch.setattr(reading, "decode_chunk", lambda *a, **kw: decodes.append(a[1].name) or original(*a, **kw))
    compute_report(small_ds)
    ds = l5dask.open_dataset(small_ds)
    chunks = [k for k in reads if not k.rsplit("/", 1)[-1].startswith(".")]
    want = [ds[n].meta.key(i) for n in ds.arrays for i in range(ds[n].meta.nchunks)]
    assert sorted(chunks) == sorted(want)
    assert fmt.AGENTS not in decodes  # gathered, never decoded into records


def test_scene_table(small_ds, tmp_path):
    out = tmp_path / "scenes.parquet"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "l5dask.cli",
            "stats",
            small_ds,
            "--output",
            str(tmp_path / "r.json"),
            "--scenes-table",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    assert "Num Scenes" in r.stdout and "PERCEPTION_LABEL_CAR" in r.stdout
    t = pq.read_table(out).to_pandas()
    d = read_all(small_ds)
    sc, fr = d["scenes"], d["frames"]
    siv = sc["frame_index_interval"]
    assert list(t.scene_index) == list(range(len(sc)))
    assert list(t.host) == list(sc["host"])
    assert list(t.num_frames) == list(siv[:, 1] - siv[:, 0])
    np.testing.assert_allclose(t.duration_s, (fr["timestamp"][siv[:, 1] - 1] - fr["timestamp"][siv[:, 0]]) / 1e9)
    tiv = fr["traffic_light_faces_index_interval"]
    assert list(t.num_tl_faces) == [int(tiv[e - 1, 1] - tiv[s, 0]) for s, e in siv]
    report = json.loads((tmp_path / "r.json").read_text())
    assert list(t.num_tracks) == report["per_scene"]["num_tracks"]
    np.testing.assert_allclose(t.ego_distance_m, report["per_scene"]["ego_distance_m"], rtol=1e-12)


def test_joins_match_numpy(small_ds):
    d = read_all(small_ds)
    sc, fr, tl = d["scenes"], d["frames"], d["traffic_light_faces"]
    scene_of_frame = np.repeat(np.arange(len(sc)), np.diff(sc["frame_index_interval"], axis=1).ravel())
    frame_of_agent = np.repeat(np.arange(len(fr)), np.diff(fr["agent_index_interval"], axis=1).ravel())
    frame_of_face = np.repeat(np.arange(len(fr)), np.diff(fr["traffic_light_faces_index_interval"], axis=1).ravel())
    j = Joins(l5dask.open_dataset(small_ds))
    np.testing.assert_array_equal(j.frame_scene().compute(), scene_of_frame)
    np.testing.assert_array_equal(j.agent_frame().compute(), frame_of_agent)
    np.testing.assert_array_equal(j.agent_scene().compute(), scene_of_frame[frame_of_agent])
    assert len(frame_of_face) == len(tl)
    np.testing.assert_array_equal(j.tl_face_frame().compute(), frame_of_face)
    np.testing.assert_array_equal(j.tl_face_scene().compute(), scene_of_frame[frame_of_face])
    np.testing.assert_array_equal(
        j.agent_frame_field("ego_translation").compute(), fr["ego_translation"][frame_of_agent]
    )
    x = j.agent_frame()
    assert x.chunks == l5dask.open_dataset(small_ds)["agents"].to_dask().chunks


def test_lazy_join_graph_holds_one_frames_pass(small_ds):
    j = Joins(l5dask.open_dataset(small_ds))
    j.declare("agents", ["index", "timestamp"])
    x, t = j.agent_frame(), j.agent_frame_field("timestamp")
    graph = dict(x.__dask_graph__())  # built now, nothing run (tests/test_laziness.py checks that)
    held = [k for k in graph if len(k) == 1 and k[0].startswith("l5-frames-join-held")]
    blocks = [k for k in graph if len(k) == 2 and k[0].startswith("l5-frames-join-held")]
    assert len(held) == 1 and len(blocks) > 1
    assert set(graph[held[0]].dependencies) == set(blocks)  # every frame block, once
    for key in x.__dask_keys__():
        assert set(graph[key].dependencies) == set(held)
    # the joins declared together share the pass: computed together, each frame chunk decoded once
    assert held[0] in dict(t.__dask_graph__())


def test_eager_join_tasks_get_only_overlapping_frame_blocks(small_ds):
    from l5dask.core.engine import Job
    from l5dask.prediction.columns import Table
    from l5dask.prediction.joins import parent_link

    ds = l5dask.open_dataset(small_ds)
    selection = Table(ds, "agents").select(["timestamp"])
    link = parent_link(ds, selection, Job(chunks_per_task=1))  # persists the frames pass now
    persisted = link.parent
    src = ds["agents"]
    for i in range(src.nchunks):
        lo, hi = src.chunk_bounds(i)
        refs = persisted.refs(link.interval, lo, hi)
        assert 1 <= len(refs) <= 3 < len(persisted.keys)


def _break_intervals(src, dest, array, field, row, value):
    shutil.copytree(src, dest)
    ds = l5dask.open_dataset(dest)
    arrays = {n: ds[n].to_dask().compute() for n in ds.arrays}
    arrays[array][field][row] = value
    l5dask.write_dataset(dest, arrays, overwrite=True, chunk_rows={n: a.meta.chunk_rows for n, a in ds.arrays.items()})


@pytest.mark.parametrize(
    "row,value,why",
    [
        (700, [0, 0], "not contiguous"),  # a frame that jumps back
        (400, [50_000, 49_000], "not increasing"),
        (-1, [10**9, 10**9 + 5], "outside the child array"),
        (0, [3, 3], r"starts at 3, expected 0 \(the first row starts the child array\)"),  # (no previous row)
    ],
)
def test_bad_intervals_name_array_and_first_row(small_ds, tmp_path, row, value, why):
    dest = str(tmp_path / "bad.zarr")
    _break_intervals(small_ds, dest, fmt.FRAMES, "agent_index_interval", row, value)
    n = len(read_all(dest)["frames"])
    with pytest.raises(IntervalError, match=rf"frames.agent_index_interval: row {row % n}: .*{why}"):
        compute_report(dest)
    with pytest.raises(IntervalError, match=r"frames.agent_index_interval: row"):
        Joins(l5dask.open_dataset(dest)).agent_frame().compute()  # lazy: raises when computed
    r = subprocess.run([sys.executable, "-m", "l5dask.cli", "validate", dest], capture_output=True, text=True)
    assert r.returncode == 1 and f"row {row % n}" in r.stdout
    out = tmp_path / "report.json"
    r = subprocess.run(
        [sys.executable, "-m", "l5dask.cli", "stats", dest, "--output", str(out), "--quiet"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "agent_index_interval" in r.stderr and "Traceback" not in r.stderr
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".report")]


def test_validate_ok(small_ds):
    r = subprocess.run([sys.executable, "-m", "l5dask.cli", "validate", small_ds], capture_output=True, text=True)
    assert r.returncode == 0 and "no faults" in r.stdout


def test_failed_report_keeps_previous_file(small_ds, tmp_path):
    dest = tmp_path / "c.zarr"
    shutil.copytree(small_ds, dest)
    (dest / "agents" / "1").write_bytes(b"\x00" * 40)
    out = tmp_path / "report.json"
    out.write_text('{"previous": true}')
    r = subprocess.run(
        [sys.executable, "-m", "l5dask.cli", "stats", str(dest), "--output", str(out), "--quiet"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "chunk '1'" in r.stderr
    assert json.loads(out.read_text()) == {"previous": True}
    assert [p.name for p in tmp_path.iterdir() if "partial" in p.name] == []


def test_binning_is_exact_at_edges_and_overflow():
    from l5dask.prediction.stats import DISTANCE_EDGES, SPEED_EDGES, histogram

    rng = np.random.default_rng(0)
    for edges in (SPEED_EDGES, DISTANCE_EDGES):
        e = np.repeat(edges, 3)
        v = np.concatenate(
            [
                np.nextafter(e, -np.inf),
                e,
                np.nextafter(e, np.inf),
                rng.uniform(0, edges[-1] * 1.3, 5000),
                [np.inf, 1e300, 0.0],
            ]
        )
        v = v[v >= 0]
        want = [int(((v >= lo) & (v < hi)).sum()) for lo, hi in zip(edges[:-1], edges[1:])] + [
            int((v >= edges[-1]).sum())
        ]
        assert histogram(v, edges).tolist() == want
        # (NaN is in no bin: not >= the last edge, as the contract says; it was counted there)
        assert histogram(np.r_[v, np.nan, np.nan], edges).tolist() == want


def _edited(tmp_path, edit) -> str:
    """A generated dataset whose arrays ``edit`` changed (in place), written again."""
    src, path = str(tmp_path / "src.zarr"), str(tmp_path / "edited.zarr")
    l5dask.synthesize(src, num_scenes=2, seed=6, chunk_rows={fmt.FRAMES: 40, fmt.AGENTS: 900})
    ds = l5dask.open_dataset(src)
    arrays = {n: ds[n].to_dask().compute() for n in ds.arrays}
    edit(arrays)
    l5dask.write_dataset(path, arrays, chunk_rows={n: a.meta.chunk_rows for n, a in ds.arrays.items()})
    return path


def _stats(path: str, out) -> tuple[dict, list[str]]:
    r = subprocess.run(
        [sys.executable, "-m", "l5dask.cli", "stats", path, "-o", str(out), "-q"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    return json.loads(out.read_text()), r.stderr.splitlines()


def test_nan_speeds_and_distances_are_in_no_bin_and_said(tmp_path):
    """Agents whose speed or distance to the ego is NaN: counted in no bin of their histograms
    (they were counted as ">= 50 m/s" and ">= 200 m"), and said in one line each."""

    def edit(a):
        a[fmt.AGENTS]["velocity"][[3, 1500]] = np.nan
        a[fmt.AGENTS]["centroid"][7, 0] = np.nan

    path = _edited(tmp_path, edit)
    want = reference_report(read_all(path), fmt.LABELS)
    report, lines = _stats(path, tmp_path / "r.json")
    for key in ("speed_mps", "distance_to_ego_m"):
        assert report["agents"][key]["histogram"] == want["agents"][key]["histogram"], key
    n = report["counts"]["agents"]
    assert sum(report["agents"]["speed_mps"]["histogram"]["counts"]) == n - 2
    assert sum(report["agents"]["distance_to_ego_m"]["histogram"]["counts"]) == n - 1
    assert report["agents"]["speed_mps"]["mean"] is None
    assert lines == [
        "l5dask: warning: 2 agent(s) have a speed that is not a number (a NaN velocity: agents.speed_mps.mean "
        "is null): its histogram counts no bin for them",
        "l5dask: warning: 1 agent(s) have a distance to its ego that is not a number (a NaN centroid or ego "
        "position): its histogram counts no bin for them",
    ]


def test_a_median_frame_step_of_0_ns_is_said_and_its_frequency_null(tmp_path):
    """At least half the steps between frames repeat a timestamp: the frame frequency, 1e9 over
    the median step, is not finite (null), said in one line (it was a ZeroDivisionError)."""

    def edit(a):
        a[fmt.FRAMES]["timestamp"][:] = a[fmt.FRAMES]["timestamp"][0]

    path = _edited(tmp_path, edit)
    report, lines = _stats(path, tmp_path / "r.json")
    assert report["summary"]["frame_frequency_hz"] is None
    assert report["summary"]["total_time_hours"] == 0.0 and report["summary"]["avg_scene_time_s"] == 0.0
    assert lines[0].startswith("l5dask: warning: the median step between consecutive frames of a scene is 0 ns")
    assert "frame_frequency_hz is not finite (null in the report)" in lines[0]


def test_stats_imports_only_what_it_uses(small_ds, tmp_path):
    """The embedded default runs without distributed, xarray, dask.array or pandas: importing them
    cost more than half a second of a report's process (figures in the closing notes of issue 3)."""
    code = (
        "import sys; from l5dask.cli import main; "
        f"main(['stats', {str(small_ds)!r}, '-q', '--output', {str(tmp_path / 'r.json')!r}], standalone_mode=False); "
        "print(sorted(m for m in ('distributed', 'xarray', 'dask.array', 'pandas', 'numba') if m in sys.modules))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "[]"
    assert json.loads((tmp_path / "r.json").read_text())["counts"]["agents"] > 0


@pytest.mark.parametrize("back", [0, 30_000_000], ids=["repeated", "going back"])
def test_a_timestamp_repeated_or_going_back_is_said_once_and_the_mean_speed_is_its_definitions(tmp_path, back):
    """A new user's dataset with one frame's timestamp repeated: the report's ego mean speed is
    the definition's (a step over 0 s: not finite, null in the JSON), with one line that says why,
    not numpy's "divide by zero"; a timestamp going back gives the definition's finite mean."""
    src, path = str(tmp_path / "src.zarr"), str(tmp_path / "d.zarr")
    l5dask.synthesize(src, num_scenes=3, seed=4, chunk_rows={fmt.FRAMES: 40})
    ds = l5dask.open_dataset(src)
    arrays = {n: ds[n].to_dask().compute() for n in ds.arrays}
    ts = arrays[fmt.FRAMES]["timestamp"]
    ts[10] = ts[9] - back  # (frames 9 and 10: one scene's, within one stored chunk)
    ts[40] = ts[39] - back  # (39 and 40: across the seam of two stored chunks of 40 frames)
    l5dask.write_dataset(path, arrays, chunk_rows={n: a.meta.chunk_rows for n, a in ds.arrays.items()})
    frames, scene_of = (
        arrays[fmt.FRAMES],
        np.repeat(
            np.arange(len(arrays[fmt.SCENES])), np.diff(arrays[fmt.SCENES]["frame_index_interval"], axis=1)[:, 0]
        ),
    )
    same = scene_of[1:] == scene_of[:-1]
    xy = frames["ego_translation"][:, :2].astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        speeds = (np.sqrt(((xy[1:] - xy[:-1]) ** 2).sum(1)) / ((ts[1:] - ts[:-1]) / 1e9))[same]
    want = float(speeds.mean())
    assert (math.isfinite(want)) == (back > 0)
    out = tmp_path / "r.json"
    r = subprocess.run(
        [sys.executable, "-m", "l5dask.cli", "stats", path, "-o", str(out), "-q"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("l5dask: warning: 2 pair(s) of consecutive frames"), r.stderr
    assert "divide" not in r.stderr and ("not finite (null" in r.stderr) == (back == 0)
    got = json.loads(out.read_text())["ego"]["mean_speed_mps"]
    if back:
        assert got == pytest.approx(want, rel=1e-12)
    else:
        assert got is None
