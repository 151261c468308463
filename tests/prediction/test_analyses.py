"""Many analyses of one dataset in one pass (``l5dask.analyze``, ``Job.run``): each result bit for
bit the analysis run alone (several chunks a task and several tasks, threads and a real cluster),
each stored chunk read once (counted at the store), bad input refused before any chunk is read."""

from __future__ import annotations

import collections
import math
import operator

import numpy as np
import pandas as pd
import pytest

import l5dask
from l5dask.core.engine import Job, Pass, Plan, Reduction
from l5dask.core.store import Store
from l5dask.errors import UsageError
from l5dask.prediction import format as fmt
from l5dask.prediction.analyses import Aggregate, Catalog, Report, analyze
from l5dask.prediction.report import compute_report

CHUNKS = {fmt.SCENES: 2, fmt.FRAMES: 40, fmt.AGENTS: 700, fmt.TL_FACES: 300}

#: Aggregations over every array, with parent columns (scene, host, hour, ego distance), a where,
#: float sums (whose bits follow the grouping of chunks into tasks) and quantiles.
AGGREGATIONS = {
    "speed": Aggregate(by=["scene_index", "label"], values={"speed": ["mean", "var", "max", "sum"]}),
    "near": Aggregate(by=["host", "hour", "label"], values={"agent_index": ["count"]}, where="distance_to_ego < 20"),
    "extent": Aggregate(by=["label"], values={"extent_length": ["q50", "q90", "mean"]}),
    "frames": Aggregate("frames", by=["scene_index"], values={"timestamp": ["min", "max"], "ego_x": ["sum", "mean"]}),
    "faces": Aggregate("tl_faces", by=["status", "scene_index"], values={"ego_x": ["mean"]}),
    "scenes": Aggregate("scenes", by=["host"], values={"num_frames": ["sum", "mean"]}),
}


@pytest.fixture(scope="module")
def ds(tmp_path_factory) -> str:
    """Many small chunks of every array (scenes cut across frame and agent chunks)."""
    path = str(tmp_path_factory.mktemp("analyses") / "d.zarr")
    l5dask.synthesize(path, num_scenes=9, seed=11, chunk_rows=CHUNKS)
    return path


def same(a, b, where: str = "") -> None:
    """Bit for bit: dicts, sequences, arrays (NaN where NaN), floats by their bits, DataFrames exactly."""
    if isinstance(a, pd.DataFrame):
        pd.testing.assert_frame_equal(a, b, check_exact=True)
        assert a.attrs == b.attrs, where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}[{i}]")
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert a.tobytes() == b.tobytes(), where
    elif isinstance(a, float):
        assert isinstance(b, float) and (
            math.isnan(a) and math.isnan(b) or np.float64(a).tobytes() == np.float64(b).tobytes()
        ), (
            where,
            a,
            b,
        )
    else:
        assert a == b, (where, a, b)


def alone(path: str, name: str, analysis, **kw):
    """The analysis run by its own function."""
    if isinstance(analysis, Report):
        return compute_report(path, **kw)
    if isinstance(analysis, Catalog):
        return l5dask.catalog(path, tz=analysis.tz, **kw)
    a = analysis
    return l5dask.aggregate(path, a.array, by=a.by, values=a.values, where=a.where, quantile_bits=a.quantile_bits, **kw)


ALL = {"report": Report(), "catalog": Catalog(tz="Europe/London"), **AGGREGATIONS}


@pytest.mark.parametrize("kw", [{}, {"chunks_per_task": 3}, {"scheduler": "sync", "chunks_per_task": 1}])
def test_each_result_is_the_analysis_alone(ds, kw):
    """Every analysis run together with all the others gives the bits of its own function."""
    got = analyze(ds, ALL, **kw)
    assert list(got) == list(ALL)
    for name, analysis in ALL.items():
        same(got[name], alone(ds, name, analysis, **kw), name)


def test_an_ego_position_of_nan_is_fused_as_each_analysis_reads_it(tmp_path):
    """The report's and the catalog's frame rows, fused, keep one ego position column: NaN where
    NaN is the same column (the fused run refused it as two different ones, where each analysis
    alone and the CLI's run answered)."""
    from tests.conftest import read_all

    base = str(tmp_path / "base.zarr")
    l5dask.synthesize(base, num_scenes=4, seed=3, chunk_rows=CHUNKS)
    arrays = read_all(base)
    frames = arrays[fmt.FRAMES].copy()
    frames["ego_translation"][[5, 90], 0] = np.nan
    arrays[fmt.FRAMES] = frames
    path = str(tmp_path / "nan.zarr")
    l5dask.write_dataset(path, arrays, chunk_rows=CHUNKS)
    analyses = {"report": ALL["report"], "catalog": ALL["catalog"]}
    got = analyze(path, analyses)
    for name, a in analyses.items():
        same(got[name], alone(path, name, a), name)


def test_subsets_and_repeats(ds):
    """Any subset, and one analysis twice under two names: the same results."""
    want = {name: alone(ds, name, a) for name, a in ALL.items()}
    for names in (["report"], ["catalog", "speed"], ["speed", "extent", "near"], ["frames", "report"]):
        got = analyze(ds, {n: ALL[n] for n in names})
        for n in names:
            same(got[n], want[n], n)
    got = analyze(ds, {"a": ALL["speed"], "b": ALL["speed"]})
    same(got["a"], want["speed"])
    same(got["b"], want["speed"])


@pytest.fixture
def reads(monkeypatch):
    """Every stored key read through a store in this process, counted."""
    counts: collections.Counter = collections.Counter()
    original = Store.iter_many

    def iter_many(self, keys, *args, **kwargs):
        keys = list(keys)
        counts.update(keys)
        return original(self, keys, *args, **kwargs)

    monkeypatch.setattr(Store, "iter_many", iter_many)
    return counts


def chunk_reads(counts: collections.Counter, array: str) -> dict[str, int]:
    return {k: n for k, n in counts.items() if k.startswith(f"{array}/") and not k.rsplit("/", 1)[1].startswith(".")}


def test_each_chunk_is_read_once(ds, reads):
    """The report, the catalog and five aggregations (over agents, faces and scenes): each stored
    chunk of the scenes, agents and faces read once; the frames as often as for the report alone
    (once: the pass holds the rows its children's tasks take), with an aggregation
    over the frames too: the report's frames reduction is exact (its floats do not follow the
    tasks), so it takes the aggregation's groups of chunks (it read them once more before)."""
    ds_ = l5dask.open_dataset(ds)
    compute_report(ds_)
    report_frames = chunk_reads(reads, fmt.FRAMES)
    assert set(report_frames.values()) == {1} and len(report_frames) == ds_[fmt.FRAMES].nchunks
    for extra in ([], ["frames"]):
        reads.clear()
        analyze(ds_, {n: a for n, a in ALL.items() if n != "frames" or extra})
        for array in (fmt.SCENES, fmt.AGENTS, fmt.TL_FACES):
            got = chunk_reads(reads, array)
            assert len(got) == ds_[array].nchunks, array
            assert set(got.values()) == {1}, (array, collections.Counter(got.values()))
        assert chunk_reads(reads, fmt.FRAMES) == report_frames


def test_each_chunk_is_decoded_once(ds, monkeypatch):
    """The report, the catalog and three aggregations of agents gather all their numbers from each
    stored agent chunk in one pass over its compressed bytes (five separate calls: five passes)."""
    from l5dask.prediction.kernels import Gather

    passes: collections.Counter = collections.Counter()
    original = Gather.blosc

    def blosc(self, raw, *args, **kwargs):
        passes[bytes(raw)] += 1
        return original(self, raw, *args, **kwargs)

    monkeypatch.setattr(Gather, "blosc", blosc)
    ds_ = l5dask.open_dataset(ds)
    names = ("report", "catalog", "speed", "near", "extent")
    analyze(ds_, {n: ALL[n] for n in names})
    agents = {
        bytes(raw) for raw in ds_.store.iter_many([ds_[fmt.AGENTS].meta.key(i) for i in range(ds_[fmt.AGENTS].nchunks)])
    }
    faces = {
        bytes(raw)
        for raw in ds_.store.iter_many([ds_[fmt.TL_FACES].meta.key(i) for i in range(ds_[fmt.TL_FACES].nchunks)])
    }
    assert {passes[raw] for raw in agents} == {1}
    # the faces' ids, codes and statuses too: the report's and the catalog's gathered once
    assert {passes[raw] for raw in faces} == {1}
    passes.clear()
    for n in names:
        alone(ds_, n, ALL[n])
    assert {passes[raw] for raw in agents} == {len(names)}
    assert {passes[raw] for raw in faces} == {2}


@pytest.mark.parametrize("report_first", [True, False])
def test_aggregations_take_the_speed_and_distance_the_reports_loop_made(ds, monkeypatch, report_first):
    """Fused with the report, the aggregations of ``speed`` and ``distance_to_ego`` take the columns
    the report's agents loop made of each block (``Reduction.provides``: it runs first whatever
    the analyses' order) and make neither again; each result is still the analysis alone, bit for
    bit. Without the report, they make them (the same bits)."""
    from l5dask.prediction import columns

    want = {n: alone(ds, n, ALL[n]) for n in ("report", "speed", "near")}
    made: collections.Counter = collections.Counter()
    for name in ("norm2", "distance_to_parent", "distance_to_runs"):
        original = getattr(columns, name)
        monkeypatch.setattr(columns, name, lambda *a, _f=original, _n=name: (made.update([_n]), _f(*a))[1])
    names = ["report", "speed", "near"] if report_first else ["speed", "near", "report"]
    got = analyze(ds, {n: ALL[n] for n in names})
    for n in names:
        same(got[n], want[n], n)
    assert made == {}
    got = analyze(ds, {n: ALL[n] for n in ("speed", "near")})
    for n in ("speed", "near"):
        same(got[n], want[n], n)
    assert made["norm2"] > 0 and made["distance_to_parent"] + made["distance_to_runs"] > 0


@pytest.mark.parametrize("report_first", [True, False])
def test_the_catalog_takes_the_distances_the_reports_loop_made(ds, monkeypatch, report_first):
    """Fused with the report, the catalog's agents loop takes each row's distance to its ego from
    the report's loop (every call of it given the column) instead of making it again; the catalog
    (and the report) still the analysis alone, bit for bit. Alone, or with aggregations only, it
    makes them (given none)."""
    from l5dask.prediction import catalog

    want = {n: alone(ds, n, ALL[n]) for n in ("report", "catalog", "near")}
    given: list = []
    original = catalog.catalog_agents

    def catalog_agents(*args):
        given.append(args[13] if len(args) > 13 else None)
        return original(*args)

    monkeypatch.setattr(catalog, "catalog_agents", catalog_agents)
    names = ["report", "catalog", "near"] if report_first else ["near", "catalog", "report"]
    got = analyze(ds, {n: ALL[n] for n in names})
    for n in names:
        same(got[n], want[n], n)
    assert given and all(d is not None for d in given)
    given.clear()
    got = analyze(ds, {n: ALL[n] for n in ("catalog", "near")})
    for n in ("catalog", "near"):
        same(got[n], want[n], n)
    assert given and all(d is None for d in given)


@pytest.mark.parametrize("kw", [{}, {"chunks_per_task": 3}, {"scheduler": "sync", "chunks_per_task": 1}])
def test_the_report_counts_tracks_with_the_runs_the_catalog_left(ds, monkeypatch, kw):
    """Fused with the catalog, the report's distinct tracks of each scene's run are the catalog's
    (``Reduction.leaves``, the report's partial finished after it: ``engine.Later``), whatever the
    analyses' order: its own loop (``track_runs``) never runs on a block the catalog took whole,
    and both are still the analysis alone, bit for bit (scenes cut across chunks and tasks). A
    block the catalog left nothing for (the report alone, or with aggregations only): counted by
    its own loop."""
    from l5dask.prediction import stats

    want = {n: alone(ds, n, ALL[n], **kw) for n in ("report", "catalog")}
    counted: list = []
    original = stats.track_runs
    monkeypatch.setattr(stats, "track_runs", lambda *a: counted.append(len(a[0])) or original(*a))
    for names in (["report", "catalog", "near"], ["catalog", "report"]):
        got = analyze(ds, {n: ALL[n] for n in names}, **kw)
        for n in ("report", "catalog"):
            same(got[n], want[n], n)
        assert counted == []
    got = analyze(ds, {n: ALL[n] for n in ("report", "near")}, **kw)
    same(got["report"], want["report"], "report")
    assert counted and sum(counted) == l5dask.open_dataset(ds)[fmt.AGENTS].meta.length


def test_a_later_partial_is_finished_when_its_block_is_streamed():
    """A member's partial that waits for what another leaves (``engine.Later``) is finished before
    it is combined where its pass streams pieces, and after every member where it takes the block
    whole: the fused partials never hold one."""
    from l5dask.core.engine import Later, Member, fused_reduction

    order: list = []

    class Source:
        nchunks = 2

        def chunk_bounds(self, i):
            return (2 * i, 2 * i + 2)

    def waits(data, start, parent):
        order.append(("waits", start))
        return Later(lambda: order.append(("finished", start)) or len(data))

    def other(data, start, parent):
        order.append(("other", start))
        return len(data)

    red = Reduction("waits", waits, operator.add, int, exact=True)
    whole = fused_reduction(
        [Member(red, True, False), Member(Reduction("o", other, operator.add, int), True, False)], Source()
    )
    assert whole.chunk(np.zeros(4), 0, None) == (4, 4)
    assert order == [("waits", 0), ("other", 0), ("finished", 0)]
    order.clear()
    streamed = fused_reduction([Member(red, False, False)], Source())
    assert streamed.chunk(np.zeros(4), 0, None) == (4,)
    assert order == [("waits", 0), ("finished", 0), ("waits", 2), ("finished", 2)]


def test_a_derived_column_written_in_part_is_not_taken(ds, monkeypatch):
    """A block's column made by the pieces of only some of its rows is not handed out (``None``:
    the reader makes its own), nor one no reader expects."""
    from l5dask.prediction import reading

    source = l5dask.open_dataset(ds)[fmt.AGENTS]
    monkeypatch.setattr(reading, "PIECE_ROWS", source.meta.chunk_rows)  # (a chunk a piece)
    block = source.read_encoded(0, 4)
    assert block.derived_out("speed") is None  # (nobody expects it: not made)
    block.expect((), ("label_probabilities",), (), ("speed",))
    pieces = block.pieces()
    assert len(pieces) > 1
    first = pieces[0][1].derived_out("speed")
    first[:] = 1.0
    assert block.derived("speed") is None and pieces[0][1].derived("speed") is None
    for _, piece in pieces[1:]:
        piece.derived_out("speed")[:] = 2.0
    whole = block.derived("speed")
    assert len(whole) == len(block) and not whole.flags.writeable
    np.testing.assert_array_equal(pieces[1][1].derived("speed"), 2.0)


def test_a_fused_block_is_freed_when_its_task_ends(ds):
    """What a fused task gathered of its block goes with it: its pieces are the task's, not kept by
    the block (a piece refers to its block: the two in a cycle kept every block of a pass, 13 MB
    of gathered columns each, until the garbage collector ran; a run's peak RSS doubled)."""
    import gc
    import weakref

    from l5dask.core.engine import Member, fused_chunk

    source = l5dask.open_dataset(ds)[fmt.AGENTS]
    labels = []

    def chunk(piece, start, parent):
        labels.append(len(piece.gather([], ["label_probabilities"])[1][0]))
        return 0

    red = Reduction("labels", chunk, lambda a, b: a + b, lambda: 0, reads=((), ("label_probabilities",)))
    members = (Member(red, False, True), Member(red, False, True))
    block = source.read_encoded(0, min(4, source.nchunks))
    alive = weakref.ref(block)
    enabled = gc.isenabled()
    gc.disable()
    try:
        fused_chunk(members, source, block, 0, None)
        del block
        assert alive() is None
    finally:
        if enabled:
            gc.enable()
    assert sum(labels) == 2 * sum(b - a for a, b in map(source.chunk_bounds, range(min(4, source.nchunks))))


def test_an_exact_member_takes_a_fused_block_whole(ds, monkeypatch):
    """In a fused task, a streaming member whose reduction is exact and whose gathers the block
    serves is handed the block whole (one call, no combine); one that is not exact still takes the
    block's pieces (a float sum's bits follow them); the report and the catalog with aggregations
    are still their functions' results bit for bit (the test above)."""
    from l5dask.core.engine import Member, fused_chunk
    from l5dask.prediction import reading

    source = l5dask.open_dataset(ds)[fmt.AGENTS]
    monkeypatch.setattr(reading, "PIECE_ROWS", source.meta.chunk_rows)  # (a chunk a piece)
    calls: dict[str, list] = {"exact": [], "float": []}

    def chunk(name, piece, start, parent):
        calls[name].append((start, len(piece)))
        return len(piece.gather([], ["label_probabilities"])[1][0])

    def red(name, exact):
        return Reduction(
            name,
            lambda p, s, q: chunk(name, p, s, q),
            lambda a, b: a + b,
            lambda: 0,
            exact=exact,
            reads=((), ("label_probabilities",)),
        )

    members = (Member(red("exact", True), False, True), Member(red("float", False), False, True))
    block = source.read_encoded(0, min(5, source.nchunks))
    pieces = block.pieces()
    assert len(pieces) > 1
    got = fused_chunk(members, source, block, 0, None)
    assert got == (len(block), len(block))
    assert calls["exact"] == [(0, len(block))]
    assert calls["float"] == [(lo, len(p)) for lo, p in pieces]


@pytest.mark.parametrize("kw", [{}, {"chunks_per_task": 3}])
def test_members_that_all_stream_are_fused_into_a_streaming_pass(ds, monkeypatch, kw):
    """The report and the catalog (both streaming over encoded pieces) fused: their pass streams
    the pieces as each of them alone does, and holds no block of encoded chunks whole (a block
    of 32 chunks and its gathered columns doubled the run's page faults); each result still the
    analysis alone, bit for bit. With an aggregation (which takes its block whole), blocks again."""
    from l5dask.prediction import reading

    want = {n: alone(ds, n, ALL[n], **kw) for n in ("report", "catalog", "speed")}
    blocks: list = []
    original = reading.L5Array.read_encoded

    def read_encoded(self, first, n):
        blocks.append((self.meta.name, first, n))
        return original(self, first, n)

    monkeypatch.setattr(reading.L5Array, "read_encoded", read_encoded)
    got = analyze(ds, {n: ALL[n] for n in ("report", "catalog")}, **kw)
    for n in ("report", "catalog"):
        same(got[n], want[n], n)
    assert blocks == []
    got = analyze(ds, {n: ALL[n] for n in ("report", "catalog", "speed")}, **kw)
    for n in ("report", "catalog", "speed"):
        same(got[n], want[n], n)
    assert {name for name, _, _ in blocks} == {fmt.AGENTS}


def test_five_separate_calls_read_each_agent_chunk_five_times(ds, reads):
    """(What the one pass saves: the baseline of the test above.)"""
    ds_ = l5dask.open_dataset(ds)
    for name in ("report", "catalog", "speed", "near", "extent"):
        alone(ds_, name, ALL[name])
    assert set(chunk_reads(reads, fmt.AGENTS).values()) == {5}


def test_on_a_cluster(dask_cluster, ds):
    """Worker processes of a real scheduler (fused partials pickled, combined on the workers):
    each result is the analysis alone on the same cluster."""
    from distributed import Client

    with Client(dask_cluster.address, set_as_default=False) as client:
        got = analyze(ds, ALL, scheduler=client)
        for name, analysis in ALL.items():
            same(got[name], alone(ds, name, analysis, scheduler=client), name)


def test_bad_input_is_one_line(ds):
    with pytest.raises(UsageError, match="non-empty mapping"):
        analyze(ds, {})
    with pytest.raises(UsageError, match="'x' is int, not an analysis"):
        analyze(ds, {"x": 3})
    with pytest.raises(UsageError, match="unknown time zone"):
        Catalog(tz="Mars/Olympus")
    with pytest.raises(UsageError, match="no_such"):
        analyze(ds, {"report": Report(), "bad": Aggregate(by=["no_such"], values={"speed": ["mean"]})})


def test_l5dask_namespace():
    assert l5dask.analyze is analyze
    assert l5dask.analyses.Report is Report and l5dask.analyses.Aggregate is Aggregate


# --- the engine's fusion, on plain rows ----------------------------------------------------
class Numbers:
    """A source of consecutive integers in chunks of 10 (float sums depend on their grouping)."""

    name = "numbers"

    def __init__(self, n: int, reads: collections.Counter) -> None:
        self.n, self.reads = n, reads

    @property
    def nchunks(self) -> int:
        return -(-self.n // 10)

    def chunk_bounds(self, i: int) -> tuple[int, int]:
        return i * 10, min(self.n, i * 10 + 10)

    def _rows(self, i: int) -> np.ndarray:
        self.reads[i] += 1
        a, b = self.chunk_bounds(i)
        return 1.0 / (1.0 + np.arange(a, b, dtype=np.float64)) ** 1.5

    def iter_chunks(self, first: int, n: int):
        for i in range(first, first + n):
            yield self.chunk_bounds(i)[0], self._rows(i)

    def read(self, first: int, n: int) -> np.ndarray:
        return np.concatenate([self._rows(i) for i in range(first, first + n)])

    def __dask_tokenize__(self):
        return ("Numbers", self.n)


def _sum(name: str, exact: bool = False) -> Reduction:
    return Reduction(name, lambda x, s, p: float(x.sum()), lambda a, b: a + b, float, exact=exact)


def test_engine_fuses_passes_of_one_source():
    """Three plans over one source, one streaming and two in blocks, sums whose bits follow the
    grouping: run together, each chunk read once and each result the plan's alone."""
    counts: collections.Counter = collections.Counter()
    src = Numbers(997, counts)
    job = Job(scheduler="sync", chunks_per_task=7)

    def plans():
        return [
            Plan([Pass(src, _sum("a"))], final=lambda x: ("a", x)),
            Plan([Pass(src, _sum("b"), blocks=True)]),
            Plan([Pass(src, _sum("c", exact=True), blocks=True, name="c")]),
        ]

    want = [job.run([p])[0] for p in plans()]
    counts.clear()
    got = job.run(plans())
    assert got == want
    assert set(counts.values()) == {1} and len(counts) == src.nchunks
    # the first and second take their chunks differently and keep their own groups: not exact,
    # with a sizing of its own the streaming one is a pass of its own; the exact one joins any
    counts.clear()
    job = Job(scheduler="sync")
    want = [job.run([p])[0] for p in plans()]
    counts.clear()
    assert job.run(plans()) == want
    assert max(counts.values()) <= 2


@pytest.mark.parametrize("kw", [{}, {"chunks_per_task": 3}])
def test_a_scene_view_s_fused_streaming_pass_is_each_analysis_alone(ds, kw):
    """The report and the catalog of a scene filter's view, fused: a view's streamed chunk has no
    pieces of its own (it is one; ``l5dask report --scenes`` stopped with an AttributeError once
    their fused pass streamed), each result the analysis alone, bit for bit."""
    view = l5dask.open_dataset(ds).isel(scene=[1, 3, 4, 7])
    names = ("report", "catalog")
    want = {n: alone(view, n, ALL[n], **kw) for n in names}
    got = analyze(view, {n: ALL[n] for n in names}, **kw)
    for n in names:
        same(got[n], want[n], n)
