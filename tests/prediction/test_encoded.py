"""Columns gathered straight from blosc-compressed chunks (``l5dask/_blosc.h``) against numcodecs'
decode and numpy, on chunks built to reach each branch of blosc's layout: shuffled or not, split
streams (record sizes up to 16 bytes), many blocks with a shorter last one, stored (incompressible)
chunks, padded last chunks, other codecs (which go back to numcodecs), and corrupt bytes."""

from __future__ import annotations

import numpy as np
import pytest
from numcodecs import Blosc

import l5dask
from l5dask.errors import ChunkError
from l5dask.prediction import format as fmt
from l5dask.prediction.kernels import Gather

AGENT = fmt.DTYPES[fmt.AGENTS]
#: every number element of an agent, and the label argmax
ELEMENTS = [
    ("centroid", (0,)),
    ("centroid", (1,)),
    ("extent", (0,)),
    ("extent", (1,)),
    ("extent", (2,)),
    ("yaw", ()),
    ("velocity", (0,)),
    ("velocity", (1,)),
    ("track_id", ()),
]
SMALL = np.dtype([("a", "<u2"), ("p", "<f4", (2,)), ("b", "u1"), ("c", "i1")])  # 12 bytes: split streams


def _agents(n: int, seed: int, noisy: bool) -> np.ndarray:
    """Agents whose label probabilities hold ties, -0.0, infinities and NaN (numpy's argmax rule)."""
    rng = np.random.default_rng(seed)
    rec = np.zeros(n, AGENT)
    rec["centroid"] = rng.normal(0, 500, (n, 2))
    rec["extent"] = rng.random((n, 3)) * 5
    rec["yaw"] = rng.normal(0, 2, n)
    rec["velocity"] = rng.normal(0, 5, (n, 2))
    rec["track_id"] = rng.integers(0, 2**63, n, dtype=np.uint64) if noisy else np.arange(n) // 7
    probs = rng.choice(np.array([0.0, -0.0, 0.25, 0.5, 1.0, np.inf, -np.inf], np.float32), (n, 17))
    probs[rng.random(probs.shape) < 0.003] = np.nan
    probs[: n // 10] = 0.5  # all equal: the first wins
    if noisy:
        probs = rng.random((n, 17)).astype(np.float32)
    rec["label_probabilities"] = probs
    if not noisy:  # compressible: runs of equal rows
        rec[n // 2 :] = np.repeat(rec[n // 2 : n // 2 + 10], -(-(n - n // 2) // 10))[: n - n // 2]
    return rec


def _small(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    rec = np.zeros(n, SMALL)
    rec["a"] = rng.integers(0, 50, n)
    rec["p"] = rng.choice(np.array([0.0, 1.0, 2.0, np.nan], np.float32), (n, 2))
    rec["b"] = rng.integers(0, 3, n)
    rec["c"] = rng.integers(-3, 3, n)
    return rec


def _want(records: np.ndarray, elements, argmax) -> list[np.ndarray]:
    return [np.ascontiguousarray(records[f][(slice(None), *i)]) for f, i in elements] + [
        records[f].argmax(1).astype(np.int8) for f in argmax
    ]


def _assert_same(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g.view(f"u{g.dtype.itemsize}"), w.view(f"u{w.dtype.itemsize}"))  # bit for bit


LZ4 = [  # (codec, expected to be read without numcodecs)
    (Blosc(cname="lz4", clevel=5, shuffle=Blosc.SHUFFLE, blocksize=0), True),  # L5Kit's
    (Blosc(cname="lz4", clevel=5, shuffle=Blosc.SHUFFLE, blocksize=1000), True),  # many blocks, a short last one
    (Blosc(cname="lz4", clevel=1, shuffle=Blosc.NOSHUFFLE, blocksize=0), True),
    (Blosc(cname="lz4hc", clevel=5, shuffle=Blosc.SHUFFLE, blocksize=0), True),  # LZ4's format too
    (Blosc(cname="zstd", clevel=3, shuffle=Blosc.SHUFFLE, blocksize=0), False),
    (Blosc(cname="blosclz", clevel=5, shuffle=Blosc.SHUFFLE, blocksize=0), False),
    (Blosc(cname="lz4", clevel=5, shuffle=Blosc.BITSHUFFLE, blocksize=0), False),
]


@pytest.mark.parametrize("codec,direct", LZ4, ids=[f"{c.cname}-{c.shuffle}-{c.blocksize}" for c, _ in LZ4])
@pytest.mark.parametrize("noisy", [False, True], ids=["compressible", "incompressible"])
def test_agents_gathered_from_compressed_chunks_equal_numpy(codec, direct, noisy):
    chunk_rows = 5000
    rec = _agents(chunk_rows, 3, noisy)
    raw = codec.encode(rec)
    stored = bool(raw[2] & 0x02)  # incompressible: stored as it is (memcpyed), whatever the codec
    if noisy and codec.cname == "lz4" and codec.shuffle == Blosc.NOSHUFFLE:
        assert stored  # that branch is reached
    plan = Gather(AGENT, ELEMENTS, ["label_probabilities"])
    for rows, row0 in [(chunk_rows, 0), (chunk_rows - 1, 3), (1234, 7), (1, 0)]:  # padded last chunks, offsets
        outs, maxes = plan.outputs(rows + row0)
        done, _ = plan.blosc(raw, chunk_rows, rows, outs, maxes, row0, np.empty(0, np.uint8))
        assert done == (direct or stored)
        if done:
            _assert_same([o[row0:] for o in outs + maxes], _want(rec[:rows], ELEMENTS, ["label_probabilities"]))
        # with each row's maximum too (numpy's max: NaN where the row holds one), from the bytes and the records
        values = plan.value_outputs(rows + row0)
        outs, maxes = plan.outputs(rows + row0)
        done, _ = plan.blosc(raw, chunk_rows, rows, outs, maxes, row0, np.empty(0, np.uint8), None, values)
        if done:
            _assert_same([values[0][row0:]], [rec["label_probabilities"][:rows].max(1)])
            _assert_same([o[row0:] for o in maxes], _want(rec[:rows], [], ["label_probabilities"]))
        values = plan.value_outputs(rows + row0)
        plan.records(rec[:rows], *plan.outputs(rows + row0), row0, None, values)
        _assert_same([values[0][row0:]], [rec["label_probabilities"][:rows].max(1)])


@pytest.mark.parametrize("blocksize", [0, 1536, 2000])
def test_split_streams_of_small_records_equal_numpy(blocksize):
    """Records of at most 16 bytes: blosc compresses each byte stream of a block on its own."""
    rec = _small(20000, blocksize)
    raw = Blosc(cname="lz4", clevel=5, shuffle=Blosc.SHUFFLE, blocksize=blocksize).encode(rec)
    elements = [("a", ()), ("p", (1,)), ("b", ()), ("c", ())]
    plan = Gather(SMALL, elements, ["p"])
    for rows in (20000, 19999, 333):
        outs, maxes = plan.outputs(rows)
        done, _ = plan.blosc(raw, 20000, rows, outs, maxes, 0, np.empty(0, np.uint8))
        assert done
        _assert_same(outs + maxes, _want(rec[:rows], elements, ["p"]))


def test_corrupt_or_foreign_bytes_are_left_to_numcodecs():
    """Corrupt bytes are never read as data: the chunk goes back to numcodecs (which says what is
    wrong); a chunk of another size or record size too."""
    rec = _agents(5000, 4, False)
    raw = bytearray(Blosc(cname="lz4", clevel=5, shuffle=Blosc.SHUFFLE, blocksize=2000).encode(rec))
    plan = Gather(AGENT, ELEMENTS, ["label_probabilities"])
    outs, maxes = plan.outputs(5000)
    empty = np.empty(0, np.uint8)
    assert not plan.blosc(bytes(raw[:100]), 5000, 5000, outs, maxes, 0, empty)[0]  # truncated
    assert not plan.blosc(bytes(raw[:10]), 5000, 5000, outs, maxes, 0, empty)[0]  # not even a header
    broken = bytearray(raw)
    broken[8:12] = (2**31 - 1).to_bytes(4, "little")  # a block size past the chunk's (no 2 GB of scratch)
    assert not plan.blosc(bytes(broken), 5000, 5000, outs, maxes, 0, empty)[0]
    broken = bytearray(raw)
    broken[16:24] = b"\xff" * 8  # block starts past the end
    assert not plan.blosc(bytes(broken), 5000, 5000, outs, maxes, 0, empty)[0]
    broken = bytearray(raw)
    broken[len(raw) // 2 :] = bytes(len(raw) - len(raw) // 2)  # compressed streams zeroed
    assert not plan.blosc(bytes(broken), 5000, 5000, outs, maxes, 0, empty)[0]
    assert not plan.blosc(bytes(raw), 4000, 4000, outs, maxes, 0, empty)[0]  # another chunk size
    other = Blosc(cname="lz4", clevel=5, shuffle=Blosc.SHUFFLE).encode(rec.view(np.uint8).view("<f4"))  # typesize 4
    assert not plan.blosc(other, 5000, 5000, outs, maxes, 0, empty)[0]


@pytest.fixture
def copy(tmp_path, small_ds):
    import shutil

    dst = tmp_path / "copy.zarr"
    shutil.copytree(small_ds, dst)
    return dst


def test_aggregate_and_dataframe_name_a_corrupt_chunk(copy):
    """Through the passes that read chunks undecoded: a corrupt chunk is named, as everywhere."""
    chunk = copy / "agents" / "2"
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2 :] = bytes(len(data) - len(data) // 2)
    chunk.write_bytes(bytes(data))
    ds = l5dask.open_dataset(copy)
    with pytest.raises(ChunkError, match=r"array 'agents', chunk '2': truncated or corrupt"):
        l5dask.aggregate(ds, "agents", by=["label"], values={"speed": ["mean"]}, scheduler="sync")
    with pytest.raises(ChunkError, match=r"array 'agents', chunk '2': truncated or corrupt"):
        ds.to_dask_dataframe("agents", columns=["label", "speed"]).compute(scheduler="sync")


def test_encoded_block_equals_decoded_records(small_ds):
    """An undecoded block's columns and records are the decoded block's, padded last chunk included."""
    ds = l5dask.open_dataset(small_ds)
    agents = ds["agents"]
    n = agents.nchunks
    for first, count in [(0, n), (n - 1, 1), (1, 2)]:
        block = agents.read_encoded(first, count)
        records = agents.read(first, count)
        assert len(block) == len(records)
        outs, maxes = block.gather(ELEMENTS, ["label_probabilities"])
        _assert_same(outs + maxes, _want(records, ELEMENTS, ["label_probabilities"]))
        np.testing.assert_array_equal(block.records().view(np.uint8), records.view(np.uint8))


@pytest.mark.parametrize("group", [1, 2, 3])
def test_streamed_chunks_come_in_groups_whose_rows_are_the_records(small_ds, monkeypatch, group):
    """A streaming pass gets ``PIECE_ROWS`` rows of whole stored chunks at a time (one at least),
    in order, the last group shorter: their starts, rows and records are those of the decoded
    chunks, each chunk once."""
    from l5dask.prediction import reading

    agents = l5dask.open_dataset(small_ds)["agents"]
    rows = agents.meta.chunk_rows
    monkeypatch.setattr(reading, "PIECE_ROWS", group * rows + (rows - 1 if group > 1 else 0))  # (whole chunks)
    first, n = 1, agents.nchunks - 1  # (an odd start, the padded last chunk)
    got = list(agents.iter_encoded(first, n))
    assert [len(e.chunks) for _, e in got] == [min(group, n - k) for k in range(0, n, group)]
    assert [i for _, e in got for i, _ in e.chunks] == list(range(first, first + n))
    records = agents.read(first, n)
    lo = agents.chunk_bounds(first)[0]
    for start, block in got:
        assert start == agents.chunk_bounds(block.chunks[0][0])[0]
        np.testing.assert_array_equal(
            block.records().view(np.uint8), records[start - lo : start - lo + len(block)].view(np.uint8)
        )


def test_an_encoded_pass_takes_no_rows_or_intervals(small_ds):
    from l5dask.core.engine import Pass

    ds = l5dask.open_dataset(small_ds)
    with pytest.raises(ValueError, match="encoded pass"):
        Pass(ds["frames"], rows=lambda *a: None, blocks=True, encoded=True)
    with pytest.raises(ValueError, match="encoded pass"):
        Pass(ds["agents"], intervals={"x": 1}, encoded=True)
    Pass(ds["agents"], encoded=True)  # chunk by chunk (the report's agents), or in blocks


def test_aggregate_and_dataframe_gather_agents_without_decoding_them(small_ds, monkeypatch):
    """The passes that hand chunks over undecoded make the agents' columns without numcodecs (the
    frames, whose join rows are kept as records, are decoded)."""
    from l5dask.prediction import reading

    decoded, decode = [], reading.decode_chunk
    monkeypatch.setattr(reading, "decode_chunk", lambda *a, **kw: decoded.append(a[1].name) or decode(*a, **kw))
    ds = l5dask.open_dataset(small_ds)
    got = l5dask.aggregate(ds, "agents", by=["scene_index", "label"], values={"speed": ["mean"]}, scheduler="sync")
    frame = ds.to_dask_dataframe("agents", columns=["label", "speed", "centroid_x"], joins=["host"]).compute(
        scheduler="sync"
    )
    assert fmt.AGENTS not in decoded and fmt.FRAMES in decoded
    records = ds["agents"].read(0, ds["agents"].nchunks)
    np.testing.assert_array_equal(frame["centroid_x"].to_numpy(), records["centroid"][:, 0])
    np.testing.assert_array_equal(frame["label"].cat.codes.to_numpy(), records["label_probabilities"].argmax(1))
    assert int(got.speed_mean.notna().sum()) == len(got) > 0


def test_outputs_that_cannot_hold_the_rows_are_refused():
    """The compiled loops write to the outputs' memory: short, mistyped or strided ones are refused."""
    rec = _agents(100, 5, False)
    raw = Blosc(cname="lz4", clevel=5, shuffle=Blosc.SHUFFLE).encode(rec)
    plan = Gather(AGENT, [("velocity", (0,))], ["label_probabilities"])
    empty = np.empty(0, np.uint8)
    for outs, maxes, row0 in [
        ([np.empty(99, np.float32)], [np.empty(100, np.int8)], 0),
        ([np.empty(100, np.float32)], [np.empty(100, np.int8)], 1),
        ([np.empty(100, np.float64)], [np.empty(100, np.int8)], 0),
        ([np.empty(200, np.float32)[::2]], [np.empty(100, np.int8)], 0),
        ([], [np.empty(100, np.int8)], 0),
    ]:
        with pytest.raises(ValueError, match="gather: an output per column"):
            plan.blosc(raw, 100, 100, outs, maxes, row0, empty)
        with pytest.raises(ValueError, match="gather: an output per column"):
            plan.records(rec, outs, maxes, row0)
    with pytest.raises(ValueError, match="out of range"):
        plan.blosc(raw, 100, 101, [np.empty(101, np.float32)], [np.empty(101, np.int8)], 0, empty)


def test_a_truncated_chunk_is_refused_before_blosc_reads_past_its_end(small_ds):
    """blosc reads as many bytes as a chunk's header says: a chunk cut short anywhere is refused
    by its length (it once crashed the process, reading past the end of a 50-byte chunk)."""
    from l5dask.prediction.reading import Encoded, decode_chunk, fetch_chunks

    agents = l5dask.open_dataset(small_ds)["agents"]
    ((_, raw),) = fetch_chunks(agents.store, agents.meta, 1, 1)
    for cut in (0, 10, 16, 50, len(raw) // 2, len(raw) - 1):
        with pytest.raises(ChunkError, match=r"array 'agents', chunk '1': truncated or corrupt"):
            decode_chunk(raw[:cut], agents.meta, True, "1")
        with pytest.raises(ChunkError, match=r"truncated or corrupt"):
            Encoded(agents.meta, True, [(1, raw[:cut])]).gather(ELEMENTS, ["label_probabilities"])


FACE = fmt.DTYPES[fmt.TL_FACES]


def _faces(n: int, seed: int, kind: str) -> np.ndarray:
    """Faces whose ids reach each branch of the distinct set from byte streams: L5Kit's 4 ASCII
    characters (4 streams vary), one id throughout a block (none vary), ids of up to 16 characters
    beyond ASCII (all 64 streams may vary: keys of 8 words), and ids that differ in one byte only."""
    rng = np.random.default_rng(seed)
    rec = np.zeros(n, FACE)
    rec["traffic_light_face_status"] = rng.choice(np.array([0.0, 1.0, np.nan], np.float32), (n, 3))
    if kind == "l5kit":
        pool = np.array(["".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz+/0123456789"), 4)) for _ in range(300)])
        pool[0] = ""
        rec["face_id"] = pool[rng.integers(0, len(pool), n)]
    elif kind == "constant":
        rec["face_id"] = "same"
        rec["face_id"][n // 2 :] = "other"
    elif kind == "wide":
        alphabet = list("aé€😀 Zx\u0100\U00010348")
        pool = np.array(["".join(rng.choice(alphabet, rng.integers(0, 17))) for _ in range(2000)])
        rec["face_id"] = pool[rng.integers(0, len(pool), n)]
    else:  # one byte apart
        rec["face_id"] = np.array([f"id{c}" for c in "abcdefgh"])[rng.integers(0, 8, n)]
    rec["traffic_light_id"] = rec["face_id"]
    return rec


STORED = Blosc(cname="lz4", clevel=0, shuffle=Blosc.SHUFFLE, blocksize=0)  # (stored as they are: memcpyed)


@pytest.mark.parametrize("kind", ["l5kit", "constant", "wide", "one-byte"])
@pytest.mark.parametrize(
    "codec",
    [c for c, _ in LZ4[:4]] + [STORED],
    ids=[f"{c.cname}-{c.shuffle}-{c.blocksize}" for c, _ in LZ4[:4]] + ["stored"],
)
def test_distinct_face_ids_from_compressed_chunks_equal_numpy(kind, codec):
    """The distinct values of a field, found straight in the compressed blocks, are numpy's
    ``unique`` of the rows read (a padded last chunk's padding never counts), with the statuses'
    argmax; from the records too."""
    chunk_rows = 3000
    rec = _faces(chunk_rows, 5, kind)
    rec["face_id"][-5:] = "padding"  # past the rows read in a padded last chunk
    raw = codec.encode(rec)
    assert bool(raw[2] & 0x02) == (codec is STORED)
    plan = Gather(FACE, [], ["traffic_light_face_status"], "face_id")
    for rows in (chunk_rows, chunk_rows - 5, 777, 1):
        outs, maxes = plan.outputs(rows)
        found: list[np.ndarray] = []
        done, _ = plan.blosc(raw, chunk_rows, rows, outs, maxes, 0, np.empty(0, np.uint8), found)
        assert done
        (values,) = found
        assert values.dtype == FACE["face_id"] and len(values) == len(set(values.tolist()))
        assert sorted(values.tolist()) == np.unique(rec["face_id"][:rows]).tolist()
        _assert_same(maxes, _want(rec[:rows], [], ["traffic_light_face_status"]))
        found = []
        want_outs, want_maxes = plan.outputs(rows)
        plan.records(rec[:rows], want_outs, want_maxes, 0, found)
        assert sorted(found[0].tolist()) == np.unique(rec["face_id"][:rows]).tolist()
        # each row's value as a code: its index among the values found (rows from row0 on)
        for records in (False, True):
            row0 = 3
            codes = np.full(rows + row0, -1, np.int32)
            found = []
            if records:
                plan.records(rec[:rows], *plan.outputs(rows + row0), row0, found, None, codes)
            else:
                plan.blosc(
                    raw, chunk_rows, rows, *plan.outputs(rows + row0), row0, np.empty(0, np.uint8), found, None, codes
                )
            (values,) = found
            assert len(values) == len(set(values.tolist())) and (codes[:row0] == -1).all()
            assert values[codes[row0:]].tolist() == rec["face_id"][:rows].tolist()


def test_codes_of_distinct_values_across_the_chunks_of_a_block(small_ds):
    """An Encoded block of several chunks: each row's code indexes the concatenation of the values
    every chunk found (a value found in two chunks has two codes, each its own)."""
    from l5dask.prediction.kernels import gather

    faces = l5dask.open_dataset(small_ds)[fmt.TL_FACES]
    block = faces.read_encoded(0, faces.nchunks)
    assert len(block.chunks) > 2
    for source in (block, block.records()):
        found: list[np.ndarray] = []
        codes: list[np.ndarray] = []
        if isinstance(source, np.ndarray):
            gather(source, [], ["traffic_light_face_status"], "face_id", found, codes=codes)
        else:
            source.gather([], ["traffic_light_face_status"], "face_id", found, codes=codes)
        assert np.concatenate(found)[codes[0]].tolist() == block.records()["face_id"].tolist()


def test_distinct_values_of_a_number_field_and_what_a_plan_refuses():
    """Any fixed-size field: float32 triples compared as bytes (-0.0 and 0.0 differ, as bytes);
    a plan that finds values needs a list to put them in; an object field is refused."""
    rec = _faces(2000, 6, "l5kit")
    rec["traffic_light_face_status"][::3] = [-0.0, 1.0, 2.0]
    raw = Blosc(cname="lz4", clevel=5, shuffle=Blosc.SHUFFLE, blocksize=1400).encode(rec)
    plan = Gather(FACE, [], [], "traffic_light_face_status")
    found: list[np.ndarray] = []
    assert plan.blosc(raw, 2000, 2000, *plan.outputs(2000), 0, np.empty(0, np.uint8), found)[0]
    got = found[0].view(np.uint8).reshape(len(found[0]), 12)
    want = np.unique(rec["traffic_light_face_status"].view(np.uint8).reshape(2000, 12), axis=0)
    assert found[0].shape == (len(want), 3) and sorted(map(bytes, got)) == sorted(map(bytes, want))
    with pytest.raises(ValueError, match="need a list"):
        plan.blosc(raw, 2000, 2000, *plan.outputs(2000), 0, np.empty(0, np.uint8))
    with pytest.raises(ValueError, match="field of objects"):
        Gather(np.dtype([("a", "O"), ("b", "<f4")]), [], [], "a")


def test_the_report_finds_face_ids_in_the_compressed_bytes(small_ds, monkeypatch):
    """The report's faces are never decoded, and count what numpy counts of the decoded faces."""
    from l5dask.prediction import reading
    from l5dask.prediction.report import compute_report

    decoded, decode = [], reading.decode_chunk
    monkeypatch.setattr(reading, "decode_chunk", lambda *a, **kw: decoded.append(a[1].name) or decode(*a, **kw))
    report = compute_report(str(small_ds), scheduler="sync")
    assert "traffic_light_faces" not in decoded and "agents" not in decoded
    faces = l5dask.open_dataset(small_ds)["traffic_light_faces"]
    rec = faces.read(0, faces.nchunks)
    assert report["tl_faces"]["unique_faces"] == len(np.unique(rec["face_id"])) > 1
    counts = np.bincount(rec["traffic_light_face_status"].argmax(1), minlength=3)
    assert list(report["tl_faces"]["status_counts"].values()) == counts.tolist()


def test_a_block_s_chunks_are_taken_as_they_come(small_ds):
    """A fused pass's block (``fetch_chunks``) is worked on as its chunks come: the chunks'
    numbers are known before any bytes, nothing is taken before a reader asks for it, the first
    gather takes them one at a time, in order, and the columns are those of the bytes fetched whole;
    a read that failed is raised where its chunk is taken. Indexing and slicing are a list's."""
    from l5dask.prediction.reading import Arriving, Encoded, fetch_chunks

    agents = l5dask.open_dataset(small_ds)["agents"]
    n = min(5, agents.meta.nchunks)
    assert n >= 3
    fetched = fetch_chunks(agents.store, agents.meta, 0, n)
    assert isinstance(fetched, Arriving) and fetched.indices == list(range(n))
    whole = list(fetched)
    taken: list[int] = []

    def coming():
        for index, raw in whole:
            taken.append(index)
            yield raw

    arriving = Arriving([i for i, _ in whole], coming())
    block = Encoded(agents.meta, True, arriving)
    assert taken == [] and (block.start, block.stop) == (0, agents.meta.chunk_bounds(n - 1)[1])
    assert block.spans() == Encoded(agents.meta, True, whole).spans() and taken == []
    seen = []
    first = arriving[0]  # (one chunk taken, no more)
    assert first == whole[0] and taken == [0]
    for index, _ in arriving:
        seen.append((index, list(taken)))
    assert seen == [(i, list(range(i + 1))) for i in range(n)]  # (each taken when its turn came)
    got = Encoded(agents.meta, True, Arriving(range(n), (raw for _, raw in whole))).gather(
        ELEMENTS, ["label_probabilities"]
    )
    exp = Encoded(agents.meta, True, whole).gather(ELEMENTS, ["label_probabilities"])
    for a, b in zip(got[0] + got[1], exp[0] + exp[1]):
        np.testing.assert_array_equal(a, b)
    # indexing and slicing as a list's
    for k in (0, 1, -1, -n, n - 1, slice(None), slice(1, 3), slice(-2, None), slice(None, None, 2), slice(3, 1)):
        assert Arriving(range(n), (raw for _, raw in whole))[k] == whole[k]
    for k in (n, -n - 1):
        with pytest.raises(IndexError):
            Arriving(range(n), (raw for _, raw in whole))[k]

    # several threads at once take each chunk once, in order; pickled, the list of its chunks
    import pickle
    import threading

    arriving = Arriving(range(n), (raw for _, raw in whole))
    got_by: list[list] = [[] for _ in range(4)]
    threads = [threading.Thread(target=lambda k=k: got_by[k].extend(arriving)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(g == whole for g in got_by)
    half = Arriving(range(n), (raw for _, raw in whole))
    half[1]
    assert pickle.loads(pickle.dumps(half)) == whole
    block = Encoded(agents.meta, True, Arriving(range(n), (raw for _, raw in whole)))
    again = pickle.loads(pickle.dumps(block))
    for a, b in zip(again.gather(ELEMENTS)[0], exp[0]):
        np.testing.assert_array_equal(a, b)

    def failing():
        yield whole[0][1]
        raise OSError("the disk said no")

    block = Encoded(agents.meta, True, Arriving(range(n), failing()))
    with pytest.raises(OSError, match="the disk said no"):
        block.gather(ELEMENTS, ["label_probabilities"])


def test_a_piece_is_40000_rows_of_whole_chunks(small_ds):
    """The agents' chunks of 20,000 rows come two at a time, the faces' of 10,000 four, one
    larger than the piece alone."""
    from types import SimpleNamespace

    from l5dask.prediction.reading import PIECE_ROWS, piece_chunks

    assert PIECE_ROWS == 40_000
    got = [piece_chunks(SimpleNamespace(chunk_rows=r)) for r in (20_000, 10_000, 50_000, 1, 30_000)]
    assert got == [2, 4, 1, 40_000, 1]
