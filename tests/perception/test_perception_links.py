"""The compiled token lookups and chain walks of ``l5dask.perception.links`` against plain
references (Arrow's ``index_in``, a Python walk) on random inputs built to reach their edges:
nulls, ``""``, repeated tokens, prefixes of each other, chunked and sliced Arrow arrays, chains
of one row, more chains than are walked together, loops."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from l5dask.errors import FormatError
from l5dask.perception import links


def _strings(rng, pool, n, nulls=0.0):
    return [None if rng.random() < nulls else pool[i] for i in rng.integers(0, len(pool), n)]


def _arrow(values, rng):
    """As a plain, a sliced or a chunked Arrow array."""
    kind = rng.integers(0, 3)
    if kind == 0 or len(values) < 3:
        return pa.array(values, pa.string())
    if kind == 1:
        return pa.array(["pad"] + values + ["pad"], pa.string()).slice(1, len(values))
    cut = int(rng.integers(1, len(values)))
    return pa.chunked_array([pa.array(values[:cut], pa.string()), pa.array(values[cut:], pa.string())])


def _index_in(values, tokens):
    got = pc.index_in(values, value_set=pa.array(tokens.to_pylist(), pa.string()))
    return np.array([-1 if v is None else v for v in got.to_pylist()], np.int64)


def test_token_lookup_equals_arrow_index_in():
    rng = np.random.default_rng(7)
    for trial in range(300):
        # short strings over two letters: many repeats, "" and prefixes of each other
        pool = ["".join(rng.choice(list("ab"), rng.integers(0, 5))) for _ in range(40)]
        if trial % 3 == 0:  # long random tokens, as the real ones
            pool = [rng.bytes(32).hex() for _ in range(200)]
        tokens = _arrow(_strings(rng, pool, int(rng.integers(0, 60))), rng)
        query = _arrow(_strings(rng, pool + ["zz", "a" * 70], int(rng.integers(0, 80)), nulls=0.1), rng)
        index = links.token_index(tokens)
        ref = _index_in(query, tokens)
        np.testing.assert_array_equal(links.lookup(query, index), ref)
        # EMPTY marks the nulls and the ""s that are not tokens; the rest as before
        marked = links.lookup(query, index, links.EMPTY)
        values = query.to_pylist()
        empty = np.array([v is None or (v == "" and r < 0) for v, r in zip(values, ref)], bool)
        np.testing.assert_array_equal(marked, np.where(empty, links.EMPTY, ref))
        # the first repeated token in row order, and where it first was
        first = _index_in(tokens, tokens)
        dup = np.flatnonzero(first != np.arange(len(first)))
        assert (index.dup_row, index.dup_first) == ((dup[0], first[dup[0]]) if len(dup) else (-1, -1))


def test_duplicate_tokens_are_named():
    tokens = pa.array(["x", "y", "z", "y"], pa.string())
    with pytest.raises(FormatError, match=r"t.json: duplicate token 'y' \(rows 1 and 3\)"):
        links.self_index(tokens, "t.json")


def _walk(prev, nxt):
    """Head and position of each row, walking from each head in Python (-1: not reached)."""
    head, pos = np.full(len(prev), -1), np.zeros(len(prev), np.int64)
    for h in np.flatnonzero(prev < 0):
        r, k = h, 0
        while r >= 0:
            head[r], pos[r] = h, k
            r, k = nxt[r], k + 1
    return head, pos


@pytest.mark.parametrize("loops", [False, True])
def test_chains_equal_a_plain_walk(loops):
    rng = np.random.default_rng(3)
    for _trial in range(40):
        n = int(rng.integers(1, 3000))
        order = rng.permutation(n)
        cuts = (
            np.sort(rng.choice(np.arange(1, n), size=min(n - 1, int(rng.integers(0, 200))), replace=False))
            if n > 1
            else np.zeros(0, int)
        )
        prev, nxt, group = np.full(n, -1), np.full(n, -1), np.zeros(n, np.int64)
        chains = np.split(order, cuts)
        for g, rows in enumerate(chains):  # more chains than the kernel walks together
            prev[rows[1:]], nxt[rows[:-1]], group[rows] = rows[:-1], rows[1:], g
        ring = None
        if loops:
            ring = max(chains, key=len)  # close one chain into a ring
            prev[ring[0]], nxt[ring[-1]] = ring[-1], ring[0]
        tokens = pa.array([f"t{i}" for i in range(n)])
        if ring is not None:
            with pytest.raises(FormatError, match=f"loops \\(through row {ring.min()},"):
                links.chain(prev, nxt, group, "t.json", tokens)
            continue
        head, pos = links.chain(prev, nxt, group, "t.json", tokens)
        ref_head, ref_pos = _walk(prev, nxt)
        np.testing.assert_array_equal(head, ref_head)
        np.testing.assert_array_equal(pos, ref_pos)


@pytest.mark.parametrize("type_", [pa.int32(), pa.int64(), pa.float64(), pa.bool_()])
def test_arrow_numbers_without_pandas_equal_to_numpy(type_):
    from l5dask.core.outputs import numpy_array, valid_rows

    rng = np.random.default_rng(11)
    for _trial in range(50):
        n = int(rng.integers(0, 40))
        raw = rng.integers(-5, 5, n)
        values = [None if rng.random() < 0.2 else (bool(v > 0) if type_ == pa.bool_() else v.item()) for v in raw]
        arr = _arrow_typed(values, type_, rng)
        ref_valid = np.array([v is not None for v in values], bool)
        np.testing.assert_array_equal(valid_rows(arr), ref_valid)
        got = numpy_array(arr, 7)
        ref = np.array([7 if v is None else v for v in values], got.dtype)
        np.testing.assert_array_equal(got, ref)


def _arrow_typed(values, type_, rng):
    kind = rng.integers(0, 3)
    if kind == 0 or len(values) < 3:
        return pa.array(values, type_)
    if kind == 1:  # an offset that is not a multiple of 8 (the bitmaps)
        return pa.array([None, True if type_ == pa.bool_() else 1, None] + values, type_).slice(3, len(values))
    cut = int(rng.integers(1, len(values)))
    return pa.chunked_array([pa.array(values[:cut], type_), pa.array(values[cut:], type_)])


def test_compiled_points_in_boxes_equal_the_sdks_operations():
    """The compiled count against the SDK's operations (``count_in_boxes_exact``, itself tested
    against the SDK in test_perception.py) on points built to sit on faces, edges and corners, in
    world coordinates far from the origin, with flat and tiny boxes."""
    from l5dask.perception.lidar import _SIGN, count_in_boxes, count_in_boxes_exact, quaternion_matrices

    rng = np.random.default_rng(5)
    for _trial in range(30):
        nb = int(rng.integers(1, 40))
        centers = rng.uniform(-2000, 2000, (1, 3)) + rng.uniform(-20, 20, (nb, 3))
        sizes = rng.uniform(0.05, 6, (nb, 3))
        sizes[rng.random((nb, 3)) < 0.05] = 0.0  # flat boxes
        rots = quaternion_matrices(rng.normal(size=(nb, 4)))
        pts = [centers[:, :, None] + rng.uniform(-8, 8, (nb, 3, 200))]
        for b in range(nb):  # corners, points on faces and edges, and one float32 step off them
            w, ln, h = sizes[b]
            local = np.vstack((ln / 2 * _SIGN[0], w / 2 * _SIGN[1], h / 2 * _SIGN[2]))
            corners = rots[b] @ local + centers[b][:, None]
            mix = rng.dirichlet(np.ones(8), 30).T
            on = np.concatenate([corners, corners @ mix, (corners[:, :4] @ rng.dirichlet(np.ones(4), 30).T)], 1)
            pts.append(on[None])
        points = np.concatenate([p.transpose(1, 0, 2).reshape(3, -1) for p in pts], 1).astype(np.float32)
        points = np.concatenate(
            [points, np.nextafter(points, np.float32(np.inf)), np.nextafter(points, np.float32(-np.inf))], 1
        )
        got = count_in_boxes(points, centers, sizes, rots)
        np.testing.assert_array_equal(got, count_in_boxes_exact(points, centers, sizes, rots))
        assert got.sum() > 0


def test_compiled_move_rounds_as_numpy():
    """The compiled move to the world frame against the SDK's numpy steps (``to_world``), bit for
    bit, on sweeps with cancellations to zero (ground points at the sensor's height, points on the
    axes), far translations and NaN; a sweep it cannot decide says so instead of guessing."""
    from l5dask.perception._lidar import sweep_to_world

    from l5dask.perception.lidar import WIDE_ADD, quaternion_matrices, to_world

    rng = np.random.default_rng(11)
    decided = 0
    for trial in range(200):
        n = int(rng.integers(1, 3000))
        scan = (rng.normal(size=(n, 5)) * rng.choice([0.5, 30, 300])).astype(np.float32)
        q = rng.normal(size=(2, 4))
        if trial % 3 == 0:
            q[:, 1:3] = 0.0  # yaw only: exact zeros in the matrices
        r = quaternion_matrices(q)
        t1, t2 = rng.normal(size=3) * 2, rng.normal(size=3) * rng.choice([10, 3000])
        scan[: n // 4, 2] = -np.float32(t1[2])  # on the ground: z cancels to about 0
        scan[n // 4 : n // 3, :2] = 0.0
        if trial % 7 == 0:
            scan[0, 1] = np.nan
        out = np.full((3, n), -1.0, np.float32)
        ok = sweep_to_world(scan, r[0], t1, r[1], t2, out, WIDE_ADD)
        if ok:
            decided += 1
            ref = to_world(scan[:, :3].T, r[0], t1, r[1], t2)
            np.testing.assert_array_equal(out.view(np.uint32), ref.view(np.uint32))
    assert decided > 150


def test_one_pass_sweep_count_equals_the_numpy_path():
    """``count_sweep`` (an approximate move to find the points near boxes, the exact move and the
    test for those) against numpy's move and the compiled count of every point, on sweeps whose
    points sit on the boxes' faces, edges and corners in the world frame (moved back into the
    sensor's frame), with flat boxes; and a sweep it leaves to numpy counts nothing."""
    from l5dask.perception._lidar import count_sweep

    from l5dask.perception.lidar import (
        _SIGN,
        BAND,
        WIDE_ADD,
        _decide,
        box_frames,
        count_in_boxes_compiled,
        quaternion_matrices,
        to_world,
    )

    rng = np.random.default_rng(12)
    left = 0
    for trial in range(40):
        nb = int(rng.integers(1, 30))
        r = quaternion_matrices(rng.normal(size=(2, 4)) * [1, 0.05, 0.05, 1])
        t1, t2 = np.array([1.0, 0.0, 1.8]) + rng.normal(size=3) * 0.1, rng.uniform(-2500, 2500, 3)
        centers = t2 + rng.uniform(-40, 40, (nb, 3)) * [1, 1, 0.05]
        sizes = rng.uniform(0.3, 6, (nb, 3))
        sizes[rng.random((nb, 3)) < 0.05] = 0.0
        rots = quaternion_matrices(rng.normal(size=(nb, 4)) * [1, 0.02, 0.02, 1])
        if trial % 2:  # axis-aligned: faces on the bounds the boxes are binned by
            rots[:] = np.eye(3)
        world = [t2[:, None] + rng.uniform(-60, 60, (3, 2000))]
        for b in range(nb):
            w, ln, h = sizes[b]
            corners = rots[b] @ np.vstack((ln / 2 * _SIGN[0], w / 2 * _SIGN[1], h / 2 * _SIGN[2])) + centers[b][:, None]
            faces = rng.uniform(-0.5, 0.5, (3, 6, 50)) * np.array([ln, w, h])[:, None, None]
            for axis in range(3):  # 50 points on each face
                faces[axis, 2 * axis] = -[ln, w, h][axis] / 2
                faces[axis, 2 * axis + 1] = [ln, w, h][axis] / 2
            world += [
                corners,
                corners @ rng.dirichlet(np.ones(8), 60).T,
                centers[b][:, None] + rng.normal(size=(3, 40)),
                rots[b] @ faces.reshape(3, -1) + centers[b][:, None],
            ]
        world = np.concatenate(world, 1)
        sensor = r[0].T @ (r[1].T @ (world - t2[:, None]) - t1[:, None])  # back into the sensor's frame
        scan = np.zeros((sensor.shape[1], 5), np.float32)
        scan[:, :3] = sensor.T
        frames = box_frames(centers, sizes, rots)
        pts = np.zeros((3, len(scan)), np.float32)
        got = np.zeros(nb, np.int64)
        undecided = count_sweep(scan, r[0], t1, r[1], t2, WIDE_ADD, pts, frames, got, BAND)
        ref_pts = to_world(scan[:, :3].T, r[0], t1, r[1], t2)
        want = np.zeros(nb, np.int64)
        for b, c in _decide(ref_pts, count_in_boxes_compiled(ref_pts, frames, want), centers, sizes, rots):
            want[b] += c
        if undecided is None:
            left += 1
            assert not got.any()
            continue
        for b, c in _decide(pts, undecided, centers, sizes, rots):
            got[b] += c
        np.testing.assert_array_equal(got, want)
        assert want.sum() > 0
    assert left < 10
