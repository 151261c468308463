"""Properties of the hand-written parsers and codecs against a reference, over generated inputs
(``tests/strategies.py``): the compiled blosc gather against numcodecs (records, dtypes, codecs,
shuffles, block sizes and damaged headers), the CSV number parser against ``float()``, the
quantile sketch against its stated bound, ``where`` against the same condition in numpy, and
the token index against a dict, and part of a chunk read against the whole chunk decoded."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from numcodecs import Blosc

from l5dask.core.codec import check_blosc, decode_blosc, typesize_of
from l5dask.errors import ChunkError, L5DaskError
from l5dask.prediction import format as fmt
from l5dask.prediction.aggregation import evaluate_where
from l5dask.prediction.kernels import Gather
from l5dask.prediction.reading import Encoded

from . import strategies as s
from .gather_reference import gather_verdict
from .partial_reference import compiled_read_verdict, partial_gather_verdict, partial_verdict, plan_for

SETTINGS = settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)


def _plan(dtype: np.dtype) -> tuple[list, list]:
    elements, argmax = [], []
    for name in dtype.names:
        sub = dtype.fields[name][0]
        if sub.kind == "U":  # (strings: their distinct values only)
            continue
        if sub.shape:
            elements += [(name, (0,)), (name, (sub.shape[0] - 1,))]
            if sub.base == np.dtype("<f4"):
                argmax.append(name)
        else:
            elements.append((name, ()))
    return elements, argmax


@SETTINGS
@given(data=st.data(), dtype=s.record_dtypes(), chunk_rows=st.integers(1, 2500), params=s.BLOSC)
def test_the_compressed_gather_and_numcodecs_agree_on_every_chunk(data, dtype, chunk_rows, params):
    rows = data.draw(st.integers(0, chunk_rows))
    rec = data.draw(s.records(dtype, chunk_rows))
    rec[rows:] = np.zeros(1, dtype)  # the padding, as zarr writes it
    clean = Blosc(**params).encode(rec)
    raw = data.draw(s.damaged(clean))
    elements, argmax = _plan(dtype)
    distinct = data.draw(st.sampled_from([None, *dtype.names]))  # (a field's distinct values too)
    plan = Gather(dtype, elements, argmax, distinct)
    status, why, accepted, ref = gather_verdict(plan, raw, chunk_rows, rows)  # (asserts the readers agree)
    event(f"gather status {status}, header rule {'accepts' if why is None else 'refuses'}")
    if raw == clean:
        assert why is None and status in (0, 1) and accepted and ref is not None and ref.tobytes() == rec.tobytes()
    # every path through the readers: the same verdict, the same numbers
    meta = fmt.ArrayMeta("t", dtype, max(rows, 1) if rows else 0, chunk_rows)
    if meta.length == 0:
        return
    encoded, found = Encoded(meta, True, [(0, raw)]), []
    try:
        gathered = encoded.gather(elements, argmax, distinct, found)
    except ChunkError:
        gathered = None
    try:
        decoded = Encoded(meta, True, [(0, raw)]).records()
    except ChunkError:
        decoded = None
    assert (gathered is None) == (decoded is None)
    if decoded is not None:
        want, wmax = plan.outputs(len(decoded))
        plan.records(decoded, want, wmax, 0, [])
        for got, exp in zip([*gathered[0], *gathered[1]], [*want, *wmax]):
            assert got.tobytes() == exp.tobytes()
        if distinct is not None:
            width = dtype[distinct].itemsize
            as_rows = lambda a: {bytes(r) for r in np.ascontiguousarray(a).view(np.uint8).reshape(-1, width)}  # noqa: E731
            assert set().union(*map(as_rows, found)) == as_rows(decoded[distinct])


def partial_case(data, dtype, chunk_rows: int, params: dict):
    """A stored chunk and sorted row ranges of it, for the tests of reading part of a chunk:
    ``(records, clean chunk, stored bytes (maybe damaged), meta, chunk index, ranges)``; the chunk
    first or not, short or not (its padding zeros, as zarr writes it), the ranges any, or the last
    rows of a whole chunk (its short last block alone)."""
    tail = data.draw(st.booleans())
    rows = chunk_rows if tail else data.draw(st.integers(1, chunk_rows))
    index = data.draw(st.integers(0, 2))
    rec = data.draw(s.records(dtype, chunk_rows))
    rec[rows:] = np.zeros(1, dtype)
    clean = Blosc(**params).encode(rec)
    raw = data.draw(s.damaged(clean))
    if tail:
        cuts = [rows - data.draw(st.integers(1, min(rows, 40))), rows]
    else:
        cuts = sorted(data.draw(st.lists(st.integers(0, rows), min_size=2, max_size=6, unique=True)))
    start = index * chunk_rows
    ranges = [(start + a, start + b) for a, b in zip(cuts[::2], cuts[1::2])]
    return rec, clean, raw, fmt.ArrayMeta("t", dtype, start + rows, chunk_rows), index, ranges


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data(), dtype=s.record_dtypes(), chunk_rows=st.integers(1, 2500), params=s.BLOSC)
def test_reading_part_of_a_chunk_equals_slicing_it_decoded_whole(data, dtype, chunk_rows, params):
    """``read_chunk_rows`` (only the blosc blocks that hold the rows) of any sorted row ranges, in
    a chunk of any records, codec, shuffle and block size (more than 64 blocks too, or stored
    without compression), short or not, first or not: the same rows as numcodecs' decode of the
    whole chunk, sliced. Damaged: refused in one line, or the whole chunk's rows where it decodes
    (``tests/partial_reference.py``)."""
    rec, clean, raw, meta, index, ranges = partial_case(data, dtype, chunk_rows, params)
    start = index * chunk_rows
    got, whole = partial_verdict(raw, meta, index, ranges)  # (asserts: one line, or the whole chunk's rows)
    event(f"{'clean' if raw == clean else 'damaged'}: {'read' if got is not None else 'refused'}")
    if raw == clean:
        want = np.frombuffer(Blosc().decode(clean), dtype)  # numcodecs alone
        assert got is not None and whole is not None
        for (lo, hi), part in zip(ranges, got):
            assert part.tobytes() == want[lo - start : hi - start].tobytes() == rec[lo - start : hi - start].tobytes()


@SETTINGS
@given(data=st.data(), dtype=s.record_dtypes(), chunk_rows=st.integers(1, 2500), params=s.BLOSC)
def test_the_compressed_gather_of_row_ranges_is_their_rows_gathered_decoded(data, dtype, chunk_rows, params):
    """``Gather.blosc_ranges``: any sorted, disjoint ranges of a chunk's rows, each to any place
    of the outputs, with the distinct values and each row's code: status 0 only where numcodecs
    decodes the chunk, and then the numbers of those rows gathered from its records; -1 only where
    numcodecs refuses it (every block is decompressed, those holding no wanted row too)."""
    rec = data.draw(s.records(dtype, chunk_rows))
    clean = Blosc(**params).encode(rec)
    raw = data.draw(s.damaged(clean))
    cuts = sorted(data.draw(st.lists(st.integers(0, chunk_rows), max_size=8, unique=True)))
    ranges = list(zip(cuts[::2], cuts[1::2]))
    dst, end = [], 0
    for lo, hi in ranges:  # (each range's rows anywhere after the one before's)
        end += data.draw(st.integers(0, 3))
        dst.append(end)
        end += hi - lo
    plan = plan_for(dtype, data.draw(st.sampled_from([None, *dtype.names])))
    outs, maxes = plan.outputs(end)
    vals, codes, found = plan.value_outputs(end), np.full(end, -1, np.int32), []
    lo, hi = (np.array([r[k] for r in ranges], np.int64) for k in (0, 1))
    status, _ = plan.blosc_ranges(
        raw, chunk_rows, lo, hi, np.array(dst, np.int64), outs, maxes, np.empty(0, np.uint8), found, vals, codes
    )
    event(f"status {status}")
    if check_blosc(raw, chunk_rows * dtype.itemsize, typesize_of(dtype.itemsize)) is not None:
        return  # (numcodecs reads past the end of such chunks: the one rule refuses them first)
    ref = np.empty(chunk_rows, dtype)
    try:
        decode_blosc(raw, ref)
    except (RuntimeError, ValueError):
        ref = None
    assert (status == 0) <= (ref is not None) and (status == -1) <= (ref is None)
    if raw == clean:
        assert status in (0, 1)
    if status != 0 or ref is None:
        return
    for (a, b), at in zip(ranges, dst):
        want, wmax = plan.outputs(b - a)
        wvals, wfound = plan.value_outputs(b - a), []
        plan.records(ref[a:b], want, wmax, 0, wfound if plan.distinct else None, wvals)
        for got, exp in zip([*outs, *maxes, *vals], [*want, *wmax, *wvals]):
            assert got[at : at + b - a].tobytes() == exp.tobytes()
        if plan.distinct is not None:
            width = dtype[plan.distinct].itemsize
            seen = np.ascontiguousarray(found[0]).view(np.uint8).reshape(-1, width)
            rows = np.ascontiguousarray(ref[a:b][plan.distinct]).view(np.uint8).reshape(-1, width)
            assert np.array_equal(seen[codes[at : at + b - a]], rows)
            assert len(found) == 1 and len({bytes(r) for r in seen}) == len(seen)


def _pieces(spans, size: int = 4096) -> set[int]:
    """The 4 KB pieces (a disk's reads: O_DIRECT's, the page cache's pages) that byte ranges cover."""
    return {k for a, b in spans if b > a for k in range(a // size, (b - 1) // size + 1)}


@SETTINGS
@given(data=st.data(), dtype=s.record_dtypes(), chunk_rows=st.integers(1, 2500), params=s.BLOSC)
def test_a_chunk_read_in_part_from_a_local_disk_reads_the_pieces_of_its_blocks_once(data, dtype, chunk_rows, params):
    """The reads of a local chunk read in part (``read_chunk_part``), any sorted row ranges of a
    chunk of any records, codec, shuffle and block size: the 4 KB pieces they cover (what a disk
    reads) are exactly those of the header, of the blocks that hold the rows (of their bytes, for
    a chunk stored without compression) and of the chunk's last byte, computed here from the
    chunk's header; and after the header no two reads are less than 4 KB apart (they would be one
    read of no more pieces: one wait on the disk fewer). The last short block alone is read with
    the whole chunk."""
    import os
    import struct
    import tempfile

    from l5dask.core import store as storemod
    from l5dask.prediction.reading import _HEAD_BYTES, read_chunk_part

    rec, clean, _, meta, index, ranges = partial_case(data, dtype, chunk_rows, params)
    start, item = index * chunk_rows, dtype.itemsize
    flags, nbytes, blocksize, cbytes = clean[2], *struct.unpack_from("<iii", clean, 4)
    top = 16 + (0 if flags & 0x02 else 4 * -(-nbytes // blocksize))
    if flags & 0x02:  # (memcpyed: the rows' bytes after the header)
        wanted = [(16 + (lo - start) * item, 16 + (hi - start) * item) for lo, hi in ranges]
    else:
        n = -(-nbytes // blocksize)
        firsts = struct.unpack_from(f"<{n}i", clean, 16)
        ends = {a: min([b for b in firsts if b > a], default=cbytes) for a in firsts}
        blocks = {
            k
            for lo, hi in ranges
            for k in range((lo - start) * item // blocksize, ((hi - start) * item - 1) // blocksize + 1)
        }
        if blocks == {n - 1} and nbytes % blocksize:
            event("the last short block alone: the chunk read whole")
            return
        wanted = [(firsts[k], ends[firsts[k]]) for k in blocks]
    reads: list[tuple[int, int]] = []
    real = storemod.LocalFile.read

    def counted(file, a=None, b=None):
        got = real(file, a, b)
        reads.append((a, a + len(got)))
        return got

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, meta.key(index))
        os.makedirs(os.path.dirname(path))
        with open(path, "wb") as f:
            f.write(clean)
        storemod.LocalFile.read = counted
        try:
            read_chunk_part(storemod.Store(tmp), meta, index, ranges)
        finally:
            storemod.LocalFile.read = real
    head = [r for r in reads if r[0] == 0 and r[1] <= max(_HEAD_BYTES, top)]
    assert _pieces(reads) == _pieces([(0, min(top, cbytes)), *wanted, (cbytes - 1, cbytes)])
    rest = sorted(r for r in reads if r not in head)
    assert all(b2 - b1 >= 4096 for (_, b1), (b2, _) in zip(rest, rest[1:])), rest
    event(f"{len(rest)} reads after the header")


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(
    data=st.data(),
    dtype=s.record_dtypes(),
    chunk_rows=st.integers(1, 2500),
    params=s.BLOSC,
    direct=st.booleans(),
    cold=st.booleans(),
)
def test_the_compiled_reads_of_a_chunk_in_part_are_the_python_paths(data, dtype, chunk_rows, params, direct, cold):
    """A local chunk read in part with its reads made at once by the compiled reader
    (``l5dask.core._pread.read_part``: its own plan of the blocks from the header) against the same
    chunk read by the Python path one read at a time (``reading._read_part``), any records, codec,
    shuffle, block size (more than 64 blocks, stored without compression), short or not, first or
    not, any sorted row ranges (a chunk's last short block alone), through the page cache or
    around it, cold or cached: the same rows or the same one-line refusal; each piece read is the
    file's bytes; a sound chunk's reads exactly the Python path's, its file opened once
    (``tests/partial_reference.py``). Where it is sound, its rows decoded are the whole chunk's."""
    rec, clean, raw, meta, index, ranges = partial_case(data, dtype, chunk_rows, params)
    got, how = compiled_read_verdict(raw, meta, index, ranges, direct, cold)
    event(how)
    if raw == clean:
        assert not isinstance(got, str), got
        start = index * chunk_rows
        for (lo, hi), rows in zip(ranges, got.decode(meta, index, ranges)):
            assert rows.tobytes() == rec[lo - start : hi - start].tobytes()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data(), dtype=s.record_dtypes(), chunk_rows=st.integers(1, 2500), params=s.BLOSC)
def test_gathering_part_of_a_chunk_equals_slicing_it_decoded_whole(data, dtype, chunk_rows, params):
    """The compressed gather from the blosc blocks ``read_chunk_part`` reads (a restricted
    dataset's pass: :class:`~l5dask.prediction.scenes.ViewChunk`) of any sorted row ranges, in a
    chunk of any records, codec, shuffle and block size, short or not, first or not: the numbers,
    argmaxes, maxima, distinct values and codes that the same gather makes of the whole chunk's
    rows decoded by numcodecs, sliced. Damaged: refused in one line, or those of the whole chunk
    where it decodes (``tests/partial_reference.py``)."""
    rec, clean, raw, meta, index, ranges = partial_case(data, dtype, chunk_rows, params)
    start = index * chunk_rows
    plan = plan_for(dtype, data.draw(st.sampled_from([None, *dtype.names])))
    got, whole = partial_gather_verdict(raw, meta, index, ranges, plan)
    event(f"{'clean' if raw == clean else 'damaged'}: {'read' if got is not None else 'refused'}")
    if raw == clean:
        assert got is not None and whole is not None
        want = np.concatenate([rec[lo - start : hi - start] for lo, hi in ranges])
        assert got[-1].tobytes() == want.tobytes()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data(), dtype=s.record_dtypes(), chunk_rows=st.integers(1, 2500), params=s.BLOSC)
def test_every_blosc_encoding_zarr_python_2_decodes_is_read_as_it_reads_it(data, dtype, chunk_rows, params):
    """Valid chunks L5Kit does not write but zarr-python 2 decodes: a blosc type size that is not
    the record size, bytes after the compressed size (never read). Each is read, by the decode and
    by the compressed gather, as zarr-python 2 reads the same chunk (they were refused), except a
    chunk shuffled by another type size: refused as valid but not supported, since a damaged type
    size is unshuffled the same way, into other numbers, without an error."""
    import zarr

    rows = data.draw(st.integers(1, chunk_rows))
    rec = data.draw(s.records(dtype, chunk_rows))
    rec[rows:] = np.zeros(1, dtype)
    nbytes = rec.nbytes
    typesize = data.draw(st.sampled_from([d for d in range(1, 256) if nbytes % d == 0]))
    flat = rec.view(np.uint8)
    raw = Blosc(**params).encode(flat.view(f"V{typesize}") if typesize > 1 else flat)
    raw += data.draw(st.binary(max_size=40))
    store = {".zarray": fmt.zarray_json(dtype, rows, chunk_rows), "0": raw}
    want = zarr.open_array(store, mode="r")[:]  # zarr-python 2, L5Kit's reader
    assert want.tobytes() == rec[:rows].tobytes()
    meta = fmt.ArrayMeta("t", dtype, rows, chunk_rows)
    other = raw[3] != typesize_of(dtype.itemsize) and raw[2] & 0x05 and not raw[2] & 0x02  # shuffled by another
    event(f"type size {'another' if raw[3] != typesize_of(dtype.itemsize) else 'the record'}'s, shuffled {raw[2] & 5}")
    if other:
        for read in (
            lambda: Encoded(meta, True, [(0, raw)]).records(),
            lambda: Encoded(meta, True, [(0, raw)]).gather(*_plan(dtype), None, []),
        ):
            with pytest.raises(ChunkError, match="shuffled by another type size is valid but not supported"):
                read()
        return
    assert Encoded(meta, True, [(0, raw)]).records().tobytes() == want.tobytes()
    elements, argmax = _plan(dtype)
    plan = Gather(dtype, elements, argmax)
    status, why, accepted, _ = gather_verdict(plan, raw, chunk_rows, rows)  # (the readers agree)
    assert why is None and accepted and status in (0, 1)
    gathered = Encoded(meta, True, [(0, raw)]).gather(elements, argmax, None, [])
    expect, emax = plan.outputs(rows)
    plan.records(want, expect, emax, 0, [])
    for got, exp in zip([*gathered[0], *gathered[1]], [*expect, *emax]):
        assert got.tobytes() == exp.tobytes()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cells=st.lists(s.number_cells(), min_size=4, max_size=120).filter(lambda c: len(c) % 4 == 0))
def test_the_csv_number_parser_equals_float(cells, tmp_path_factory):
    from l5dask.evaluation.csvfiles import gt_header, read_gt_csv

    path = tmp_path_factory.mktemp("csv") / "gt.csv"
    lines = [",".join(gt_header(2))] + [
        f"{i},{i},1.0,0.0," + ",".join(cells[4 * i : 4 * i + 4]) for i in range(len(cells) // 4)
    ]
    path.write_text("\n".join(lines) + "\n")
    got = np.asarray(read_gt_csv(str(path)).coords.compute(scheduler="sync"), np.float64).reshape(-1)
    want = np.array([float(c) for c in cells], np.float64)
    assert got.view(np.uint64).tolist() == want.view(np.uint64).tolist()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    values=st.lists(
        st.one_of(st.floats(-1e12, 1e12).filter(lambda v: v == 0 or abs(v) > 1e-300), st.just(np.nan)),
        min_size=1,
        max_size=300,
    ),
    groups=st.integers(1, 4),
    bits=st.sampled_from([0, 3, 12, 20, 52]),
    qs=st.lists(st.floats(0, 1), min_size=1, max_size=3, unique=True),
    parts=st.integers(1, 3),
)
# (NaN rows of a group beyond those of the values: refused by the sketch's table)
@example(values=[0.0, np.nan, 32.0, np.nan], groups=4, bits=3, qs=[0.0], parts=1)
def test_the_quantile_sketch_is_within_its_stated_bound(values, groups, bits, qs, parts):
    """numpy's "linear" quantile within 2**-(bits + 1) of the larger of the two order statistics it
    interpolates (``l5dask.prediction.dataframe.quantiles``' contract); NaN skipped."""
    import dask.dataframe as dd

    from l5dask.prediction.dataframe import quantiles

    v = np.array(values, np.float64)
    g = np.arange(len(v)) % groups
    df = dd.from_pandas(pd.DataFrame({"g": g, "v": v}), npartitions=min(parts, len(v)))
    got = quantiles(df, ["g"], "v", qs, quantile_bits=bits)
    assert list(got.columns) == list(qs)
    for key in range(groups):
        x = np.sort(v[(g == key) & ~np.isnan(v)])
        assert (key in got.index) == bool(len(x))  # a group of NaN only has no row
        for q in qs if len(x) else ():
            value = float(got.loc[key, q])
            want = float(np.quantile(x, q))
            h = (len(x) - 1) * q
            lo, hi = x[int(np.floor(h))], x[min(int(np.floor(h)) + 1, len(x) - 1)]
            bound = 2.0 ** -(bits + 1) * max(abs(lo), abs(hi)) * (1 + 1e-9) + 1e-300
            assert abs(value - want) <= bound, (q, value, want, bound)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    values=st.lists(st.one_of(st.integers(-300, 300), st.integers(-(2**62), 2**62)), min_size=1, max_size=200),
    groups=st.integers(1, 4),
    bits=st.sampled_from([0, 3, 8, 12, 20, 52]),
    qs=st.lists(st.floats(0, 1), min_size=1, max_size=3, unique=True),
    parts=st.integers(1, 3),
)
def test_integer_quantiles_are_numpys_or_refused(values, groups, bits, qs, parts):
    """An int64 column's quantiles through the dataframes' sketch: numpy's (of the float64 values,
    to the bit) or a one-line refusal naming quantile_bits=52; always numpy's when every value is
    below 2**(bits + 1) in size (each bucket then holds one integer) or at 52 bits."""
    import dask.dataframe as dd

    from l5dask.prediction.dataframe import quantiles

    v = np.array(values, np.int64)
    g = np.arange(len(v)) % groups
    df = dd.from_pandas(pd.DataFrame({"g": g, "v": v}), npartitions=min(parts, len(v)))
    small = bits == 52 or bool((np.abs(v.astype(np.float64)) < 2.0 ** (bits + 1)).all())
    try:
        got = quantiles(df, ["g"], "v", qs, quantile_bits=bits)
    except L5DaskError as exc:
        assert not small and "quantile_bits=52" in str(exc) and "\n" not in str(exc), str(exc)
        event("refused")
        return
    event("exact")
    for key in range(groups):
        x = v[g == key].astype(np.float64)
        for q in qs if len(x) else ():
            assert float(got.loc[key, q]) == float(np.quantile(x, q)), (key, q)


class _Chunk(dict):
    def __len__(self) -> int:
        return len(self["x"])


@settings(max_examples=200, deadline=None)
@given(expr=s.where_expressions(), data=st.data())
def test_where_equals_the_same_condition_in_numpy(expr, data):
    text, fn = expr
    cols = data.draw(s.where_columns(data.draw(st.integers(1, 40))))
    got = evaluate_where(text, _Chunk(cols), {})
    with np.errstate(invalid="ignore"):
        want = np.broadcast_to(fn(cols), (len(cols["x"]),))
    assert got.tolist() == want.tolist(), text


_INT_DTYPES = [np.int8, np.uint8, np.int16, np.int32, np.uint32, np.int64, np.uint64]


@settings(max_examples=300, deadline=None)
@given(
    dtype=st.sampled_from(_INT_DTYPES),
    op=st.sampled_from(["+", "-", "*", "**", "//", "%", "/"]),
    data=st.data(),
    constant=st.one_of(st.integers(-5, 5), st.integers(-(2**64), 2**64), st.sampled_from([2**31, 2**63 - 1, -(2**63)])),
    bound=st.integers(-(2**65), 2**65),
    swap=st.booleans(),
)
def test_integer_arithmetic_in_where_is_exact_or_refused(dtype, op, data, constant, bound, swap):
    """Integer arithmetic in a ``where`` keeps the rows Python's exact integers keep, or is refused
    in one line when a value does not fit int64: never wrapped (numpy wraps ``track_id - 5`` of an
    unsigned column, and an int32 column times 1000, silently; pandas' query too)."""
    info = np.iinfo(dtype)
    k = np.array(data.draw(st.lists(st.integers(int(info.min), int(info.max)), min_size=1, max_size=20)), dtype)
    if op == "**":
        constant = abs(constant) % 70
        swap = False
    left, right = ("k", str(constant)) if not swap else (str(constant), "k")
    text = f"{left} {op} {right} < {bound}"
    exact: list = []
    by_zero = False
    for v in map(int, k):
        a, b = (v, constant) if not swap else (constant, v)
        if op in ("//", "%", "/") and b == 0:
            by_zero = True  # (numpy gives 0 or infinity: a condition true of every row)
            continue
        fn = {"+": a.__add__, "-": a.__sub__, "*": a.__mul__, "**": a.__pow__, "//": a.__floordiv__, "%": a.__mod__}
        exact.append(float(a) / float(b) if op == "/" else fn[op](b))
    fits = all(-(2**63) <= int(v) < 2**63 for v in k) and -(2**63) <= constant < 2**63 and not by_zero
    fits = fits and all(-(2**63) <= e < 2**63 for e in exact if op != "/")
    try:
        got = evaluate_where(text, _Chunk({"x": k, "k": k}), {})
    except L5DaskError as exc:
        assert not fits, (text, str(exc))
        assert "\n" not in str(exc) and "where" in str(exc)
        return
    assert fits, (text, exact)
    if op == "/":  # (true division is float64's, as numpy's and pandas': the bound a float64 too)
        assert got.tolist() == [e < float(bound) for e in exact], text
        return
    assert got.tolist() == [e < bound for e in exact], text


@settings(max_examples=150, deadline=None)
@given(
    table=st.lists(s.TOKENS, max_size=60),
    queries=st.lists(s.TOKENS, max_size=40),
    splits=st.lists(st.integers(0, 60), max_size=3),
)
def test_the_token_index_equals_a_dict(table, queries, splits):
    from l5dask.perception.links import EMPTY, lookup, token_index

    cuts = sorted({min(c, len(table)) for c in splits} | {0, len(table)})
    chunked = pa.chunked_array(
        [pa.array(table[a:b], pa.string()) for a, b in zip(cuts, cuts[1:])] or [pa.array([], pa.string())], pa.string()
    )
    first: dict[str, int] = {}
    for i, t in enumerate(table):
        first.setdefault(t, i)
    index = token_index(chunked)
    queries = queries + table[:5] + [None]
    got = lookup(pa.array(queries, pa.string()), index, EMPTY)
    want = [EMPTY if q is None or (q == "" and q not in first) else first.get(q, -1) for q in queries]
    assert got.tolist() == want
    dups = [i for i, t in enumerate(table) if first[t] != i]
    assert (index.dup_row >= 0) == bool(dups)
    if dups:
        assert (index.dup_first, index.dup_row) == (first[table[dups[0]]], dups[0])


@settings(max_examples=300, deadline=None)
@given(
    counts=st.lists(st.integers(0, 7), min_size=0, max_size=40),
    before=st.integers(0, 5),
    bounds=st.tuples(st.integers(-3, 300), st.integers(-3, 300)),
    width=st.sampled_from([0, 1, 3]),
)
def test_spreading_parent_values_equals_taking_them_at_the_located_rows(counts, before, bounds, width):
    """``Rows.spread`` (each parent's value repeated over its child rows in one pass) against
    numpy's ``values[searchsorted(starts, rows, "right") - 1]``: parents with no rows, child
    rows before the first parent, past the last child, empty ranges; values of any shape, and
    spread column by column (column-major)."""
    from l5dask.core.engine import Rows

    starts = (
        before + np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64) if counts else np.zeros(0, np.int64)
    )
    shape = (len(starts), width) if width else (len(starts),)
    values = np.arange(np.prod(shape), dtype=np.float64).reshape(shape) * 1.5
    rows = Rows(11, {"start": starts, "v": values})
    lo, hi = min(bounds), max(bounds)
    lo = max(lo, 0)
    pos = np.searchsorted(starts, np.arange(lo, max(hi, lo)), side="right") - 1
    if len(starts) == 0 or (len(pos) and pos.min() < 0):
        return  # (no parent: not a child row of these)
    np.testing.assert_array_equal(rows.spread(lo, max(hi, lo), "start", values), values[pos])
    np.testing.assert_array_equal(rows.locate(lo, max(hi, lo), "start"), pos)
    # column by column (a field of several numbers): the same values, each column contiguous
    by_column = rows.spread(lo, max(hi, lo), "start", values, by_column=True)
    np.testing.assert_array_equal(by_column, values[pos])
    assert by_column.ndim == 1 or by_column.flags.f_contiguous


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(partial=s.partials(), data=st.data())
@example(partial=np.array(0, np.uint8), data=None)  # (was read back of shape (1,))
@example(partial=np.str_(""), data=None)  # (was read back as a str)
def test_cache_entries_keep_every_bit_and_refuse_any_flipped_byte(partial, data):
    """A partial stored in a cache entry (``l5dask.core.cache``: the encoder, then the decoder that
    ``load`` reads entries with) comes back bit for bit: the same types all the way down, the same
    float bits, array dtypes, shapes and bytes; and any one byte of the entry changed (header,
    digest, manifest or arrays) is refused in one line, never read as another value."""
    from l5dask.core import cache as cachelib

    from .cache_data import same_bits

    entry = cachelib.encode(partial, {"reduction": "property"})
    assert same_bits(cachelib.decode(entry), partial)
    if data is None:
        return
    at = data.draw(st.integers(0, len(entry) - 1), label="byte")
    flip = data.draw(st.integers(1, 255), label="xor")
    damaged = entry[:at] + bytes([entry[at] ^ flip]) + entry[at + 1 :]
    event("header" if at < cachelib._HEAD.size else "body")
    with pytest.raises(cachelib.Damaged) as refused:
        cachelib.decode(damaged)
    assert "\n" not in str(refused.value) and str(refused.value)
