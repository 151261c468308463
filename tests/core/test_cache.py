"""The cache of partial results (l5dask.core.cache): entries without pickle, keys by content, reruns
that read no chunk, growth, runs killed part way, damaged entries, S3 and a real cluster."""

from __future__ import annotations

import dataclasses
import filecmp
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import l5dask
from l5dask.core import cache as cachelib
from l5dask.core import engine
from l5dask.core import store as storemod
from l5dask.core.engine import Block
from l5dask.core.outputs import public
from l5dask.errors import UsageError
from l5dask.prediction import format as fmt
from l5dask.prediction.report import compute_report
from l5dask.prediction.stats import AgentPart, FramePart, SceneSeries, TLPart
from tests.conftest import ctrl_c_reaches_it

#: Chunks small enough for many tasks (and scenes across them), the same in every dataset here.
CHUNKS = {fmt.SCENES: 4, fmt.FRAMES: 300, fmt.AGENTS: 2_000, fmt.TL_FACES: 1_000}


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("cache") / "base.zarr")
    l5dask.synthesize(path, num_scenes=12, seed=31, chunk_rows=CHUNKS)
    return path


@pytest.fixture()
def dataset(base, tmp_path) -> str:
    """A copy of ``base`` of the test's own (mtimes kept: the same chunks to the cache)."""
    path = str(tmp_path / "d.zarr")
    shutil.copytree(base, path)
    return path


class Reads:
    """The stored chunks read at the store (whole or in part), by key: local reads (Store.get, LocalFile.read) and
    object-store GETs (the store's one coroutine, _cat_parts)."""

    def __init__(self, monkeypatch) -> None:
        self.keys: list[tuple[str, int | None, int | None]] = []
        get, cat = storemod.Store.get, storemod._cat_parts
        reads = self

        def counted_get(store, key, **kw):
            reads.keys.append((key, kw.get("start"), kw.get("end")))
            return get(store, key, **kw)

        async def counted_cat(fs, path, start, end):
            reads.keys.append((path, start, end))
            return await cat(fs, path, start, end)

        read = storemod.LocalFile.read

        def counted_read(file, start=None, end=None):  # (a local chunk read in part: its file opened once)
            reads.keys.append((file.key, start, end))
            return read(file, start, end)

        monkeypatch.setattr(storemod.Store, "get", counted_get)
        monkeypatch.setattr(storemod.LocalFile, "read", counted_read)
        monkeypatch.setattr(storemod, "_cat_parts", counted_cat)

    def chunks(self) -> list[tuple[str, int | None, int | None]]:
        """The reads of chunks (not of metadata, nor of the cache's entries)."""
        return [
            r
            for r in self.keys
            if cachelib.FOLDER not in r[0] and not r[0].rsplit("/", 1)[-1].startswith(".") and "/" in r[0]
        ]


def header_probes_only(reads: list, dataset: str) -> bool:
    """Whether every chunk read is the 16-byte check of an array's last chunk that opening a
    dataset makes (l5dask.prediction.reading.check_last_chunk), at most one an array."""
    ds = l5dask.open_dataset(dataset)
    last = {ds[name].meta.key(ds[name].nchunks - 1) for name in ds.arrays}
    probes = {(r[0].split(".zarr/", 1)[-1], r[1], r[2]) for r in reads}  # (on S3 a GET is seen twice: get, then cat)
    return all(key in last and (a, b) == (0, 16) for key, a, b in probes) and len(probes) <= len(last)


# --- entries ---------------------------------------------------------------------------------
@dataclasses.dataclass
class Outside:  # a dataclass of another package (this test module): not decoded from an entry
    x: int = 0


def test_entries_keep_every_bit_without_pickle():
    structured = np.zeros(3, np.dtype([("id", "<U8"), ("xy", "<f4", (2,)), ("n", "<i8")]))
    structured["id"], structured["xy"], structured["n"] = ["a", "bb", "ccc"], [[1, 2], [3, 4], [5, 6]], [7, 8, 9]
    floats = (0.0, -0.0, math.inf, -math.inf, math.nan, 5e-324, 1.0000000000000002)
    value = {
        "frames": FramePart(n=3, series=SceneSeries(4, {"x": np.arange(3.0)}), first=(1, 2, 3.5, -0.0)),
        "agents": AgentPart(n=2, speed_sum=floats, open=[(3, np.array([5, 9], np.uint64))]),
        "faces": TLPart(4, np.array([1, 2, 1]), frozenset({"f1", "f22"})),
        7: Block(frozenset({-(2**62), 3}), {1, 2}, {"f": np.ones((2, 6), np.int64)}),
        "big": 2**100,
        "scalars": (np.float32(1.5), np.int16(-3), np.bool_(True), None, True, "é"),
        "records": structured,
        "empty": np.zeros((0, 6), np.int64),
    }
    got = cachelib.decode(cachelib.encode(value))
    assert got.keys() == value.keys() and got[7][:2] == value[7][:2] and isinstance(got[7], Block)
    assert got[7].bounds["f"].tobytes() == value[7].bounds["f"].tobytes()
    assert got["big"] == 2**100 and got["scalars"][:3] == value["scalars"][:3]
    assert [type(v) for v in got["scalars"]] == [type(v) for v in value["scalars"]]
    assert got["scalars"][3:] == (None, True, "é")
    assert [struct_bits(x) for x in got["agents"].speed_sum] == [struct_bits(x) for x in floats]
    assert got["faces"].faces == frozenset({"f1", "f22"}) and isinstance(got["faces"].faces, frozenset)
    assert got["records"].dtype == structured.dtype and got["records"].tobytes() == structured.tobytes()
    assert got["frames"].series.lo == 4 and got["frames"].first == (1, 2, 3.5, -0.0)
    np.testing.assert_array_equal(got["agents"].open[0][1], value["agents"].open[0][1])
    assert got["agents"].open[0][1].dtype == np.uint64 and got["empty"].shape == (0, 6)


def test_the_same_partial_is_the_same_bytes_in_every_process():
    """A set of strings iterates in the order of its hashes, which differ between processes: the
    entry's bytes (and so its digest) must not."""
    code = (
        "import sys; from l5dask.core import cache; from l5dask.prediction.stats import TLPart; import numpy as np; "
        "sys.stdout.write(cache.encode(TLPart(3, np.array([1]), frozenset(f'face{i}' for i in range(40)))).hex())"
    )
    outs = {
        subprocess.run(
            [sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": seed}, capture_output=True, text=True
        ).stdout
        for seed in ("1", "2", "3")
    }
    assert len(outs) == 1 and len(next(iter(outs))) > 100


def struct_bits(x: float) -> bytes:
    return np.float64(x).tobytes()


@pytest.mark.parametrize(
    "value",
    [np.array([object()], dtype=object), lambda: 1, Outside(), {1.5: 2} | {"f": Outside()}, range(3)],
    ids=["object-array", "function", "foreign-dataclass", "nested-foreign", "range"],
)
def test_what_cannot_be_encoded_is_refused(value):
    with pytest.raises(cachelib.Unencodable):
        cachelib.encode(value)


def _forged(manifest: dict, data: bytes = b"", fmt: int | None = None) -> bytes:
    """An entry with a valid checksum around ``manifest`` and its arrays' bytes ``data`` (its
    header saying format ``fmt``: this one's by default)."""
    import hashlib
    import json
    import struct

    text = json.dumps({"arrays": [], **manifest}).encode()
    body = struct.pack("<I", len(text)) + text + data
    head = cachelib._HEAD.pack(
        cachelib.MAGIC, cachelib.FORMAT if fmt is None else fmt, hashlib.blake2b(body, digest_size=16).digest()
    )
    return head + body


def test_only_declared_partial_types_are_kept():
    """Only classes declared with ``cachelib.partial_type`` are encoded, and decoded by name from that
    list alone: an l5dask class that is no partial (here the cache's own Stats) is not kept."""
    with pytest.raises(cachelib.Unencodable, match="partial_type"):
        cachelib.encode(cachelib.Stats())
    assert cachelib.decode(cachelib.encode(Block(AgentPart(n=3), None, None))).partial.n == 3


def test_sets_of_strings_keep_their_nuls():
    """numpy's "<U" arrays drop trailing NULs: a set of strings is kept as strings (the property test found
    {"\\x00"} read back as {""})."""
    for value in ({"\x00"}, frozenset({"a\x00", "a", ""}), {"x\x00\x00", "\x00y"}):
        assert cachelib.decode(cachelib.encode(value)) == value
        assert "i" not in cachelib.manifest_of(cachelib.encode(value))["tree"]  # (kept one by one)


def test_sets_of_strings_are_one_array():
    """A set of strings none of which ends with a NUL (the traffic-light faces' distinct ids: tens of
    thousands in an entry) is kept as one "<U" array, not string by string in the manifest (39 ms to
    encode 34,000 ids so, 16 ms to decode them: most of the cache's work after a dataset grew)."""
    ids = frozenset(f"{i:x}" for i in range(5000)) | {"", "a\x00b", "\ud800", "\U0001f600", "\x00z"}
    for value in (ids, set(ids), TLPart(7, np.arange(3), ids)):
        data = cachelib.encode(value)
        manifest = cachelib.manifest_of(data)
        assert [a["dtype"] for a in manifest["arrays"] if a["dtype"].startswith("<U")] == ["<U4"]
        assert len(data) < 5005 * 4 * 4 + 1000  # (the manifest holds no string of the set)
        got = cachelib.decode(data)
        assert type(got) is type(value)
        if isinstance(got, TLPart):
            assert got.n == 7 and got.status.tolist() == [0, 1, 2]
            got, value = got.faces, value.faces
        assert got == value and all(type(s) is str for s in got)


def test_a_set_of_strings_is_kept_in_python_s_order():
    """A set of strings kept as one array is sorted by numpy, in the order ``sorted`` gives (code points,
    a string before the strings it begins): the bytes written before, and in every process."""
    rng = np.random.default_rng(5)
    alphabet = ["\x00", "\x01", "a", "b", "é", "\uffff", "\ud800", "\udfff", "\U0001f600", "\U0010ffff"]
    for _ in range(300):
        value = {"".join(rng.choice(alphabet, rng.integers(0, 6))) for _ in range(rng.integers(1, 30))}
        value = {s for s in value if not s.endswith("\x00")} | {"a\x00b", "a", "a\x00\x00b"}
        data = cachelib.encode(value)
        _, arrays = cachelib._open(data)
        assert [a for a in arrays if a.dtype.kind == "U"][0].tolist() == sorted(value)
        manifest = cachelib.manifest_of(data)
        assert data == cachelib.encode(set(sorted(value, reverse=True)))  # (however the set iterates)
        assert manifest["tree"]["k"] == "u" and cachelib.decode(data) == value


def test_damaged_entries_are_refused():
    good = cachelib.encode(AgentPart(n=5))
    flipped = bytearray(good)
    flipped[len(good) // 2] ^= 0x40
    other_format = bytearray(good)
    other_format[8:12] = (cachelib.FORMAT + 1).to_bytes(4, "little")
    damaged = {
        "flipped": bytes(flipped),
        "truncated": good[: len(good) - 7],
        "header only": good[:20],
        "empty": b"",
        "other format": bytes(other_format),
        "foreign": b"PK\x03\x04" + b"\0" * 64,
        "an object array": _forged(
            {"format": cachelib.FORMAT, "arrays": [{"dtype": "|O", "shape": [1], "offset": 0}], "tree": None}
        ),
        "an array past the end": _forged(
            {
                "format": cachelib.FORMAT,
                "arrays": [{"dtype": "<i8", "shape": [4], "offset": 0}],
                "tree": {"t": "nd", "i": 0},
            }
        ),
        "class outside l5dask": _forged({"format": cachelib.FORMAT, "tree": {"t": "dc", "c": "os:system", "v": {}}}),
        "not a dataclass": _forged(
            {"format": cachelib.FORMAT, "tree": {"t": "dc", "c": "l5dask.core.cache:Stats", "v": {"x": 1}}}
        ),
        # (l5dask's own, but no partial: an entry must not choose what is built; Stats is a dataclass)
        "an undeclared class of l5dask": _forged(
            {"format": cachelib.FORMAT, "tree": {"t": "dc", "c": "l5dask.core.cache:Stats", "v": {}}}
        ),
        "an undeclared NamedTuple of l5dask": _forged(
            {"format": cachelib.FORMAT, "tree": {"t": "nt", "c": "l5dask.core.engine:Stage", "v": []}}
        ),
        "a module's attribute": _forged(
            {"format": cachelib.FORMAT, "tree": {"t": "nt", "c": "l5dask.core.cache:os.system", "v": []}}
        ),
        "strings kept in an array": _forged(
            {
                "format": cachelib.FORMAT,
                "arrays": [{"dtype": "<U1", "shape": [1], "offset": 0}],
                "tree": {"t": "se", "k": "s", "i": 0},
            },
            "a".encode("utf-32-le"),
        ),
        "strings said numbers": _forged(
            {
                "format": cachelib.FORMAT,
                "arrays": [{"dtype": "<U1", "shape": [1], "offset": 0}],
                "tree": {"t": "se", "k": "i", "i": 0},
            },
            "a".encode("utf-32-le"),
        ),
        "numbers said strings": _forged(
            {
                "format": cachelib.FORMAT,
                "arrays": [{"dtype": "<i8", "shape": [1], "offset": 0}],
                "tree": {"t": "fs", "k": "u", "i": 0},
            },
            b"\0" * 8,
        ),
        "strings in a 2-d array": _forged(
            {
                "format": cachelib.FORMAT,
                "arrays": [{"dtype": "<U1", "shape": [1, 1], "offset": 0}],
                "tree": {"t": "fs", "k": "u", "i": 0},
            },
            "a".encode("utf-32-le"),
        ),
        "unknown kind": _forged({"format": cachelib.FORMAT, "tree": {"t": "pickle", "v": "gASVAAAA"}}),
    }
    for what, data in damaged.items():
        with pytest.raises(cachelib.Damaged):
            cachelib.decode(data)
        assert what  # (each kind refused)
    assert cachelib.decode(good).n == 5  # (the sound entry is read)
    # what the warning says: another format only of an entry that says so in its manifest too; a
    # bit flipped in the header's format field is damage (it said "of cache format 65542", a new
    # user's trial); a bit flipped in the body fails the checksum
    newer = _forged({"format": cachelib.FORMAT + 1, "tree": None}, fmt=cachelib.FORMAT + 1)
    with pytest.raises(cachelib.Damaged, match=f"^of cache format {cachelib.FORMAT + 1}, not {cachelib.FORMAT}$"):
        cachelib.decode(newer)
    for bit in range(32):
        header = bytearray(good)
        header[8 + bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(cachelib.Damaged, match="^its header does not match its contents"):
            cachelib.decode(bytes(header))
    with pytest.raises(cachelib.Damaged, match="its checksum does not match"):
        cachelib.decode(bytes(flipped))


# --- runs ----------------------------------------------------------------------------------------
def test_rerun_reads_no_chunk_and_is_bit_for_bit(dataset, tmp_path, monkeypatch):
    cache = str(tmp_path / "cache")
    want = public(compute_report(dataset))
    with cachelib.counting() as cold:
        first = public(compute_report(dataset, cache=cache))
    assert first == want
    whole = [e for e in cachelib.Cache(cache).entries() if e["reduction"].startswith("pass-")]
    assert len(whole) == 3  # (the frames, the agents and the faces, each pass whole too)
    # (written: each task's entry, each pass whole, and the last task of an exact reduction in its
    # aligned pieces, read again when the dataset grows: l5dask.core.engine.Job._pieces; whole too
    # unless shorter than the others)
    assert cold.written == len(cachelib.Cache(cache).entries()) >= cold.misses + len(whole)
    assert cold.hits == 0 and cold.misses > 10 and cold.damaged == 0
    reads = Reads(monkeypatch)

    def no_graph(*args, **kwargs):
        raise AssertionError("a rerun found whole in the cache ran a graph")

    monkeypatch.setattr(engine, "compute", no_graph)
    monkeypatch.setattr(engine, "persist", no_graph)
    with cachelib.counting() as warm:
        again = public(compute_report(dataset, cache=cache))
    assert again == want
    assert warm.hits == cold.misses and warm.misses == 0 and warm.written == 0
    assert header_probes_only(reads.chunks(), dataset), reads.chunks()
    # without the passes' whole entries, from the tasks' own: the same bits
    for e in whole:
        os.unlink(os.path.join(cache, e["path"]))
    monkeypatch.undo()
    with cachelib.counting() as tasks:
        assert public(compute_report(dataset, cache=cache)) == want
    assert tasks.hits == cold.misses and tasks.misses == 0 and tasks.written == len(whole)


def test_a_pass_s_last_short_task_is_kept_in_its_pieces_alone(dataset, tmp_path, monkeypatch):
    """A pass's last task shorter than the others (not one aligned piece) is kept in its aligned pieces
    only: its whole entry and alias would never be read again (a rerun over the same data reads the
    pass's entry; after growth the task grows, and its pieces are read). Without the passes' entries
    (a run killed before it kept them), the rerun reads the pieces, the same bits: no chunk of the agents
    or the faces, only the frames (the parent rows) of the agents' last task, whose pieces are one task."""
    cache = str(tmp_path / "cache")
    want = public(compute_report(dataset, chunks_per_task=8))
    assert public(compute_report(dataset, cache=cache, chunks_per_task=8)) == want
    ranges: dict[str, set[tuple[int, ...]]] = {}
    for e in cachelib.Cache(cache).entries():
        if not e["reduction"].startswith(("pass-", "prefix-")):
            about = cachelib.manifest_of((tmp_path / "cache" / e["path"]).read_bytes())["about"]
            ranges.setdefault(e["reduction"], set()).add(tuple(about["chunks"]))
    ds = l5dask.open_dataset(dataset)
    for red, array in (("agents-17", fmt.AGENTS), ("tl-faces", fmt.TL_FACES)):
        n = ds[array].nchunks
        last = (n - n % 8, n % 8)  # (agents (96, 5), faces (32, 7): three pieces each at most)
        assert last[1] & (last[1] - 1) and last not in ranges[red], (red, last)
        assert set(engine._aligned_nodes(*last)) <= ranges[red] and (last[0] - 8, 8) in ranges[red]
    for e in cachelib.Cache(cache).entries():
        if e["reduction"].startswith("pass-"):
            os.unlink(os.path.join(cache, e["path"]))
    reads = Reads(monkeypatch)
    with cachelib.counting() as st:
        assert public(compute_report(dataset, cache=cache, chunks_per_task=8)) == want
    whole = {k.split(".zarr/", 1)[-1] for k, lo, hi in reads.chunks() if (lo, hi) != (0, 16)}
    assert whole and {k.split("/")[0] for k in whole} == {fmt.FRAMES}, whole
    assert header_probes_only([r for r in reads.chunks() if (r[1], r[2]) == (0, 16)], dataset)
    assert st.misses == 0 and st.hits > 10 and st.damaged == 0


@pytest.mark.parametrize("again", ["absolute", "dot-slash", "file-url", "other-cwd"])
def test_one_dataset_however_its_path_is_spelled_is_one_to_the_cache(dataset, tmp_path, monkeypatch, again):
    # (a cache filled through "d.zarr" read nothing from it through "/abs/d.zarr": the keys held
    # the path as given)
    cache = str(tmp_path / "cache")
    monkeypatch.chdir(tmp_path)
    with cachelib.counting() as cold:
        first = public(compute_report("d.zarr", cache=cache))
    assert cold.hits == 0 and cold.misses > 10
    spelled = {
        "absolute": os.path.abspath("d.zarr"),
        "dot-slash": "./d.zarr/",
        "file-url": "file://" + os.path.abspath("d.zarr"),
        "other-cwd": os.path.join(os.path.basename(tmp_path), "d.zarr"),
    }[again]
    if again == "other-cwd":
        monkeypatch.chdir(os.path.dirname(tmp_path))
    reads = Reads(monkeypatch)
    with cachelib.counting() as warm:
        got = public(compute_report(spelled, cache=cache))
    assert warm.hits == cold.misses and warm.misses == 0 and warm.written == 0
    assert header_probes_only(reads.chunks(), spelled)
    first.pop("dataset", None), got.pop("dataset", None)  # (the path as the user gave it)
    assert got == first
    # one folder of entries an array, not one a spelling
    assert len(os.listdir(os.path.join(cache, cachelib.FOLDER))) == len(l5dask.open_dataset(spelled).arrays)


def test_the_aggregations_the_catalog_and_their_keys(dataset, tmp_path, monkeypatch):
    cache = str(tmp_path / "cache")
    kw = {"by": ["scene_index", "label"], "values": {"speed": ["mean", "max", "q50"]}, "where": "distance_to_ego < 30"}
    with cachelib.counting() as cold:
        first = l5dask.aggregate(dataset, cache=cache, **kw)
    reads = Reads(monkeypatch)
    with cachelib.counting() as warm:
        again = l5dask.aggregate(dataset, cache=cache, **kw)
    assert warm.hits == cold.misses > 5 and warm.misses == 0 and header_probes_only(reads.chunks(), dataset)
    assert first.equals(again)  # bit for bit, NaNs in the same places
    # another where, another by: none of the agents' entries is theirs (the frames' join rows are)
    for other in (
        {**kw, "where": "distance_to_ego < 20"},
        {**kw, "by": ["label"]},
        {**kw, "values": {"speed": ["sum"]}},
    ):
        before = {e["path"] for e in cachelib.Cache(cache).entries()}
        with cachelib.counting() as st:
            l5dask.aggregate(dataset, cache=cache, **other)
        new = {e["path"] for e in cachelib.Cache(cache).entries()} - before
        # (and the pass whole: one entry; and a task's alias, found by its frame rows: as many)
        aliases = [p for p in new if "/pass-" not in p and cachelib.key_of(p).startswith("r")]
        tasks = [p for p in new if "/pass-" not in p and p not in aliases]
        assert st.misses == len(tasks) == len(aliases) == (len(new) - 1) // 2 > 5, new
        assert all(".aggregate." in p or "/aggregate." in p or "/pass-aggregate." in p for p in new), new
    # the catalog: its rerun, too
    want = l5dask.catalog(dataset)
    l5dask.catalog(dataset, cache=cache)
    reads.keys.clear()
    with cachelib.counting() as st:
        got = l5dask.catalog(dataset, cache=cache)
    assert got.equals(want) and st.misses == 0 and header_probes_only(reads.chunks(), dataset)


def append_in_place(base: str, extra: str, tmp: str, monkeypatch) -> set[str]:
    """``base`` grown by the scenes of ``extra`` as an appender does it: concatenated (l5dask.concat,
    in ``base``'s chunks), then only the files whose bytes differ moved into ``base`` (the others
    left as they were: ``rsync --checksum`` without ``-t``). Returns the keys replaced."""
    from l5dask.prediction import surgery

    monkeypatch.setattr(surgery, "OUT_CHUNK_ROWS", {**surgery.OUT_CHUNK_ROWS, **CHUNKS})
    grown = os.path.join(tmp, "grown.zarr")
    l5dask.concat([base, extra], grown)
    replaced = set()
    for root, _, files in os.walk(grown):
        for f in files:
            p = os.path.join(root, f)
            rel = os.path.relpath(p, grown)
            q = os.path.join(base, rel)
            if not (os.path.exists(q) and filecmp.cmp(p, q, shallow=False)):
                os.replace(p, q)
                replaced.add(rel)
    shutil.rmtree(grown)
    return replaced


def test_after_growth_only_new_chunks_are_computed(dataset, tmp_path, monkeypatch):
    cache = str(tmp_path / "cache")
    kw = {"by": ["label"], "values": {"speed": ["mean", "count"]}}
    compute_report(dataset, cache=cache, chunks_per_task=4)
    agg_before = l5dask.aggregate(dataset, cache=cache, **kw)
    extra = str(tmp_path / "extra.zarr")
    l5dask.synthesize(extra, num_scenes=1, seed=77, chunk_rows=CHUNKS)
    replaced = append_in_place(dataset, extra, str(tmp_path), monkeypatch)
    changed = {r for r in replaced if r.startswith("agents/") and not r.endswith(".zarray")}
    nagents = l5dask.open_dataset(dataset)["agents"].nchunks
    assert 0 < len(changed) < nagents // 3  # (a small growth: most agent chunks are untouched)
    reads = Reads(monkeypatch)
    with cachelib.counting() as st:
        got = public(compute_report(dataset, cache=cache, chunks_per_task=4))
    read_agents = {int(k.rsplit("/", 1)[-1]) for k, a, b in reads.chunks() if k.split("/")[-2] == "agents" and b != 16}
    monkeypatch.undo()
    assert got == public(
        compute_report(dataset, chunks_per_task=4)
    )  # bit for bit the uncached report of the grown data
    # only the tasks over changed chunks ran: those holding a changed agent chunk, or agents of the
    # frames of a changed frame chunk (the last frame chunk took rows): a run of whole tasks to the end
    groups = {c // 4 for c in read_agents}  # (4 chunks a task)
    assert read_agents == set(range(4 * min(groups), nagents)), read_agents
    assert 0 < min(read_agents) <= min(int(r.split("/")[1]) for r in changed) and len(read_agents) < 0.4 * nagents
    assert st.hits > st.misses, st
    agg_after = l5dask.aggregate(dataset, cache=cache, **kw)
    assert agg_after.speed_count.sum() > agg_before.speed_count.sum()
    fresh = l5dask.aggregate(dataset, cache=str(tmp_path / "fresh"), **kw)
    assert agg_after.equals(fresh)  # the same tasks cached or not: the same bits


class EntryReads:
    """The cache's entries read (``Cache.read``): each one's path and the chunks its manifest names."""

    def __init__(self, monkeypatch) -> None:
        self.read: list[tuple[str, list[int] | None]] = []
        read = cachelib.Cache.read

        def counted(cache, path):
            data = read(cache, path)
            if data is not None and path.endswith(cachelib.SUFFIX):
                self.read.append((path, cachelib.manifest_of(data)["about"].get("chunks")))
            return data

        monkeypatch.setattr(cachelib.Cache, "read", counted)

    def of(self, array: str, kind: str = "") -> list[tuple[str, list[int] | None]]:
        """The entries read of ``array``'s folder whose name starts with ``kind``."""
        return [(p, c) for p, c in self.read if f"-{array}-" in p and p.rsplit("/", 1)[-1].startswith(kind)]


def test_after_growth_a_pass_s_first_tasks_are_read_as_one_entry(dataset, tmp_path, monkeypatch):
    """Issue 48: a pass's first tasks are kept combined (a ``prefix-`` entry: every task but the
    last, and for the agents none over the frames' last chunk). After scenes are appended, the rerun
    reads that one entry instead of an entry a task, reads at the store only the chunks that changed
    and the rest of their aligned pieces, and is bit for bit the uncached report of the grown data."""
    cache = str(tmp_path / "cache")
    per_task = 2
    compute_report(dataset, cache=cache, chunks_per_task=per_task)
    before = {e["path"] for e in cachelib.Cache(cache).entries() if e["reduction"].startswith("prefix-")}
    assert {p.split("/")[1].split("-")[1] for p in before} == {fmt.AGENTS, fmt.TL_FACES}, (
        before
    )  # (not frames: persisted)
    extra = str(tmp_path / "extra.zarr")
    l5dask.synthesize(extra, num_scenes=2, seed=79, chunk_rows=CHUNKS)
    replaced = append_in_place(dataset, extra, str(tmp_path), monkeypatch)
    reads, entries = Reads(monkeypatch), EntryReads(monkeypatch)
    with cachelib.counting() as st:
        got = public(compute_report(dataset, cache=cache, chunks_per_task=per_task))
    monkeypatch.undo()
    assert got == public(compute_report(dataset, chunks_per_task=per_task))  # bit for bit, grown data
    for array in (fmt.AGENTS, fmt.TL_FACES):
        (prefix,) = entries.of(array, "prefix-")  # (the one kept before the growth)
        assert prefix[0] in before
        cut = prefix[1][1]  # (its tasks' chunks: 0 .. cut - 1)
        tasks = [c for p, c in entries.of(array) if "/prefix-" not in p and "/pass-" not in p]
        assert cut >= 2 * per_task and all(c is not None and c[0] >= cut for c in tasks), (cut, tasks)  # none before it
        changed = {int(r.split("/")[1]) for r in replaced if r.startswith(f"{array}/") and "/." not in r}
        read = {int(k.rsplit("/", 1)[-1]) for k, a, b in reads.chunks() if k.split("/")[-2] == array and b != 16}
        # the changed chunks (the old last one grown, the new ones), and the rest of their pieces
        assert changed <= read and min(read) >= min(changed) - (per_task - 1), (array, sorted(changed), sorted(read))
        assert len(read) <= len(changed) + per_task - 1
    assert st.hits > st.misses and st.damaged == 0


def test_a_damaged_prefix_is_ignored_and_its_tasks_read(dataset, tmp_path, caplog):
    """A prefix entry damaged: one warning, counted, its tasks' own entries read instead (and the
    prefix written again); the same report."""
    cache = str(tmp_path / "cache")
    want = public(compute_report(dataset, cache=cache, chunks_per_task=2))
    entries = cachelib.Cache(cache).entries()
    for e in entries:
        if e["reduction"].startswith("pass-"):  # (the passes whole gone: their prefixes are read)
            os.unlink(os.path.join(cache, e["path"]))
    prefixes = [e["path"] for e in entries if e["reduction"].startswith("prefix-")]
    assert len(prefixes) == 2
    with open(os.path.join(cache, prefixes[0]), "r+b") as f:
        f.seek(-5, os.SEEK_END)
        f.write(b"\xff")
    cachelib.reset_warnings()
    with caplog.at_level(logging.WARNING, logger="l5dask.cache"), cachelib.counting() as st:
        assert public(compute_report(dataset, cache=cache, chunks_per_task=2)) == want
    assert st.damaged == 1 and st.misses == 0 and "damaged" in caplog.text
    with cachelib.counting() as st:  # (the prefix written again, sound: nothing damaged, no task missed)
        assert public(compute_report(dataset, cache=cache, chunks_per_task=2)) == want
    assert st.damaged == 0 and st.misses == 0


def test_after_growth_the_frames_tasks_of_old_frames_are_read_from_the_cache(dataset, tmp_path, monkeypatch):
    """The report's sample scenes (for its plots, computed by the frames tasks that hold them) stay
    where they are as scenes are appended (spread over the first 2**k scenes): only the frames tasks
    over changed frame chunks are computed again (they moved with the count, and the frames tasks
    holding them were computed again)."""
    from l5dask.prediction import stats
    from l5dask.prediction.report import sample_scenes

    cache = str(tmp_path / "cache")
    before = l5dask.open_dataset(dataset)
    compute_report(dataset, cache=cache, chunks_per_task=2)
    extra = str(tmp_path / "extra.zarr")
    l5dask.synthesize(extra, num_scenes=2, seed=78, chunk_rows=CHUNKS)
    replaced = append_in_place(dataset, extra, str(tmp_path), monkeypatch)
    frames = l5dask.open_dataset(dataset)["frames"]
    first_changed = min(int(r.split("/")[1]) for r in replaced if r.startswith("frames/") and not r.endswith(".zarray"))
    assert first_changed >= frames.nchunks - 3 and frames.nchunks >= 12  # (the end of many chunks changed)
    computed: list[tuple[int, int]] = []
    chunk = stats.FrameStats.chunk

    def counted(frames, offset, *args, **kw):
        computed.append((offset, offset + len(frames)))
        return chunk(frames, offset, *args, **kw)

    monkeypatch.setattr(stats.FrameStats, "chunk", counted)
    report = compute_report(dataset, cache=cache, chunks_per_task=2)
    monkeypatch.undo()
    samples = np.unique(report["_plots"]["samples"]["scene"]).tolist()
    assert samples == sample_scenes(before.counts()["scenes"]).tolist() == [0, 2, 4, 7]  # (12 scenes, then 14)
    assert sample_scenes(16).tolist() == [0, 5, 10, 15] and sample_scenes(3).tolist() == [0, 1]
    got = public(report)
    # every frames block computed holds rows of a changed chunk (the others read from the cache)
    lo = frames.meta.chunk_bounds(first_changed)[0]
    assert computed and all(hi > lo for _, hi in computed), (computed, lo)
    assert got == public(compute_report(dataset, chunks_per_task=2))  # bit for bit the uncached report


def test_a_cached_run_on_local_threads_decodes_each_frames_chunk_once(dataset, tmp_path, monkeypatch):
    """On local threads, the frames blocks a cached run computes hold their join rows for the agents'
    tasks, as an uncached run's do (within HELD_ROWS_BYTES): each frames chunk is decoded once, not
    made again by the agents' tasks (twice each before); no entry keeps rows."""
    import json

    from l5dask.prediction import reading

    cache = str(tmp_path / "cache")
    want = public(compute_report(dataset, chunks_per_task=2))
    decoded: list[tuple[str, str]] = []
    original = reading.decode_chunk

    def counted(raw, meta, *args, **kw):
        decoded.append((meta.name, args[1]))
        return original(raw, meta, *args, **kw)

    monkeypatch.setattr(reading, "decode_chunk", counted)
    got = public(compute_report(dataset, cache=cache, chunks_per_task=2))
    monkeypatch.undo()
    frames = l5dask.open_dataset(dataset)[fmt.FRAMES].nchunks
    assert sorted(k for n, k in decoded if n == fmt.FRAMES) == sorted(str(i) for i in range(frames))
    assert got == want
    for e in cachelib.Cache(cache).entries():
        with open(os.path.join(cache, e["path"]), "rb") as f:
            manifest = cachelib.manifest_of(f.read())
        assert f"{engine.Rows.__module__}:Rows" not in json.dumps(manifest["tree"]), e["path"]


def test_the_keys_of_a_task_and_of_its_pieces_are_made_in_one_call(dataset, tmp_path, monkeypatch):
    """A task not in the cache is looked for in aligned pieces (``Job._pieces``): the keys of all
    of them are made in one call (a call a piece was 40 us of overhead each; 281 calls for this
    report's first cached run, 245 a rerun of 30 M agents after growth, against 33 now)."""
    calls: list[int] = []
    group_ids = engine.Job.group_ids

    def counted(self, spec, groups, keep="all", prefixes=None):
        calls.append(len(groups))
        return group_ids(self, spec, groups, keep, prefixes)

    monkeypatch.setattr(engine.Job, "group_ids", counted)
    with cachelib.counting() as st:
        got = public(compute_report(dataset, cache=str(tmp_path / "cache"), chunks_per_task=8))
    monkeypatch.undo()
    assert got == public(compute_report(dataset, chunks_per_task=8))
    # (a call a task not in the cache, for its pieces; a few a pass: its tasks, whole, rows)
    assert st.misses > 10 and len(calls) <= st.misses + 4 * 3, (len(calls), st.misses)


def test_a_rerun_from_the_cache_imports_no_codec(dataset, tmp_path):
    """``l5dask stats --cache`` over unchanged data decodes no chunk: it does not import numcodecs
    (with wrapt and asyncio: 30 ms of its start warm, more cold), which the first run does. Nor
    any of the heavy libraries a rerun has no use for: what it imports beyond numpy, dask and
    click is 0.02 CPU-s, a tenth of its process (``benchmarks/start_benchmark.py``)."""
    code = (
        "import sys; from l5dask.cli import main; "
        "main(sys.argv[2:], standalone_mode=False); "
        "open(sys.argv[1], 'w').write('\\n'.join(sorted(sys.modules)))"
    )
    got = []
    for run in ("first", "rerun"):
        out = tmp_path / f"{run}.txt"
        args = ["stats", dataset, "-q", "-o", str(tmp_path / f"{run}.json"), "--cache", str(tmp_path / "cache")]
        r = subprocess.run([sys.executable, "-c", code, str(out), *args], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        got.append(set(out.read_text().split()))
    assert (tmp_path / "first.json").read_bytes() == (tmp_path / "rerun.json").read_bytes()
    assert "numcodecs" in got[0] and "numcodecs" not in got[1]
    heavy = {"pandas", "xarray", "distributed", "dask.array", "dask.dataframe", "pyarrow", "fsspec", "zarr", "numba"}
    assert heavy & got[1] == set()


def keys_inside_pieces(monkeypatch) -> tuple[list[int], list[int]]:
    """Counts, while a run looks for a task's aligned pieces (``Job._pieces``), the nodes it keys
    (``Job.group_ids``): the first list the nodes keyed by each call made inside, the second each
    look's pieces kept."""
    keyed: list[int] = []
    kept: list[int] = []
    group_ids, pieces = engine.Job.group_ids, engine.Job._pieces
    inside: list[bool] = []

    def counted(self, spec, groups, keep="all", prefixes=None):
        if inside:
            keyed.append(len(groups))
        return group_ids(self, spec, groups, keep, prefixes)

    def in_pieces(self, *args, **kwargs):
        inside.append(True)
        try:
            got = pieces(self, *args, **kwargs)
        finally:
            inside.pop()
        kept.append(len(got or ()))
        return got

    monkeypatch.setattr(engine.Job, "group_ids", counted)
    monkeypatch.setattr(engine.Job, "_pieces", in_pieces)
    return keyed, kept


def test_a_first_cached_run_keys_no_piece_inside_its_tasks(tmp_path, monkeypatch):
    """In a folder with no entry (a first run, a killed run's first process), a task not found is
    kept in its aligned nodes, and no node inside them is keyed (``Job._pieces``: 15 keys a task
    of 8 chunks before, 0 now); the entries written are those a folder holding entries writes."""
    path = str(tmp_path / "d.zarr")
    l5dask.synthesize(path, num_scenes=12, seed=31, chunk_rows=CHUNKS)
    agents = len(l5dask.open_dataset(path)["agents"])
    path = str(tmp_path / "e.zarr")  # (79 agents chunks: the last task of 8 is 7, in 3 nodes)
    l5dask.synthesize(path, num_scenes=12, seed=31, chunk_rows={**CHUNKS, "agents": -(-agents // 79)})
    assert l5dask.open_dataset(path)["agents"].meta.nchunks == 79
    keyed, kept = keys_inside_pieces(monkeypatch)  # (kept: the pieces of each task kept in pieces)
    first = str(tmp_path / "first")
    want = public(compute_report(path, chunks_per_task=8))
    assert public(compute_report(path, cache=first, chunks_per_task=8)) == want
    # (the nodes of the last tasks of the agents, 72-75, 76-77 and 78, and of another pass)
    assert keyed == [n for n in kept if n] and 3 in keyed
    # a folder holding an entry of each reduction already (none of this run's: a piece maybe): the
    # nodes inside every task keyed, the same entries written
    other = tmp_path / "other"
    for e in cachelib.Cache(first).entries():
        (other / e["path"]).parent.mkdir(parents=True, exist_ok=True)
        name = e["path"].rsplit("/", 1)[1][: -len(cachelib.SUFFIX)].rsplit(".", 1)[0]  # (its reduction's part)
        stray = f"{name}.{cachelib.digest('not an entry of this run', name)}{cachelib.SUFFIX}"  # (a key of its own)
        (other / e["path"]).with_name(stray).write_bytes(b"not an entry of this run")
    keyed.clear()
    assert public(compute_report(path, cache=str(other), chunks_per_task=8)) == want
    assert sum(keyed) > 100
    names = {e["path"] for e in cachelib.Cache(first).entries()}
    assert names == {e["path"] for e in cachelib.Cache(str(other)).entries()} - {
        e["path"] for e in cachelib.Cache(str(other)).entries() if e["size"] == len(b"not an entry of this run")
    }


def test_a_restarted_run_keys_no_piece_inside_the_tasks_it_computes(dataset, tmp_path, monkeypatch):
    """A run killed part way finds, started again, its own tasks whole (and their aliases): a task
    not found is computed whole, no node inside it keyed (``Job._may_hold_pieces``; 51,257 keys of
    814 tasks at 1.03 G agents killed at 20 CPU-s), the tasks found read, the report bit for bit."""
    want = public(compute_report(dataset, chunks_per_task=8))
    cache = str(tmp_path / "cache")
    assert public(compute_report(dataset, cache=cache, chunks_per_task=8)) == want
    # (a killed run's cache: no pass kept whole nor its first tasks combined (a prefix), every
    # other agents task's entry removed, and the aliases, second keys of the entries, written
    # after them: none left naming a task removed)
    for e in cachelib.Cache(cache).entries():
        if e["path"].rsplit("/", 1)[1].startswith(("pass-", "prefix-")) or cachelib.key_of(e["path"]).startswith("r"):
            os.remove(os.path.join(cache, e["path"]))
    entries = [e for e in cachelib.Cache(cache).entries() if e["reduction"] == "agents-17"]
    removed = 0
    for e in sorted(entries, key=lambda e: e["path"])[::2]:
        os.remove(os.path.join(cache, e["path"]))
        removed += 1
    assert removed > 3
    keyed, _ = keys_inside_pieces(monkeypatch)
    with cachelib.counting() as st:
        assert public(compute_report(dataset, cache=cache, chunks_per_task=8)) == want
    assert 0 < st.misses <= removed and st.hits > 0 and st.damaged == 0
    assert sum(keyed) <= 4 * 3  # (the nodes of the last task of a pass: not those inside each task)


def test_the_keys_are_the_digest_of_what_a_task_computes_and_of_its_identities(dataset, tmp_path, monkeypatch):
    """A task's key, made of the ``repr`` of each chunk's identity made once a job, is
    ``cachelib.digest(what, own token, the chunks' identities, the parent rows' identity)`` as it
    always was (the entries of a cache written before are found): checked against that digest
    for every key of a cold run, a rerun after growth (parent rows by chunk and in memory)."""
    group_ids = engine.Job.group_ids
    checked: list[int] = []

    def reference(self, spec, groups, keep="all", prefixes=None):  # (the digest of the parts, made whole each time)
        got = group_ids(self, spec, groups, keep, prefixes)
        if got is None:
            return got
        source, link = spec.source, spec.parent
        ids = self._chunk_ids(source)
        red = spec.reduction if keep != "rows" else None
        per_group = red is not None and callable(red.cache_token)
        token = cachelib.reduction_token(red) if red is not None and not per_group else None
        rows = (
            cachelib.function_token(spec.rows) if keep == "rows" or (keep == "all" and spec.rows is not None) else None
        )
        what = (
            cachelib.FORMAT,
            cachelib.version(),
            "bounds and parent rows a chunk",
            "a task's parent rows those overlapping its own",
            keep,
            token,
            rows,
            sorted(spec.intervals) if keep != "rows" else [],
            spec.blocks,
            spec.encoded,
            link.start if link is not None else None,
        )
        want = []
        for first, n in groups:
            lo, hi = source.chunk_bounds(first)[0], source.chunk_bounds(first + n - 1)[1]
            parent, rows_in = None, None
            if link is not None and isinstance(link.parent, engine.Rows):
                rows_in = link.parent.overlapping(lo, hi, link.start)
                parent = cachelib.rows_digest(rows_in.offset, rows_in.cols)
            elif link is not None:
                parent = [link.parent.row_ids[k] for k in link.parent.chunks(link.interval or "", lo, hi)]
            own = red.cache_token(rows_in) if per_group else None
            want.append(cachelib.digest(what, own, ids[first : first + n], parent))
            if prefixes is not None:  # (an alias's key: the same parts, the parent rows' hash last)
                rows_in = engine.Rows(7, {"x": np.arange(first, first + n)})
                digest = cachelib.rows_digest(rows_in.offset, rows_in.cols)
                alias = cachelib.digest_repr(f"{prefixes[len(want) - 1]}{('rows', digest)!r})")
                assert alias == cachelib.digest(what, own, ids[first : first + n], ("rows", digest))
        assert got == want
        checked.append(len(got))
        return got

    monkeypatch.setattr(engine.Job, "group_ids", reference)
    cache = str(tmp_path / "cache")
    compute_report(dataset, cache=cache, chunks_per_task=2)
    l5dask.aggregate(dataset, by=["label"], values={"speed": ["mean"]}, cache=cache)
    extra = str(tmp_path / "extra.zarr")
    l5dask.synthesize(extra, num_scenes=1, seed=77, chunk_rows=CHUNKS)
    append_in_place(dataset, extra, str(tmp_path), monkeypatch)
    with cachelib.counting() as st:
        compute_report(dataset, cache=cache, chunks_per_task=2)
    assert st.hits > st.misses > 0 and len(checked) > 10 and sum(checked) > 100


class FoundByRows:
    """The tasks a run found by their parent rows (``engine._found_by_rows``): their chunks, found or not."""

    def __init__(self, monkeypatch) -> None:
        self.looked: list[tuple[str, bool]] = []
        found = engine._found_by_rows

        def counted(entry, alias, spec):
            got = found(entry, alias, spec)
            self.looked.append((cachelib.key_of(alias.path).split("-", 2)[:2] if alias else None, got is not None))
            return got

        monkeypatch.setattr(engine, "_found_by_rows", counted)

    def found(self) -> int:
        return sum(ok for _, ok in self.looked)


def agent_tasks_of_frames(ds, frame_lo: int, frame_hi: int, per_task: int) -> set[int]:
    """The agents tasks (``per_task`` chunks each) holding agents of frames ``frame_lo .. frame_hi - 1``."""
    iv = ds[fmt.FRAMES].read(0, ds[fmt.FRAMES].nchunks)["agent_index_interval"][frame_lo:frame_hi]
    rows = ds[fmt.AGENTS].meta.chunk_rows
    iv = iv[iv[:, 1] > iv[:, 0]]
    return set(range(int(iv[0, 0]) // rows // per_task, (int(iv[-1, 1]) - 1) // rows // per_task + 1))


def read_agent_tasks(reads: Reads, per_task: int) -> set[int]:
    return {
        int(k.rsplit("/", 1)[-1]) // per_task for k, a, b in reads.chunks() if k.split("/")[-2] == "agents" and b != 16
    }


def rewrite_frames_chunk(dataset: str, chunk: int, edit=None) -> None:
    """Frames chunk ``chunk`` written again as a new file (a new identity), its records ``edit``ed."""
    from l5dask.prediction.writing import encode_chunk

    frames = l5dask.open_dataset(dataset)[fmt.FRAMES]
    records = frames.read(chunk, 1).copy()
    if edit is not None:
        edit(records)
    path = os.path.join(dataset, frames.meta.key(chunk))
    with open(path + ".new", "wb") as f:
        f.write(encode_chunk(records, frames.meta.chunk_rows))
    os.replace(path + ".new", path)


def test_after_growth_old_agents_tasks_are_found_by_their_frame_rows(dataset, tmp_path, monkeypatch):
    """Issue 48: an agents task's key names the frames chunks it takes rows of, and the frames' last
    chunk grows as scenes are appended; the old agents tasks over its frames are then found by the
    frame rows they compute with (their alias): only the tasks of changed agents chunks run. Bit
    for bit the uncached report."""
    cache = str(tmp_path / "cache")
    compute_report(dataset, cache=cache, chunks_per_task=4)
    before = l5dask.open_dataset(dataset)
    extra = str(tmp_path / "extra.zarr")
    l5dask.synthesize(extra, num_scenes=1, seed=77, chunk_rows=CHUNKS)
    replaced = append_in_place(dataset, extra, str(tmp_path), monkeypatch)
    grown = l5dask.open_dataset(dataset)
    changed_agents = min(int(r.split("/")[1]) for r in replaced if r.startswith("agents/") and "/." not in r)
    changed_frames = min(int(r.split("/")[1]) for r in replaced if r.startswith("frames/") and "/." not in r)
    frames_lo = changed_frames * CHUNKS[fmt.FRAMES]
    # the old agents tasks whose frames are in the grown frames chunk (their keys changed)
    old = agent_tasks_of_frames(before, frames_lo, before.counts()["frames"], 4) - {changed_agents // 4}
    assert old and max(old) < changed_agents // 4, (old, changed_agents)
    reads, by_rows = Reads(monkeypatch), FoundByRows(monkeypatch)
    with cachelib.counting() as st:
        got = public(compute_report(dataset, cache=cache, chunks_per_task=4))
    monkeypatch.undo()
    assert got == public(compute_report(dataset, chunks_per_task=4))  # bit for bit the uncached report
    ran = read_agent_tasks(reads, 4)
    assert ran == set(range(changed_agents // 4, -(-grown[fmt.AGENTS].nchunks // 4))), (ran, changed_agents)
    assert by_rows.found() >= len(old) and not ran & old
    # the tasks found by their rows count as hits: the misses are the tasks that ran
    with cachelib.counting() as again:
        compute_report(dataset, cache=cache, chunks_per_task=4)
    assert again.misses == 0 and st.hits > 0 and st.misses >= len(ran)


def test_after_growth_a_fused_pass_with_an_aggregation_finds_its_old_tasks(dataset, tmp_path, monkeypatch):
    """A new user's trial: after an append, a job of the report and an aggregation (one fused pass)
    found 6 of 32 tasks where the report alone found 23, and read every agents chunk again. Its
    entries' names held the aggregation's dask token (the dataset's length in it) inside
    ``fused(...)``, and the old tasks are found by names (their aliases, by their frame rows). Now
    only the tasks from the changed agents chunk on run, as for the report alone; bit for bit the
    uncached results."""
    import pandas as pd

    from l5dask.analyses import Aggregate, Report

    def analyses():
        return {"report": Report(), "speeds": Aggregate(by="label", values={"speed": "mean"})}

    cache = str(tmp_path / "cache")
    l5dask.analyze(dataset, analyses(), cache=cache, chunks_per_task=4)
    extra = str(tmp_path / "extra.zarr")
    l5dask.synthesize(extra, num_scenes=1, seed=77, chunk_rows=CHUNKS)
    replaced = append_in_place(dataset, extra, str(tmp_path), monkeypatch)
    grown = l5dask.open_dataset(dataset)
    changed_agents = min(int(r.split("/")[1]) for r in replaced if r.startswith("agents/") and "/." not in r)
    reads = Reads(monkeypatch)
    got = l5dask.analyze(dataset, analyses(), cache=cache, chunks_per_task=4)
    monkeypatch.undo()
    want = l5dask.analyze(dataset, analyses(), chunks_per_task=4)
    assert public(got["report"]) == public(want["report"])
    pd.testing.assert_frame_equal(got["speeds"], want["speeds"], check_exact=True)
    ran = read_agent_tasks(reads, 4)
    assert ran == set(range(changed_agents // 4, -(-grown[fmt.AGENTS].nchunks // 4))), (ran, changed_agents)


def test_a_frame_row_changed_in_place_is_computed_again(dataset, tmp_path, monkeypatch):
    """A frames chunk written again: the agents tasks whose frame rows it changed run again (never a
    wrong hit), those whose frame rows are the same are found by them; and a chunk written again
    with the same rows (another file: its identity changes) leaves every agents task found. Each
    result bit for bit the uncached report of the data as it is."""
    cache = str(tmp_path / "cache")
    want_before = public(compute_report(dataset, cache=cache, chunks_per_task=2))
    ds = l5dask.open_dataset(dataset)
    nframes = ds[fmt.FRAMES].nchunks
    chunk = nframes // 2
    rows = CHUNKS[fmt.FRAMES]
    frame = chunk * rows + rows // 2  # (a frame in the middle of the chunk, with agents)
    touched = agent_tasks_of_frames(ds, frame, frame + 1, 2)
    overlapping = agent_tasks_of_frames(ds, chunk * rows, (chunk + 1) * rows, 2)
    assert len(overlapping) > len(touched) + 2

    def move_ego(records):
        records["ego_translation"][rows // 2, :2] += 250.0

    rewrite_frames_chunk(dataset, chunk, move_ego)
    reads, by_rows = Reads(monkeypatch), FoundByRows(monkeypatch)
    with cachelib.counting() as st:
        got = public(compute_report(dataset, cache=cache, chunks_per_task=2))
    monkeypatch.undo()
    want = public(compute_report(dataset, chunks_per_task=2))
    assert got == want and want != want_before  # (the distances to the ego of that frame's agents moved)
    assert read_agent_tasks(reads, 2) == touched, (read_agent_tasks(reads, 2), touched)
    assert by_rows.found() == len(overlapping - touched) and st.misses >= len(touched)

    # the last chunk written again, the same rows: every agents task over it found by its rows
    rewrite_frames_chunk(dataset, nframes - 1)
    reads, by_rows = Reads(monkeypatch), FoundByRows(monkeypatch)
    with cachelib.counting() as st:
        got = public(compute_report(dataset, cache=cache, chunks_per_task=2))
    monkeypatch.undo()
    assert got == want
    assert read_agent_tasks(reads, 2) == set() and by_rows.found() > 0
    assert all(ok for _, ok in by_rows.looked), by_rows.looked


def test_an_alias_names_an_entry_of_its_own_folder_only(tmp_path):
    """An alias read from a cache is followed only to a file of its own folder, by a checked name."""
    cache = cachelib.Cache(str(tmp_path))
    folder = cache.folder_of("d-agents")
    target = cachelib.Entry(cache, f"{folder}/agents-17.{'a' * 40}.l5c", {"reduction": "agents-17"})
    alias = cachelib.Entry(cache, f"{folder}/agents-17.{cachelib.alias_key(4, 2, 'b' * 40)}.l5c", target.about)
    assert cachelib.keep_alias(alias, target)
    assert cachelib.follow(alias) == target
    assert cachelib.alias_ranges([cachelib.key_of(os.path.basename(alias.path)), "c" * 40]) == {(4, 2)}
    for forged in ("../other/agents-17.%s.l5c" % ("a" * 40), "/etc/passwd", ".hidden.%s.l5c" % ("a" * 40), "x.l5c"):
        cachelib.store(alias, ("alias", forged))
        assert cachelib.follow(alias) is None, forged
    cachelib.store(alias, (1, 2))
    assert cachelib.follow(alias) is None
    with pytest.raises(ValueError):
        cachelib.keep_alias(alias, cachelib.Entry(cache, f"l5dask-cache-v3/other/agents-17.{'a' * 40}.l5c", {}))


def test_damaged_entries_are_recomputed_with_one_warning(dataset, tmp_path, caplog):
    cache = str(tmp_path / "cache")
    want = public(compute_report(dataset, cache=cache))
    entries = sorted(
        e["path"] for e in cachelib.Cache(cache).entries() if e["reduction"].split("-")[0] not in ("pass", "prefix")
    )
    whole = [e["path"] for e in cachelib.Cache(cache).entries() if "/pass-" in e["path"]]
    prefixes = [e["path"] for e in cachelib.Cache(cache).entries() if "/prefix-" in e["path"]]
    for path in prefixes:  # (the first tasks of a pass combined: gone, so that their tasks' entries are read)
        os.unlink(os.path.join(cache, path))
    for path in whole[:1]:  # (a pass's whole entry damaged: its tasks' entries read instead)
        with open(os.path.join(cache, path), "r+b") as f:
            f.seek(40)
            f.write(b"\xff")
    for path in whole[1:]:  # (the others gone: their tasks' entries read, some of them damaged)
        os.unlink(os.path.join(cache, path))
    root = os.path.join(cache, "")
    damage = {
        entries[0]: lambda b: b[: len(b) // 2],  # truncated
        entries[1]: lambda b: b[:-3] + bytes([b[-3] ^ 1]) + b[-2:],  # a flipped bit
        entries[2]: lambda b: b[:8] + (cachelib.FORMAT + 5).to_bytes(4, "little") + b[12:],  # another version
        entries[3]: lambda b: b"",
    }
    for path, how in damage.items():
        with open(root + path, "rb") as f:
            data = f.read()
        with open(root + path, "wb") as f:
            f.write(how(data))
    cachelib.reset_warnings()
    with caplog.at_level(logging.WARNING, logger="l5dask.cache"), cachelib.counting() as st:
        got = public(compute_report(dataset, cache=cache))
    assert got == want
    assert st.damaged == 4 + 1 and st.misses == 4 and st.written == 4 + len(whole) + len(prefixes)
    assert len([r for r in caplog.records if "damaged" in r.getMessage()]) == 1, caplog.text
    with cachelib.counting() as st:  # rewritten whole
        assert public(compute_report(dataset, cache=cache)) == want
    assert st.damaged == 0 and st.misses == 0


def test_an_entry_filed_under_another_tasks_name_is_not_trusted(dataset, tmp_path, caplog):
    """A new user's trial: sound entries of one reduction copied over each other's names (the
    passes' whole and prefix entries removed) were read as those tasks' partials, and the report
    came out wrong with no warning. An entry names itself; one under another name is damaged:
    ignored, one warning, counted, its task computed again; the answer is the uncached one."""
    cache = str(tmp_path / "cache")
    want = public(compute_report(dataset))
    assert public(compute_report(dataset, cache=cache)) == want
    listed = cachelib.Cache(cache).entries()
    for e in listed:
        if e["reduction"].split("-")[0] in ("pass", "prefix"):
            os.unlink(os.path.join(cache, e["path"]))
    by_reduction: dict[str, list[str]] = {}
    for e in listed:
        if e["reduction"].split("-")[0] not in ("pass", "prefix") and not os.path.basename(e["path"]).count(".r"):
            by_reduction.setdefault(e["reduction"], []).append(e["path"])
    paths = max(by_reduction.values(), key=len)  # (the agents' tasks: the most entries)
    assert len(paths) >= 3
    blobs = []
    for path in paths:
        with open(os.path.join(cache, path), "rb") as f:
            blobs.append(f.read())
    for path, data in zip(paths, blobs[1:] + blobs[:1]):  # (each task's entry moved to the next's name)
        with open(os.path.join(cache, path), "wb") as f:
            f.write(data)
    with open(os.path.join(cache, paths[0]), "rb") as f:
        moved = f.read()
    with pytest.raises(cachelib.Damaged, match="filed under another name"):
        cachelib.decode(moved, os.path.basename(paths[0]))
    assert cachelib.decode(moved, os.path.basename(paths[1])) is not None  # (sound under its own name)
    cachelib.reset_warnings()
    with caplog.at_level(logging.WARNING, logger="l5dask.cache"), cachelib.counting() as st:
        got = public(compute_report(dataset, cache=cache))
    assert got == want
    assert st.damaged >= len(paths), st
    assert "filed under another name" in caplog.text, caplog.text
    with cachelib.counting() as st:  # rewritten under their own names
        assert public(compute_report(dataset, cache=cache)) == want
    assert st.damaged == 0 and st.misses == 0


def test_a_cache_that_cannot_be_written_is_one_warning(dataset, tmp_path, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    cachelib.reset_warnings()
    with caplog.at_level(logging.WARNING, logger="l5dask.cache"), cachelib.counting() as st:
        got = public(compute_report(dataset, cache=str(blocker / "cache")))
    assert got == public(compute_report(dataset))
    assert len(caplog.records) == 1 and "cannot write to the cache" in caplog.text, caplog.text
    assert st.hits == st.written == 0 and st.write_failures == 1
    for url in ("http://example.com/cache", "/tmp/x.zip", "memory://a::s3://b"):
        with pytest.raises(UsageError, match="cannot write a cache"):
            cachelib.open_cache(url)


def test_the_command_line(dataset, tmp_path):
    cache = str(tmp_path / "cache")
    run = lambda *a: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "l5dask.cli", *a], capture_output=True, text=True, env=dict(os.environ)
    )
    cold = run("stats", dataset, "--cache", cache, "-q", "-o", str(tmp_path / "a.json"))
    assert cold.returncode == 0, cold.stderr
    warm = run("stats", dataset, "--cache", cache, "-q", "-o", str(tmp_path / "b.json"))
    # (-q with -o: one line saying where)
    assert warm.returncode == 0 and warm.stdout == cold.stdout.replace("a.json", "b.json")
    assert (tmp_path / "a.json").read_text() == (tmp_path / "b.json").read_text()
    info = run("cache", "info", cache)
    assert info.returncode == 0 and "agents" in info.stdout and "entries" in info.stdout, info.stderr
    total = cachelib.info(cachelib.Cache(cache))
    assert f"{total['entries']:,} entries" in info.stdout
    assert {r["source"] for r in total["by"]} == {"agents", "frames", "scenes", "traffic_light_faces"}
    entries = sorted(cachelib.Cache(cache).entries(), key=lambda e: (e["mtime"], e["path"]))
    keep = sum(e["size"] for e in entries[len(entries) // 2 :])
    pruned = run("cache", "prune", cache, "--max-size", str(keep))
    assert pruned.returncode == 0, pruned.stderr
    left = cachelib.Cache(cache).entries()
    assert sum(e["size"] for e in left) <= keep and {e["path"] for e in left} <= {
        e["path"] for e in entries[-len(left) :]
    }
    bad = run("stats", dataset, "--cache", "http://example.com/c", "-q")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "cannot write a cache" in bad.stderr
    bad = run("cache", "prune", cache, "--max-size", "lots")
    assert bad.returncode == 2 and "expected a size" in bad.stderr and "Traceback" not in bad.stderr
    # the columns of info line up (traffic_light_faces is wider than the others)
    rows = [line for line in run("cache", "info", cache).stdout.splitlines() if line.endswith("B")][1:]
    assert len(rows) >= 2 and any("traffic_light_faces" in r for r in rows), rows
    assert len({line.index(" entries") for line in rows}) == 1, rows
    assert len({line.rindex(f" {line.split()[2]} ") for line in rows}) == 1, rows  # (the reductions' column)


def test_what_is_not_a_cache_is_refused_in_one_line(dataset, tmp_path):
    run = lambda *a: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "l5dask.cli", *map(str, a)], capture_output=True, text=True, cwd=tmp_path
    )
    (tmp_path / "job.toml").write_text("x = 1\n")
    (tmp_path / "empty").mkdir()
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    for command in ("info", "prune"):
        extra = ["--max-size", "1GB"] if command == "prune" else []
        for location, message in (
            ("nonexist", "nonexist: no such cache (the folder does not exist)"),
            (dataset, f"{dataset}: is in a dataset ({dataset}); a cache is a folder of its own"),
            ("empty/..", f"empty/..: not an l5dask cache (it holds no {cachelib.FOLDER} folder)"),
            ("job.toml", "job.toml: is a file; a cache is a folder"),
        ):
            r = run("cache", command, location, *extra)
            assert (r.returncode, r.stdout, r.stderr) == (2, "", f"l5dask: error: {message}\n"), (command, location)
    # an empty folder is an empty cache
    r = run("cache", "info", "empty")
    assert (r.returncode, r.stdout) == (0, "empty: 0 entries, 0 B\n"), r.stderr
    # a file where the cache's folder is needed: refused, not one warning
    r = run("stats", dataset, "--cache", "job.toml", "-q")
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == "l5dask: error: --cache job.toml: is a file; a cache is a folder\n"
    # the same from dask config: named as it was given (no --cache was)
    r = subprocess.run(
        [sys.executable, "-m", "l5dask.cli", "stats", str(dataset), "-q", "-o", "r.json"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "DASK_L5DASK__CACHE": "job.toml"},
    )
    assert (r.returncode, r.stdout) == (2, "") and not (tmp_path / "r.json").exists()
    assert r.stderr == (
        "l5dask: error: l5dask.cache (DASK_L5DASK__CACHE or a config file): job.toml: is a file; a cache is a folder\n"
    )
    # a dataset's folder, or one in it: refused (a cache written there would be among its arrays)
    inside = tmp_path / "copy.zarr"
    shutil.copytree(dataset, inside)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    for location in (inside, inside / "cache", inside / "agents"):
        r = run("stats", dataset, "--cache", location, "-q")
        assert (r.returncode, r.stdout) == (2, ""), location
        assert (
            r.stderr.startswith(f"l5dask: error: --cache {location}: is in a dataset (") and r.stderr.count("\n") == 1
        )
        assert r.stderr.endswith("); a cache is a folder of its own\n"), r.stderr
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


KILLED = """
import sys, time
from l5dask.core import cache as cachelib
from l5dask.prediction import reading
gather = reading.Encoded.gather
def slow(*a, **k):  # (slower reads: the reductions, and so the keys, are the same)
    # once a third of the agents' tasks are stored, much slower: the signal comes before the end even
    # when a crowded machine lets the test look at the cache seldom (it once came after the run ended)
    stored = sum(e["reduction"] == "agents-17" and not cachelib.key_of(e["path"]).startswith("r")
                 for e in cachelib.Cache(sys.argv[2]).entries())
    time.sleep(0.02 if stored < int(sys.argv[3]) // 3 else 0.5)
    return gather(*a, **k)
reading.Encoded.gather = slow
from l5dask.prediction.report import compute_report
compute_report(sys.argv[1], cache=sys.argv[2], chunks_per_task=1)
"""


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT], ids=["SIGKILL", "Ctrl-C"])
def test_a_killed_run_computes_only_what_it_had_not_stored(dataset, tmp_path, sig):
    cache = str(tmp_path / "cache")
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(KILLED))
    total = l5dask.open_dataset(dataset)["agents"].nchunks
    proc = subprocess.Popen(
        [sys.executable, str(script), dataset, cache, str(total)], stderr=subprocess.PIPE, preexec_fn=ctrl_c_reaches_it
    )
    # (a task's entries: not the aliases that name them, found by their frame rows)
    kept = lambda: [e for e in cachelib.Cache(cache).entries() if not cachelib.key_of(e["path"]).startswith("r")]  # noqa: E731
    agents = lambda: [e for e in kept() if e["reduction"] == "agents-17"]  # noqa: E731
    deadline = time.time() + 120
    while len(agents()) < total // 3 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)
    proc.send_signal(sig)
    proc.wait(60)
    assert proc.returncode != 0  # (killed before it was done)
    assert 0 < len(agents()) < total
    stored = len(kept())
    with cachelib.counting() as st:
        got = public(compute_report(dataset, cache=cache, chunks_per_task=1))
    with cachelib.counting() as whole:  # (the tasks of the run, in a cache of their own)
        assert got == public(compute_report(dataset, cache=str(tmp_path / "other"), chunks_per_task=1))
    assert st.damaged == 0  # (nothing half-written was left visible)
    # every task the killed run stored is read, not computed; only the others are computed
    assert st.hits == stored and st.misses == whole.misses - stored and len(agents()) == total


def test_two_jobs_sharing_a_cache_at_once(dataset, tmp_path):
    cache = str(tmp_path / "cache")
    code = "import sys; from l5dask.prediction.report import compute_report as r; r(sys.argv[1], cache=sys.argv[2])"
    procs = [subprocess.Popen([sys.executable, "-c", code, dataset, cache], stderr=subprocess.PIPE) for _ in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0 and b"damaged" not in err, err
    with cachelib.counting() as st:
        assert public(compute_report(dataset, cache=cache)) == public(compute_report(dataset))
    assert st.misses == 0 and st.damaged == 0


def same(report: dict) -> dict:
    """A report without its private keys nor the dataset's name (the same data on S3 and locally)."""
    return {k: v for k, v in public(report).items() if k != "dataset"}


def test_on_s3_threads_and_a_cluster(s3, s3_small, small_ds, dask_cluster, monkeypatch, tmp_path):
    """The dataset and the cache in buckets of a real S3 endpoint; on threads, then on a real
    cluster whose workers write and read the entries."""
    from distributed import Client

    s3.make_bucket("l5-cache")
    # s3fs's filesystems shared, as a user gets them (the suite's skip_instance_cache built a
    # botocore session, ~0.5 s, for each entry written: 40 s of this test); no listing kept
    options = {k: v for k, v in s3.storage_options().items() if k != "skip_instance_cache"}
    options["use_listings_cache"] = False
    want = same(compute_report(small_ds))
    with cachelib.counting() as cold:
        assert same(compute_report(s3_small, storage_options=options, cache="s3://l5-cache/c")) == want
    reads = Reads(monkeypatch)
    with cachelib.counting() as warm:
        assert same(compute_report(s3_small, storage_options=options, cache="s3://l5-cache/c")) == want
    assert warm.hits == cold.misses and warm.misses == 0
    assert header_probes_only([(k.split("small.zarr/", 1)[-1], a, b) for k, a, b in reads.chunks()], small_ds)
    monkeypatch.undo()
    with Client(dask_cluster.address, set_as_default=False) as client:
        with cachelib.counting() as cold:
            got = same(compute_report(s3_small, storage_options=options, cache="s3://l5-cache/k", scheduler=client))
        # (counted from the workers' events; and each of the 3 passes whole)
        assert got == want and cold.written >= cold.misses + 3 and cold.misses > 5
        with cachelib.counting() as warm:
            got = same(compute_report(s3_small, storage_options=options, cache="s3://l5-cache/k", scheduler=client))
        assert got == want and warm.hits == cold.misses and warm.misses == 0 and warm.bytes_read > 0
        local = str(tmp_path / "local-cache")  # (a folder the workers share with this process)
        compute_report(small_ds, cache=local, scheduler=client)
        with cachelib.counting() as warm:
            assert same(compute_report(small_ds, cache=local, scheduler=client)) == want
        assert warm.misses == 0 and warm.hits > 5


def test_many_analyses_in_one_pass_are_cached_too(dataset, tmp_path, monkeypatch):
    """A fused pass (the report, the catalog and two aggregations of one dataset: l5dask.analyze)
    keeps its entries as a pass alone does: its rerun reads no chunk, its results bit for bit."""
    from l5dask.prediction.analyses import Aggregate, Catalog, Report, analyze

    cache = str(tmp_path / "cache")
    analyses = {
        "report": Report(),
        "catalog": Catalog(),
        "near": Aggregate("agents", by=["label"], values={"speed": ["mean", "q90"]}, where="distance_to_ego < 20"),
        "far": Aggregate("agents", by=["label"], values={"speed": ["mean", "q90"]}, where="distance_to_ego >= 20"),
    }
    with cachelib.counting() as cold:
        first = analyze(dataset, analyses, cache=cache)
    reads = Reads(monkeypatch)
    with cachelib.counting() as warm:
        again = analyze(dataset, analyses, cache=cache)
    assert warm.hits == cold.misses > 5 and warm.misses == 0 and header_probes_only(reads.chunks(), dataset)
    assert public(again["report"]) == public(first["report"])
    assert again["catalog"].equals(first["catalog"])
    assert again["near"].equals(first["near"]) and again["far"].equals(first["far"])
    assert not again["near"].equals(again["far"])  # (each member of the fused entry its own where)


def test_cached_or_not_the_same_bits_before_and_after_growth(dataset, tmp_path, monkeypatch):
    """Every run groups a pass's chunks into the same tasks, cached or not (aligned groups, no
    guided end): float sums (means, variances) of an uncached run, a cold cached run, a warm one
    and, after scenes are appended, a run that reuses the entries are the same bits (a dataset
    whose chunk count is no power of two: the guided end of an uncached run made its last tasks
    smaller)."""
    from l5dask.prediction.analyses import Aggregate, Catalog, Report, analyze

    cache = str(tmp_path / "cache")
    kw = {"by": ["label"], "values": {"speed": ["mean", "var", "std", "sum"]}}
    scenes = {"by": ["scene_index"], "values": {"speed": ["mean", "var"]}, "where": "speed > 0.5"}
    analyses = {"report": Report(), "catalog": Catalog(), "all": Aggregate("agents", **kw)}

    def runs(**cached):
        return (
            l5dask.aggregate(dataset, **kw, **cached),
            l5dask.aggregate(dataset, **scenes, **cached),
            analyze(dataset, analyses, **cached),
        )

    def same(got, want) -> None:
        import pandas as pd

        for g, w in ((got[0], want[0]), (got[1], want[1]), (got[2]["all"], want[2]["all"])):
            pd.testing.assert_frame_equal(g, w, check_exact=True)
            for col in g.columns:
                if g[col].dtype.kind == "f":
                    assert np.array_equal(g[col].to_numpy(), w[col].to_numpy(), equal_nan=True), col
        pd.testing.assert_frame_equal(got[2]["catalog"], want[2]["catalog"], check_exact=True)
        assert public(got[2]["report"]) == public(want[2]["report"])

    nagents = l5dask.open_dataset(dataset)["agents"].nchunks
    assert nagents & (nagents - 1) and nagents > 8, nagents  # (no power of two)
    uncached = runs()
    with cachelib.counting() as cold:
        same(runs(cache=cache), uncached)
    with cachelib.counting() as warm:
        same(runs(cache=cache), uncached)
    assert cold.written > 10 and warm.hits == cold.hits + cold.misses and warm.misses == 0
    extra = str(tmp_path / "extra.zarr")
    l5dask.synthesize(extra, num_scenes=1, seed=78, chunk_rows=CHUNKS)
    append_in_place(dataset, extra, str(tmp_path), monkeypatch)
    grown = l5dask.open_dataset(dataset)["agents"].nchunks
    assert grown > nagents and grown & (grown - 1), grown
    with cachelib.counting() as after:
        reused = runs(cache=cache)
    assert after.hits > after.misses > 0, after
    same(reused, runs())  # the uncached runs of the grown dataset
