"""The compiled per-chunk kernels against plain numpy, on inputs chosen to reach every branch."""

from __future__ import annotations

import numpy as np
import pytest

from l5dask.core.engine import Rows
from l5dask.prediction import format as fmt
from l5dask.prediction.kernels import (
    byte_codes,
    catalog_agents,
    distinct_values,
    face_runs,
    key_runs,
    layout,
    mask_counts,
    track_runs,
    union_masks,
)
from l5dask.prediction.stats import DISTANCE_EDGES, SPEED_EDGES, AgentStats, TLStats, exact_total


def _frames(starts, ego_xy, scene) -> Rows:
    return Rows(
        0,
        {
            "agent_start": np.asarray(starts, np.int64),
            "ego_xy": np.asarray(ego_xy, np.float64),
            "scene": np.asarray(scene, np.int64),
        },
    )


def _numpy_agent_partial(rec: np.ndarray, frames: Rows) -> dict:
    """The agent partial from its definitions, in plain numpy (as benchmarks/numpy_reference.py)."""
    frame = np.searchsorted(frames["agent_start"], np.arange(len(rec)), side="right") - 1
    v = rec["velocity"].astype(np.float64)
    speed = np.sqrt(v[:, 0] ** 2 + v[:, 1] ** 2)
    d = rec["centroid"].astype(np.float64) - frames["ego_xy"][frame]
    dist = np.sqrt(d[:, 0] ** 2 + d[:, 1] ** 2)
    # (NaN in no bin: the contract's bins are edges[i] <= v < edges[i+1], and v >= the last edge)
    hist = lambda x, e: np.bincount(np.digitize(x[~np.isnan(x)], e) - 1, minlength=len(e))[: len(e)]  # noqa: E731
    scene = frames["scene"][frame]
    return {
        "labels": np.bincount(rec["label_probabilities"].argmax(1), minlength=17),
        "speed_sum": speed.sum(),
        "speed_hist": hist(speed, SPEED_EDGES),
        "dist_hist": hist(dist, DISTANCE_EDGES),
        "ids": {int(s): np.unique(rec["track_id"][scene == s]).astype(np.uint64) for s in np.unique(scene)},
    }


def _assert_partial(part, want) -> None:
    for f in ("labels", "speed_hist", "dist_hist"):
        np.testing.assert_array_equal(getattr(part, f), want[f], err_msg=f)
    assert exact_total(part.speed_sum) == pytest.approx(want["speed_sum"], rel=1e-12)
    scenes = sorted(want["ids"])
    opened = dict(part.open)
    for s in (scenes[0], scenes[-1]):  # the edge scenes stay open, with their distinct ids
        np.testing.assert_array_equal(opened[s], want["ids"][s])
    inner = {s: len(want["ids"][s]) for s in scenes[1:-1]}
    assert {part.tracks.lo + i: int(n) for i, n in enumerate(part.tracks.cols["n"]) if n} == {
        s: n for s, n in inner.items() if n
    }


def _assert_both_equal_numpy(rec: np.ndarray, converted: np.ndarray, frames: Rows) -> None:
    """The records as they are and converted (other byte order or field types): numpy's partial."""
    want = _numpy_agent_partial(rec, frames)
    _assert_partial(AgentStats.chunk(rec, 0, frames), want)
    _assert_partial(AgentStats.chunk(converted, 0, frames), want)


def _agents(n: int, rng: np.random.Generator, ids: np.ndarray) -> np.ndarray:
    rec = np.zeros(n, fmt.DTYPES[fmt.AGENTS])
    rec["track_id"] = ids
    rec["velocity"] = rng.normal(0, 5, (n, 2))
    rec["centroid"] = rng.normal(0, 60, (n, 2))
    rec["label_probabilities"] = rng.random((n, 17))
    return rec


@pytest.mark.parametrize("scenes_of_frames", ["eight", "one"])
@pytest.mark.parametrize("id_kind", ["dense", "sparse", "huge", "falling"])
def test_track_runs_match_numpy(id_kind, scenes_of_frames):
    rng = np.random.default_rng(7)
    n = 5_000
    top = np.uint64(2**64 - 1)
    pos = np.sort(rng.integers(0, 40, n))  # frames in order
    frame_scene = np.repeat(np.arange(8), 5) + 3 if scenes_of_frames == "eight" else np.full(40, 5)
    ids = {
        # each run's ids dense, in a range below the last run's (each run's least and greatest id
        # are its own): marks with a table of each run's span
        "falling": lambda: (
            (np.uint64(10**9) - frame_scene[pos].astype(np.uint64) * np.uint64(10**6))
            + rng.integers(0, 300, n).astype(np.uint64)
        ),
        "dense": lambda: rng.integers(1, 300, n).astype(np.uint64),
        "sparse": lambda: rng.integers(0, 10**12, n).astype(np.uint64) * np.uint64(1000),  # a sort, not marks
        "huge": lambda: np.where(
            rng.random(n) < 0.5,
            np.uint64(1),  # a span that overflows int64
            top - rng.integers(0, 5, n).astype(np.uint64),
        ),
    }[id_kind]()
    rec = _agents(n, rng, ids)
    scenes, counts, first_ids, last_ids = track_runs(rec["track_id"], pos, frame_scene)
    row_scene = frame_scene[pos]
    want_scenes = np.unique(row_scene)
    np.testing.assert_array_equal(scenes, want_scenes)
    np.testing.assert_array_equal(counts, [len(np.unique(ids[row_scene == s])) for s in want_scenes])
    np.testing.assert_array_equal(first_ids, np.unique(ids[row_scene == want_scenes[0]]))
    np.testing.assert_array_equal(last_ids, np.unique(ids[row_scene == want_scenes[-1]]))


def test_track_runs_refuse_frames_whose_scenes_fall():
    """Rows of more runs than the scenes their frames span (the frames' scenes not increasing) are
    refused in one line, not written past the runs' room."""
    ids = np.arange(8, dtype=np.uint64)
    pos = np.arange(8, dtype=np.int64)
    with pytest.raises(ValueError, match="scenes increasing"):
        track_runs(ids, pos, np.array([0, 1, 0, 1, 0, 1, 0, 1], np.int64))


@pytest.mark.parametrize("nruns", [7, 1])
@pytest.mark.parametrize("id_kind", ["dense", "sparse", "huge"])
def test_key_runs_match_numpy(id_kind, nruns):
    """The catalog's distinct keys per run, their masks OR'd: each run's count of keys per bit,
    and the first and last runs' keys and masks, as numpy's ``unique`` and a per-key OR."""
    rng = np.random.default_rng(11)
    n = 6_000
    keys = {
        "dense": lambda: rng.integers(1, 300, n).astype(np.uint64),
        "sparse": lambda: rng.integers(0, 10**12, n).astype(np.uint64) * np.uint64(1000),
        "huge": lambda: np.where(
            rng.random(n) < 0.5, np.uint64(1), np.uint64(2**64 - 1) - rng.integers(0, 5, n).astype(np.uint64)
        ),
    }[id_kind]()
    masks = (np.uint64(1) << rng.integers(0, 23, n).astype(np.uint64)) | np.where(
        rng.random(n) < 0.3, np.uint64(1) << np.uint64(22), np.uint64(0)
    )
    masks[rng.random(n) < 0.05] = 0  # (keys whose masks are all 0 count nowhere)
    inner = np.sort(rng.choice(np.arange(1, n), nruns - 1, replace=False))
    cuts = np.concatenate([[0], inner, [n]]).astype(np.int64)
    counts, nkeys, first, last = key_runs(keys, masks, cuts, 23)
    assert len(nkeys) == len(cuts) - 1
    for r in range(len(cuts) - 1):
        k, m = keys[cuts[r] : cuts[r + 1]], masks[cuts[r] : cuts[r + 1]]
        u, inv = np.unique(k, return_inverse=True)
        ored = np.zeros(len(u), np.uint64)
        np.bitwise_or.at(ored, inv, m)
        u, ored = u[ored != 0], ored[ored != 0]
        want = [int(((ored >> np.uint64(b)) & np.uint64(1)).sum()) for b in range(23)]
        assert counts[r].tolist() == want
        assert nkeys[r] == len(u)
        if r in (0, len(cuts) - 2):
            got = first if r == 0 else last
            assert got[0].tolist() == u.tolist() and got[1].tolist() == ored.tolist()
    with pytest.raises(ValueError, match="bits"):
        key_runs(keys, masks, cuts, 20)  # masks beyond the bits


@pytest.mark.parametrize("seed", range(12))
def test_face_runs_match_two_key_runs(seed):
    """The catalog's faces in one pass (``face_runs``) against what it replaced: each face's frame
    (``searchsorted``), scene and id code made whole, then ``key_runs`` of the codes and of the
    frames with ``1 << status``; on frames with no face, runs of one face and of one frame, one
    run, a chunk that starts inside a frame, codes met again in later runs."""
    rng = np.random.default_rng(seed)
    nframes = int(rng.integers(1, 60))
    per_frame = rng.integers(0, 6, nframes)  # (0: a frame with no face)
    per_frame[0] = max(per_frame[0], 1)
    tl_start = np.concatenate([[0], np.cumsum(per_frame)[:-1]]).astype(np.int64) + 1000
    nfaces = int(per_frame.sum())
    frame_scene = np.repeat(np.arange(nframes), rng.integers(1, 4, nframes))[:nframes].astype(np.int64) + 7
    if seed % 4 == 0:
        frame_scene[:] = 7  # (one run)
    lo = int(tl_start[0] + (rng.integers(0, per_frame[0]) if seed % 3 == 0 else 0))  # (inside the first frame)
    n = nfaces - (lo - int(tl_start[0]))
    nfound = int(rng.integers(1, 12))
    inverse = rng.integers(0, max(1, nfound - 2), nfound).astype(np.int64)
    inverse[int(rng.integers(0, nfound))] = nfound  # (the greatest code: at least 1)
    nids = int(inverse.max()) + 1
    found = rng.integers(0, nfound, n).astype(np.int32)
    status = rng.integers(0, 3, n).astype(np.int8)
    offset = 500
    got = face_runs(found, inverse, nids, status, tl_start, frame_scene, offset, lo)
    # the reference: each face's frame, scene, code and mask made whole, then two key_runs
    pos = np.searchsorted(tl_start, np.arange(lo, lo + n), side="right") - 1
    scene = frame_scene[pos]
    cut = np.flatnonzero(scene[1:] != scene[:-1]) + 1
    starts = np.concatenate([[0], cut])
    cuts = np.append(starts, n).astype(np.int64)
    codes = inverse[found].astype(np.uint64)
    ones = np.ones(n, np.uint64)
    c_ids, _, f_ids, l_ids = key_runs(codes, ones, cuts, 1)
    frame = (offset + pos).astype(np.uint64)
    c_frames, _, f_frames, l_frames = key_runs(frame, np.left_shift(ones, status.astype(np.uint64)), cuts, 3)
    scenes, counts, f_codes, l_codes, ff, fm, lf, lm = got
    np.testing.assert_array_equal(scenes, scene[starts])
    np.testing.assert_array_equal(counts, np.concatenate([c_ids, c_frames], 1))
    np.testing.assert_array_equal(np.sort(f_codes), f_ids[0])
    np.testing.assert_array_equal(np.sort(l_codes), l_ids[0])
    np.testing.assert_array_equal(ff, f_frames[0])
    np.testing.assert_array_equal(fm, f_frames[1])
    np.testing.assert_array_equal(lf, l_frames[0])
    np.testing.assert_array_equal(lm, l_frames[1])
    # what it refuses: a status beyond the three, a code beyond the ids, faces before their frames
    bad = status.copy()
    bad[-1] = 3
    with pytest.raises(ValueError, match="status 0, 1 or 2"):
        face_runs(found, inverse, nids, bad, tl_start, frame_scene, offset, lo)
    beyond = found.copy()
    beyond[-1] = int(np.argmax(inverse))
    with pytest.raises(ValueError, match="among the ids"):
        face_runs(beyond, inverse, nids - 1, status, tl_start, frame_scene, offset, lo)
    beyond[-1] = nfound
    with pytest.raises(ValueError, match="among the ids"):
        face_runs(beyond, inverse, nids, status, tl_start, frame_scene, offset, lo)
    with pytest.raises(ValueError, match="the frames of every face"):
        face_runs(found, inverse, nids, status, tl_start, frame_scene, offset, int(tl_start[0]) - 1)


def test_union_masks_and_mask_counts_match_numpy():
    rng = np.random.default_rng(4)
    a = np.unique(rng.integers(0, 500, 300).astype(np.uint64))
    b = np.unique(rng.integers(200, 900, 300).astype(np.uint64))
    am, bm = (rng.integers(1, 2**40, len(x)).astype(np.uint64) for x in (a, b))
    keys, masks = union_masks(a, am, b, bm)
    want = {int(k): int(m) for k, m in zip(a, am)}
    for k, m in zip(b.tolist(), bm.tolist()):
        want[k] = want.get(k, 0) | m
    assert keys.tolist() == sorted(want) and masks.tolist() == [want[k] for k in sorted(want)]
    assert mask_counts(masks, 40).tolist() == [int(((masks >> np.uint64(i)) & np.uint64(1)).sum()) for i in range(40)]
    with pytest.raises(ValueError, match="beyond"):
        mask_counts(masks, 8)


@pytest.mark.parametrize("given", [False, True])
def test_catalog_agents_match_numpy(given):
    """Each agent's mask, its run's scene, least distances and low-confidence count: numpy's; the
    distances made by the loop (a frame's run of rows longer than its block of 4,096 among them, NaN
    centroids counted within no distance) or ``given`` (the report's column in a fused pass)."""
    rng = np.random.default_rng(5)
    n, m = 12_000, 60
    starts = np.sort(np.r_[0, rng.integers(5_000, n, m - 1)])  # (frame 0: rows 0 .. 4,999)
    ego = rng.normal(0, 20, (m, 2))
    frame_scene = np.repeat(np.arange(6), 10) + 40
    label = rng.integers(0, 17, n).astype(np.int8)
    groups = rng.integers(-1, 3, 17).astype(np.int8)
    groups[:3] = (0, 1, 2)
    pos = np.searchsorted(starts, np.arange(n), side="right") - 1
    cx, cy = ego[pos, 0] + rng.normal(0, 20, n), ego[pos, 1] + rng.normal(0, 20, n)
    cx[:50] = ego[pos[:50], 0] + 10.0  # at the 10 m edge exactly
    cy[:50] = ego[pos[:50], 1]
    cx[60:90] = np.nan
    top = rng.random(n).astype(np.float32)
    top[::17] = np.nan
    d = np.sqrt((cx - ego[pos, 0]) ** 2 + (cy - ego[pos, 1]) ** 2)
    masks = np.empty(n, np.uint64)
    extra = (d,) if given else ()
    cuts, scenes, mins, lows = catalog_agents(
        label, top, cx, cy, starts, ego, frame_scene, 0, groups, 10.0, 30.0, 0.5, masks, *extra
    )
    g = groups[label]
    want = (
        (np.uint64(1) << label.astype(np.uint64))
        | np.where((g >= 0) & (d <= 10), np.uint64(1) << (17 + g).astype(np.uint64), np.uint64(0))
        | np.where((g >= 0) & (d <= 30), np.uint64(1) << (20 + g).astype(np.uint64), np.uint64(0))
    )
    assert masks.tolist() == want.tolist()
    row_scene = frame_scene[pos]
    assert scenes.tolist() == np.unique(row_scene).tolist()
    for r, sc in enumerate(scenes):
        at = row_scene == sc
        assert (cuts[r], cuts[r + 1]) == (np.flatnonzero(at)[0], np.flatnonzero(at)[-1] + 1)
        for k, grp in enumerate((1, 2)):
            sel = at & (g == grp) & ~np.isnan(d)
            assert mins[r, k] == (d[sel].min() if sel.any() else np.inf)
        assert lows[r] == np.count_nonzero(top[at] < 0.5)
    # with keys: each run's distinct keys as key_runs makes them of the masks, made as each run ends
    for keys in (rng.integers(0, 400, n).astype(np.uint64), rng.integers(0, 2**63, n).astype(np.uint64)):
        got = catalog_agents(
            label, top, cx, cy, starts, ego, frame_scene, 0, groups, 10.0, 30.0, 0.5, masks, *extra or (None,), keys
        )
        assert [a.tolist() for a in got[:4]] == [a.tolist() for a in (cuts, scenes, mins, lows)]
        counts, nkeys, first, last = key_runs(keys, masks, cuts, 23)
        assert got[4].tolist() == counts.tolist() and got[5].tolist() == nkeys.tolist()
        assert [a.tolist() for a in (*got[6], *got[7])] == [a.tolist() for a in (*first, *last)]
    if given:  # (the distances taken from the column, not made again: other values, other masks)
        far = np.full(n, 100.0)
        catalog_agents(label, top, cx, cy, starts, ego, frame_scene, 0, groups, 10.0, 30.0, 0.5, masks, far)
        assert masks.tolist() == (np.uint64(1) << label.astype(np.uint64)).tolist()
        with pytest.raises(ValueError, match="columns of the rows"):
            catalog_agents(label, top, cx, cy, starts, ego, frame_scene, 0, groups, 10.0, 30.0, 0.5, masks, far[1:])


def test_catalog_agents_runs_sized_by_scenes():
    """The runs' outputs are sized by the scenes the frames span: scenes with gaps in their numbers
    (fewer runs than that span), a scene per row (as many runs as rows) and one scene are numpy's,
    and with keys each run's distinct keys ``key_runs``'; frames whose scenes do not increase are
    refused in one line."""
    groups = np.array([0, 1, 2], np.int8)
    for frame_scene, n in (
        (np.array([3, 3, 9, 20], np.int64), 8),
        (np.arange(4, dtype=np.int64) * 2, 4),
        (np.full(4, 7, np.int64), 8),  # (one run: the first and the last)
    ):
        starts = np.linspace(0, n, len(frame_scene), endpoint=False).astype(np.int64)
        ego = np.zeros((len(frame_scene), 2))
        label = (np.arange(n) % 3).astype(np.int8)
        cx = np.arange(n, dtype=np.float64)
        masks = np.empty(n, np.uint64)
        cuts, scenes, mins, lows = catalog_agents(
            label, np.ones(n, np.float32), cx, np.zeros(n), starts, ego, frame_scene, 0, groups, 10.0, 30.0, 0.5, masks
        )
        row_scene = frame_scene[np.searchsorted(starts, np.arange(n), side="right") - 1]
        assert scenes.tolist() == sorted(set(row_scene.tolist()))
        assert cuts.tolist() == [int(np.flatnonzero(row_scene == s)[0]) for s in scenes] + [n]
        assert len(mins) == len(lows) == len(scenes)
        keys = (np.arange(n) % 2).astype(np.uint64)
        got = catalog_agents(
            label,
            np.ones(n, np.float32),
            cx,
            np.zeros(n),
            starts,
            ego,
            frame_scene,
            0,
            groups,
            10.0,
            30.0,
            0.5,
            masks,
            None,
            keys,
        )
        counts, nkeys, first, last = key_runs(keys, masks, cuts, 9)
        assert got[4].tolist() == counts.tolist() and got[5].tolist() == nkeys.tolist()
        assert [a.tolist() for a in (*got[6], *got[7])] == [a.tolist() for a in (*first, *last)]
    with pytest.raises(ValueError, match="increasing"):
        catalog_agents(
            np.zeros(4, np.int8),
            np.ones(4, np.float32),
            np.zeros(4),
            np.zeros(4),
            np.arange(4, dtype=np.int64),
            np.zeros((4, 2)),
            np.array([5, 6, 5, 6], np.int64),
            0,
            groups,
            10.0,
            30.0,
            0.5,
            np.empty(4, np.uint64),
        )


def test_byte_codes_are_exact():
    rng = np.random.default_rng(2)
    base = rng.integers(0, 256, (40, 64), dtype=np.uint8)
    rows = base[rng.integers(0, 40, 3000)]
    rows[-20:, -1] ^= np.arange(1, 21, dtype=np.uint8)  # values one byte apart
    codes, first = byte_codes(np.ascontiguousarray(rows))
    assert (rows[first][codes] == rows).all()
    assert len(first) == len(np.unique(rows, axis=0)) and (np.diff(first) > 0).all()


def test_distinct_values_exact_under_collisions():
    rng = np.random.default_rng(3)
    # few distinct values repeated many times, and values differing only in their last byte
    base = rng.integers(0, 256, (50, 21), dtype=np.uint8)
    rows = np.concatenate([base[rng.integers(0, 50, 4000)], np.tile(base[:1], (30, 1))])
    rows[-30:, -1] = np.arange(30, dtype=np.uint8)
    records = np.zeros(len(rows), [("a", "u1"), ("key", "u1", (21,)), ("b", "<f8")])
    records["key"] = rows
    first = distinct_values(records, "key")
    assert len(first) == len(np.unique(rows, axis=0))
    assert len(np.unique(rows[first], axis=0)) == len(first)  # each kept row is distinct
    assert np.all(np.diff(first) > 0)  # first occurrences, in order
    assert distinct_values(records[:0], "key").tolist() == []


def test_tl_faces_unique_matches_numpy():
    rng = np.random.default_rng(5)
    faces = np.zeros(3000, fmt.DTYPES[fmt.TL_FACES])
    names = np.array([f"/f{i:03d}" for i in range(200)] + ["", "é-face-ünïcode"])
    faces["face_id"] = names[rng.integers(0, len(names), len(faces))]
    faces["traffic_light_face_status"][np.arange(len(faces)), rng.integers(0, 3, len(faces))] = 1
    packed = np.zeros(
        len(faces), np.dtype([("pad", "u1")] + [(f, faces.dtype.fields[f][0]) for f in faces.dtype.names])
    )
    for f in faces.dtype.names:
        packed[f] = faces[f]
    for records in (faces, packed, faces[::2]):  # in place; ids at an odd offset; a strided view
        part = TLStats.chunk(records)
        assert part.faces == set(np.unique(records["face_id"]).tolist())
        np.testing.assert_array_equal(
            part.status, np.bincount(records["traffic_light_face_status"].argmax(1), minlength=3)
        )


def test_big_endian_records_give_the_same_partial():
    rng = np.random.default_rng(11)
    rec = _agents(2000, rng, rng.integers(1, 100, 2000).astype(np.uint64))
    swapped = rec.astype(np.dtype([(f, rec.dtype.fields[f][0].newbyteorder(">")) for f in rec.dtype.names]))
    assert layout(rec, {"velocity": np.dtype(np.float32)})[0] is rec  # in place
    assert layout(swapped, {"velocity": np.dtype(np.float32)})[0].dtype["velocity"].base.isnative  # converted
    _assert_both_equal_numpy(rec, swapped, _frames([0, 700, 1500], rng.normal(0, 10, (3, 2)), [0, 0, 1]))


def test_agents_with_other_field_types_give_the_same_partial():
    """float64 labels and velocities, float32 centroids, uint32 ids: converted, then the same maths."""
    rng = np.random.default_rng(13)
    rec = _agents(3000, rng, rng.integers(1, 100, 3000).astype(np.uint64))
    rec["centroid"] = rec["centroid"].astype(np.float32)  # exactly representable either way
    other = np.zeros(
        len(rec),
        [
            ("track_id", "<u4"),
            ("label_probabilities", "<f8", (17,)),
            ("velocity", "<f8", (2,)),
            ("centroid", "<f4", (2,)),
        ],
    )
    for f in other.dtype.names:
        other[f] = rec[f]
    _assert_both_equal_numpy(rec, other, _frames([0, 1000, 2200], rng.normal(0, 10, (3, 2)), [4, 5, 5]))


def test_agent_partial_with_label_ties_and_many_scenes():
    """Ties between label probabilities (numpy: the first maximum wins) and inner scenes closed."""
    rng = np.random.default_rng(17)
    rec = _agents(4000, rng, rng.integers(1, 60, 4000).astype(np.uint64))
    tied = rng.random(4000) < 0.5
    rec["label_probabilities"][tied] = 0.0
    cols = rng.integers(0, 17, (int(tied.sum()), 2))
    rows = np.flatnonzero(tied)
    rec["label_probabilities"][rows, cols[:, 0]] = 0.5
    rec["label_probabilities"][rows, cols[:, 1]] = 0.5
    starts = np.arange(0, 4000, 100)
    frames = _frames(starts, rng.normal(0, 30, (len(starts), 2)), np.repeat(np.arange(8), 5) + 2)
    _assert_partial(AgentStats.chunk(rec, 0, frames), _numpy_agent_partial(rec, frames))


def test_short_label_counts_are_refused_not_narrowed():
    from l5dask.prediction.kernels import agent_chunk, argmax_counts

    rec = _agents(10, np.random.default_rng(0), np.arange(10, dtype=np.uint64))
    out = dict(
        speed_hist=np.zeros(101, np.int64),
        dist_hist=np.zeros(41, np.int64),
        frame_pos=np.zeros(10, np.int64),
        track_ids=np.zeros(10, np.uint64),
    )
    with pytest.raises(ValueError, match="17 label probabilities a row, but 16 label counts"):
        agent_chunk(
            rec, np.zeros(1, np.int64), np.zeros((1, 2)), 0, 0.5, 5.0, label_counts=np.zeros(16, np.int64), **out
        )
    with pytest.raises(ValueError, match="label_probabilities has 17 columns, but there are 3 counts"):
        argmax_counts(rec, "label_probabilities", np.zeros(3, np.int64))


def test_union_sorted_matches_union1d():
    from l5dask.prediction.kernels import union_sorted

    rng = np.random.default_rng(2)
    for n, m in [(0, 0), (0, 5), (7, 0), (300, 200), (1, 1)]:
        a = np.unique(rng.integers(0, 400, n).astype(np.uint64))
        b = np.unique(rng.integers(0, 400, m).astype(np.uint64))
        np.testing.assert_array_equal(union_sorted(a, b), np.union1d(a, b))


@pytest.mark.parametrize("ncols", [3, 4, 5, 17, 20])
def test_argmax_is_numpys_with_ties_zeros_and_nan(ncols):
    """The vector path and the scalar loop both give numpy's argmax: first maximum, NaN first of all."""
    from l5dask.prediction.kernels import argmax_counts

    rng = np.random.default_rng(ncols)
    values = rng.choice(np.array([0.0, -0.0, 0.25, 1.0, -1.0, np.inf, -np.inf], np.float32), (4000, ncols))
    values[rng.random(values.shape) < 0.01] = np.nan
    values[:50] = 0.5  # all equal
    rec = np.zeros(len(values), [("pad", "u1"), ("p", "<f4", (ncols,))])  # odd offset: unaligned loads
    rec["p"] = values
    for rows in (rec, rec[::3]):
        counts = np.zeros(ncols, np.int64)
        argmax_counts(rows, "p", counts)
        np.testing.assert_array_equal(counts, np.bincount(rows["p"].argmax(1), minlength=ncols))


def test_kernels_refuse_inputs_that_would_index_out_of_bounds():
    from l5dask.prediction.kernels import agent_chunk

    rec = _agents(10, np.random.default_rng(0), np.arange(10, dtype=np.uint64))
    out = dict(
        label_counts=np.zeros(17, np.int64),
        speed_hist=np.zeros(101, np.int64),
        dist_hist=np.zeros(41, np.int64),
        frame_pos=np.zeros(10, np.int64),
        track_ids=np.zeros(10, np.uint64),
    )
    with pytest.raises(ValueError, match="frames of the rows"):
        agent_chunk(rec, np.zeros(0, np.int64), np.zeros((0, 2)), 0, 0.5, 5.0, **out)
    with pytest.raises(ValueError, match="output slot per row"):
        agent_chunk(
            rec, np.zeros(1, np.int64), np.zeros((1, 2)), 0, 0.5, 5.0, **{**out, "frame_pos": np.zeros(3, np.int64)}
        )
    with pytest.raises(ValueError, match="within frame_scene"):
        track_runs(rec["track_id"], np.full(10, 5), np.zeros(3, np.int64))
    with pytest.raises(ValueError, match="within frame_scene"):
        track_runs(rec["track_id"], np.full(10, -1), np.zeros(3, np.int64))


@pytest.mark.parametrize(
    "dtype", ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool", ">i4"]
)
def test_group_codes_of_narrow_keys_match_numpy(dtype):
    """The key range reads each key width (big-endian, bool, uint64, strided); ``encode`` gives
    numpy's groups for mixed widths."""
    from l5dask.prediction.groupby import encode
    from l5dask.prediction.kernels import int_range

    rng = np.random.default_rng(3)
    info = np.iinfo(np.dtype(dtype)) if dtype != "bool" else None
    lo, hi = (0, 2) if info is None else (max(int(info.min), -(2**40)), min(int(info.max), 2**40) + 1)
    k = rng.integers(lo, hi, 5000).astype(dtype)
    k[[7, 4000]] = [lo, hi - 1] if dtype != "bool" else [False, True]  # both ends reached
    assert int_range(k) == (int(k.min()), int(k.max()))
    assert int_range(k[::2]) == (int(k[::2].min()), int(k[::2].max()))
    small = rng.integers(0, 17, 5000).astype(np.int8)
    for keys in ([k, small], [small, k % 5 if dtype != "bool" else k]):
        got, ngroups, table = encode(keys, 5000)
        stacked = np.stack([x.astype(np.int64) for x in keys], axis=1)
        assert table.dtype == np.int64
        np.testing.assert_array_equal(table[got], stacked)  # each row's code names its keys
        uniq = np.unique(stacked, axis=0)
        present = np.unique(got)
        np.testing.assert_array_equal(table[present], uniq)  # codes ordered as the keys


def test_norm2_of_float32_equals_numpys_float64_formula():
    """The compiled speed is numpy's ``sqrt(vx * vx + vy * vy)`` on the arrays cast to float64, bit
    for bit (no fused multiply-add), with NaN, infinities, zeros and extremes."""
    from l5dask.prediction.kernels import norm2

    rng = np.random.default_rng(3)
    x = (rng.normal(size=100_000) * rng.choice([1e-30, 1, 1e30], 100_000)).astype(np.float32)
    y = (rng.normal(size=100_000) * 30).astype(np.float32)
    x[:5], y[5:10], x[10:15] = np.nan, np.inf, 0.0
    x[15], y[15] = np.finfo(np.float32).max, np.finfo(np.float32).max
    a, b = x.astype(np.float64), y.astype(np.float64)
    want = np.sqrt(a * a + b * b)
    got = norm2(x, y)
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got.view(np.uint64), want.view(np.uint64))
    np.testing.assert_array_equal(norm2(x[::2], y[::2]), want[::2])  # strided inputs


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64])
def test_range_codes_equal_numpys(dtype):
    """Group codes of integer labels ``lo .. lo + n - 1``: ``k - lo`` inside, -1 outside, for every
    integer type (the extremes of each, and uint64 past int64)."""
    from l5dask.prediction.kernels import range_codes

    info = np.iinfo(dtype)
    rng = np.random.default_rng(4)
    k = np.concatenate([rng.integers(max(info.min, -50), min(info.max, 80), 5000), [info.min, info.max]]).astype(dtype)
    for lo, n in ((0, 17), (3, 24), (-5, 10), (0, 1)):
        want = k.astype(object) - lo
        want = np.where((want >= 0) & (want < n), want, -1).astype(np.int64)
        np.testing.assert_array_equal(range_codes(k, lo, n), want)
    np.testing.assert_array_equal(range_codes(k.reshape(2, -1), 0, 17).reshape(-1), range_codes(k, 0, 17))


def test_distance_to_parent_equals_numpys_formula_on_taken_columns():
    from l5dask.prediction.kernels import distance_to_parent

    rng = np.random.default_rng(6)
    parent = rng.normal(size=(50, 3)) * 1000
    pos = np.sort(rng.integers(0, 50, 20_000))
    x, y = parent[pos, 0] + rng.normal(size=20_000) * 30, parent[pos, 1] + rng.normal(size=20_000) * 30
    x[:3] = parent[pos[:3], 0]  # zero distance
    x[3] = np.nan
    dx, dy = x - parent[:, 0].take(pos), y - parent[:, 1].take(pos)
    dx *= dx
    dy *= dy
    want = np.sqrt(dx + dy)
    np.testing.assert_array_equal(distance_to_parent(x, y, parent, pos), want)
    with pytest.raises(IndexError, match="row 1 has parent position 50, not in"):
        distance_to_parent(x[:2], y[:2], parent, np.array([0, 50]))


def test_distance_to_runs_equals_numpys_formula_on_taken_columns():
    """Rows in runs, one per parent row (parents with no row, a run of one, NaN and infinite
    values): numpy's formula on the parent's columns repeated over the rows, bit for bit; counts
    that do not add up to the rows, or negative, refused."""
    from l5dask.prediction.kernels import distance_to_runs

    rng = np.random.default_rng(16)
    parent = rng.normal(size=(60, 3)) * 1000
    parent[7] = [np.nan, 1.0, 0.0]
    counts = rng.integers(0, 700, 60)
    counts[[0, 5, 59]] = 0
    counts[9] = 1
    n = int(counts.sum())
    pos = np.repeat(np.arange(60), counts)
    x, y = parent[pos, 0] + rng.normal(size=n) * 30, parent[pos, 1] + rng.normal(size=n) * 30
    x[:3] = parent[pos[:3], 0]  # zero distance
    x[3], y[4] = np.nan, np.inf
    dx, dy = x - parent[:, 0].take(pos), y - parent[:, 1].take(pos)
    want = np.sqrt(dx * dx + dy * dy)
    assert distance_to_runs(x, y, parent, counts).tobytes() == want.tobytes()
    assert distance_to_runs(x[:0], y[:0], parent, counts[:0]).shape == (0,)
    with pytest.raises(ValueError, match=f"the counts hold {n - 1} rows, not {n}"):
        distance_to_runs(x, y, parent, counts - np.eye(60, dtype=counts.dtype)[9])
    with pytest.raises(ValueError, match="parent 1 has -1 rows"):
        distance_to_runs(x[:2], y[:2], parent, np.array([3, -1]))
    with pytest.raises(ValueError, match="at most m counts"):
        distance_to_runs(x, y, parent[:2], counts)


def test_agent_columns_writes_the_speed_and_distance_columns_bit_for_bit():
    """The report's loop writes out each row's speed and distance to its frame's ego for the
    other analyses of a fused pass (``speed_out``, ``dist_out``): the bits of the columns'
    own kernels (``norm2`` of the velocities, ``distance_to_parent`` of the centroid), over frames
    that cross blocks, hold no agent or start before the chunk, NaN, infinite and huge values;
    the counts, histograms and sum are those of the call without them."""
    from l5dask.prediction.kernels import agent_columns, distance_to_parent, norm2

    rng = np.random.default_rng(29)
    n, lo = 9000, 10_000  # (three blocks of the loop)
    starts = np.array([9_000, 9_990, 12_288, 12_288, 14_000, 14_001, 18_192, 18_999])
    ego = rng.normal(0, 40, (len(starts), 2))
    ego[3] = [np.nan, 1e300]
    vx, vy = rng.normal(0, 5, n).astype(np.float32), rng.normal(0, 5, n).astype(np.float32)
    vx[[3, 600, 4100]], vy[[4, 601, 8191]] = np.nan, np.inf
    vx[7] = np.float32(3e38)
    cx, cy = rng.normal(0, 60, n), rng.normal(0, 60, n)
    cx[[1200, 5000]], cy[6000] = np.inf, -1e300
    label = rng.integers(0, 17, n).astype(np.int8)

    def run(**outs):
        counts, sh, dh, pos = (
            np.zeros(17, np.int64),
            np.zeros(101, np.int64),
            np.zeros(41, np.int64),
            np.empty(n, np.int64),
        )
        s = agent_columns(label, [vx, vy, cx, cy], starts, ego, lo, 0.5, 5.0, counts, sh, dh, pos, **outs)
        return s, counts, sh, dh, pos

    speed, dist = np.full(n + 5, -1.0), np.full(n + 5, -1.0)
    with_outs, without = run(speed_out=speed, dist_out=dist), run()
    for a, b in zip(with_outs, without):
        np.testing.assert_array_equal(
            np.float64(a).view(np.uint64) if np.isscalar(a) else a,
            np.float64(b).view(np.uint64) if np.isscalar(b) else b,
        )
    frame = np.searchsorted(starts, lo + np.arange(n), side="right") - 1
    ego3 = np.concatenate([ego, np.zeros((len(ego), 1))], 1)
    assert speed[:n].tobytes() == norm2(vx, vy).tobytes()
    assert dist[:n].tobytes() == distance_to_parent(cx, cy, ego3, frame).tobytes()
    assert (speed[n:] == -1).all() and (dist[n:] == -1).all()  # (no slot past the rows written)
    with pytest.raises(ValueError, match="a speed slot per row"):
        run(speed_out=np.empty(n - 1))


def test_agent_partial_from_stored_bytes_is_the_records_partial_bit_for_bit():
    """The report gathers agents' columns straight from each chunk's stored bytes (no records):
    its partial, the speed sum's bits included, is the one of the decoded records, with label
    ties, NaN and infinite values, and a short last chunk."""
    from l5dask.prediction.reading import Encoded
    from l5dask.prediction.writing import encode_chunk

    rng = np.random.default_rng(23)
    n, chunk_rows = 3000, 4096
    rec = _agents(n, rng, np.sort(rng.integers(1, 80, n)).astype(np.uint64))
    rec["label_probabilities"][::7] = 0.25  # all tied: the first wins
    rec["label_probabilities"][3::11, 5] = np.nan  # numpy: the first NaN wins
    rec["velocity"][::13, 0] = np.inf
    rec["velocity"][1::17, 1] = np.nan
    rec["centroid"][2::19, 0] = -np.inf
    starts = np.arange(0, n, 60)
    frames = _frames(starts, rng.normal(0, 30, (len(starts), 2)), np.repeat(np.arange(10), 5))
    meta = fmt.ArrayMeta(fmt.AGENTS, rec.dtype, n, chunk_rows)
    encoded = Encoded(meta, True, [(0, encode_chunk(rec, chunk_rows))])
    a, b = AgentStats.chunk(rec, 0, frames), AgentStats.chunk(encoded, 0, frames)
    for f in ("n", "labels", "speed_hist", "dist_hist", "speed_sum"):
        np.testing.assert_array_equal(getattr(b, f), getattr(a, f), err_msg=f)
    assert b.tracks.lo == a.tracks.lo and np.array_equal(b.tracks.cols["n"], a.tracks.cols["n"])
    assert [(s, list(ids)) for s, ids in b.open] == [(s, list(ids)) for s, ids in a.open]
    np.testing.assert_array_equal(b.labels, np.bincount(rec["label_probabilities"].argmax(1), minlength=17))


def test_agent_columns_refuses_labels_out_of_range():
    from l5dask.prediction.kernels import agent_columns

    cols = [np.zeros(4, np.float32)] * 2 + [np.zeros(4)] * 2
    out = dict(speed_hist=np.zeros(101, np.int64), dist_hist=np.zeros(41, np.int64), frame_pos=np.zeros(4, np.int64))
    for label in (np.array([0, 1, 17, 2], np.int8), np.array([0, -1, 0, 0], np.int8)):
        with pytest.raises(ValueError, match="labels from 0 to 16"):
            agent_columns(
                label, cols, np.zeros(1, np.int64), np.zeros((1, 2)), 0, 0.5, 5.0, np.zeros(17, np.int64), **out
            )


def test_agent_columns_frame_runs_across_blocks_and_empty_frames():
    """The compiled loop works a block of rows at a time and a frame's run at a time: frames that
    end exactly at a block's edge, cross several blocks, hold no agent (equal starts), a chunk
    that starts inside a frame (``lo``), NaN and infinite speeds; against numpy's definitions."""
    from l5dask.prediction.kernels import agent_columns

    rng = np.random.default_rng(23)
    n, lo = 3000, 10_000
    starts = np.array([9_000, 9_990, 10_512, 10_512, 10_512, 11_100, 11_101, 12_024, 12_500, 12_500, 13_100])
    ego = rng.normal(0, 40, (len(starts), 2))
    vx, vy = rng.normal(0, 5, n).astype(np.float32), rng.normal(0, 5, n).astype(np.float32)
    vx[[3, 600]], vy[[4, 601]] = np.nan, np.inf
    cx, cy = rng.normal(0, 60, n), rng.normal(0, 60, n)
    cx[1200] = np.inf
    label = rng.integers(0, 17, n).astype(np.int8)
    counts, sh, dh, pos = (
        np.zeros(17, np.int64),
        np.zeros(101, np.int64),
        np.zeros(101, np.int64),
        np.empty(n, np.int64),
    )
    s = agent_columns(label, [vx, vy, cx, cy], starts, ego, lo, 0.5, 5.0, counts, sh, dh, pos)

    frame = np.searchsorted(starts, lo + np.arange(n), side="right") - 1
    np.testing.assert_array_equal(pos, frame)
    speed = np.sqrt(vx.astype(np.float64) ** 2 + vy.astype(np.float64) ** 2)
    dist = np.sqrt((cx - ego[frame, 0]) ** 2 + (cy - ego[frame, 1]) ** 2)

    def hist(x, width):  # bin i: i * width <= x < (i + 1) * width; the last takes the rest (NaN: none)
        x = x[~np.isnan(x)]
        b = np.where(x >= 100 * width, 100, np.floor(x / width)).astype(np.int64)
        return np.bincount(b, minlength=101)

    np.testing.assert_array_equal(counts, np.bincount(label, minlength=17))
    np.testing.assert_array_equal(sh, hist(speed, 0.5))
    np.testing.assert_array_equal(dh, hist(dist, 5.0))
    assert np.isnan(s) and np.isnan(speed.sum())
    finite = np.isfinite(speed)
    vx[~finite] = vy[~finite] = 0
    s = agent_columns(label, [vx, vy, cx, cy], starts, ego, lo, 0.5, 5.0, counts, sh, dh, pos)
    assert s == pytest.approx(np.sqrt(vx.astype(np.float64) ** 2 + vy.astype(np.float64) ** 2).sum(), rel=1e-12)
