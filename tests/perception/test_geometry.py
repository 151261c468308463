"""Box geometry (:mod:`l5dask.perception.geometry`) against the Lyft SDK's ``Box3D``: as released on
PyPI (0.0.8) for ``geometry="sdk-0.0.8"``, and with PR #64's line applied (``sin = R[1, 0]``,
tests/perception_reference.py) for the default ``"corrected"``; on boxes built to reach overlaps,
touching edges, tilted quaternions, far coordinates and IoUs on the thresholds."""

from __future__ import annotations

import math

import numpy as np
import pytest

from l5dask.errors import UsageError
from l5dask.perception import geometry as G
from tests.perception_reference import sdk_map


def box3d(geometry, t, s, r):
    return sdk_map(geometry).Box3D(translation=list(t), size=list(s), rotation=list(r), name="car", sample_token="")


def yaw_q(yaw):
    return [math.cos(yaw / 2), 0.0, 0.0, math.sin(yaw / 2)]


def random_boxes(n, seed, far=2000.0):
    """Boxes around a sample's origin: sizes of cars to buses, any yaw, a tenth tilted (pitch and
    roll too, unnormalised quaternions), and a second set near the first (overlaps of every size),
    some the same box, some touching it along an edge."""
    rng = np.random.default_rng(seed)
    origin = rng.uniform(-far, far, 2)
    xyz = np.c_[origin + rng.uniform(-40, 40, (n, 2)), rng.normal(-20, 0.5, n)]
    size = rng.uniform(0.4, 10, (n, 3))
    yaw = rng.uniform(-math.pi, math.pi, n)
    rot = np.array([yaw_q(y) for y in yaw])
    tilt = rng.random(n) < 0.1
    rot[tilt] = rng.normal(size=(int(tilt.sum()), 4)) * rng.uniform(0.5, 2, (int(tilt.sum()), 1))
    xyz2 = xyz + rng.normal(0, [0.8, 0.8, 0.3], (n, 3))
    size2 = size * rng.uniform(0.8, 1.2, (n, 3))
    rot2 = np.array([yaw_q(y) for y in yaw + rng.normal(0, 0.2, n)])
    same = rng.random(n) < 0.05
    xyz2[same], size2[same], rot2[same] = xyz[same], size[same], rot[same]
    touch = (rng.random(n) < 0.05) & ~tilt  # the next box along the length, edge to edge
    c, s_ = np.cos(yaw[touch]), np.sin(yaw[touch])
    xyz2[touch, 0] = xyz[touch, 0] + size[touch, 1] * c
    xyz2[touch, 1] = xyz[touch, 1] + size[touch, 1] * s_
    xyz2[touch, 2], size2[touch], rot2[touch] = xyz[touch, 2], size[touch], rot[touch]
    return (xyz, size, rot), (xyz2, size2, rot2)


def test_the_30_degree_example():
    q = yaw_q(math.radians(30))
    a, b = ([0, 0, 0], [2, 4, 1.5], q), ([0.5, 0.5, 0], [2, 4, 1.5], q)
    got = {g: float(G.iou(a, b, geometry=g)[0]) for g in G.GEOMETRIES}
    for g in G.GEOMETRIES:
        assert got[g] == pytest.approx(box3d(g, *a).get_iou(box3d(g, *b)), rel=1e-12, abs=0)
    assert round(got["corrected"], 4) == 0.6043 and round(got["sdk-0.0.8"], 4) == 0.4581
    # the corrected geometry turns the rectangle with the yaw: its corners are the plain rotation's
    rot = np.array([[math.cos(math.pi / 6), -math.sin(math.pi / 6)], [math.sin(math.pi / 6), math.cos(math.pi / 6)]])
    local = np.array([[2, -1], [2, 1], [-2, 1], [-2, -1]], float)
    np.testing.assert_allclose(G.ground_corners(a)[0], local @ rot.T, rtol=0, atol=1e-15)
    np.testing.assert_allclose(G.ground_corners(a, "sdk-0.0.8")[0], local @ rot, rtol=0, atol=1e-15)


@pytest.mark.parametrize("geometry", G.GEOMETRIES)
@pytest.mark.parametrize("seed,far", [(0, 2000.0), (1, 10.0), (2, 3000.0)])
def test_every_quantity_against_box3d(geometry, seed, far):
    a, b = random_boxes(300, seed, far)
    A = [box3d(geometry, *x) for x in zip(*a)]
    B = [box3d(geometry, *x) for x in zip(*b)]
    vol_a = np.array([x.volume for x in A])
    vol_b = np.array([x.volume for x in B])
    area_a = np.array([x.ground_bbox_coords.area for x in A])
    area_b = np.array([x.ground_bbox_coords.area for x in B])
    np.testing.assert_array_equal(G.volume(a), vol_a)
    np.testing.assert_allclose(G.ground_area(a, geometry), area_a, rtol=1e-12, atol=0)
    corners = np.array([np.asarray(x.ground_bbox_coords.exterior.coords)[:4] for x in A])
    np.testing.assert_allclose(G.ground_corners(a, geometry), corners, rtol=0, atol=1e-12 * far)
    # pairs: the height overlap to the bit; the rest within 1e-12 of the pair's smaller area/volume
    np.testing.assert_array_equal(G.height_intersection(a, b), [x.get_height_intersection(y) for x, y in zip(A, B)])
    ref_area = np.array([x.ground_bbox_coords.intersection(y.ground_bbox_coords).area for x, y in zip(A, B)])
    ref_inter = np.array([x.get_intersection(y) for x, y in zip(A, B)])
    ref_iou = np.array([x.get_iou(y) for x, y in zip(A, B)])
    got_area = G.area_intersection(a, b, geometry=geometry)
    assert (np.abs(got_area - ref_area) <= 1e-12 * np.minimum(area_a, area_b)).all()
    got_inter = G.intersection(a, b, geometry=geometry)
    assert (np.abs(got_inter - ref_inter) <= 1e-12 * np.minimum(vol_a, vol_b)).all()
    got_iou = G.iou(a, b, geometry=geometry)
    assert (np.abs(got_iou - ref_iou) <= 1e-12).all()
    assert (ref_iou > 0.3).sum() > 100 and (ref_iou == 0).sum() > 10  # overlaps of every size, and none
    # all pairs: the same numbers as the pairs one by one
    sub_a, sub_b = tuple(x[:40] for x in a), tuple(x[:50] for x in b)
    outer = G.iou(sub_a, sub_b, outer=True, geometry=geometry)
    assert outer.shape == (40, 50)
    for i in range(40):
        np.testing.assert_array_equal(outer[i], G.iou(tuple(x[i] for x in sub_a), sub_b, geometry=geometry))
    np.testing.assert_array_equal(np.diag(outer[:, :40]), got_iou[:40])
    ref_outer = np.array([[x.get_iou(y) for y in B[:50]] for x in A[:40]])
    assert (np.abs(outer - ref_outer) <= 1e-12).all()


@pytest.mark.parametrize("geometry", G.GEOMETRIES)
def test_edges_on_edges_and_boxes_inside_boxes_against_box3d(geometry):
    # the compiled area integrates the second box's edges against the first's rectangle: boxes whose
    # edges lie on each other's (yaws 90 degrees apart or equal, offsets of half sizes), edges
    # parallel to an axis (vertical in the first box's axes), one box inside the other (touching
    # or not), corners on edges, and boxes just apart
    rng = np.random.default_rng(7)
    a_rows, b_rows = [], []
    for yaw in (0.0, math.pi / 2, math.pi / 3, -2.5):
        for turn in (0.0, math.pi / 2, math.pi, 0.3):
            for size_b in ([2.0, 4.0, 1.5], [1.0, 2.0, 1.5], [4.0, 8.0, 1.5], [2.0, 1.0, 1.5]):
                for off in ((0, 0), (1, 0), (0, 2), (1, 2), (2, 0), (3, 3), (0.5, 1), (2.0000001, 0), (1.5, 3)):
                    c, s = math.cos(yaw), math.sin(yaw)
                    dx, dy = off[0] * c - off[1] * s, off[0] * s + off[1] * c
                    a_rows.append(([100.0, -50.0, 0.0], [2.0, 4.0, 1.5], yaw_q(yaw)))
                    b_rows.append(([100.0 + dx, -50.0 + dy, 0.2], size_b, yaw_q(yaw + turn)))
    inner = rng.uniform(0.2, 0.45, 40)  # small boxes well inside, and large boxes around
    for f in inner:
        yaw = rng.uniform(-math.pi, math.pi)
        a_rows.append(([5.0, 5.0, 0.0], [3.0, 6.0, 2.0], yaw_q(yaw)))
        b_rows.append(([5.0 + f, 5.0 - f, 0.0], [3.0 * f, 6.0 * f, 1.0], yaw_q(yaw + rng.normal(0, 0.3))))
        a_rows.append(([5.0, 5.0, 0.0], [3.0 * f, 6.0 * f, 1.0], yaw_q(yaw)))
        b_rows.append(([5.0 + f / 4, 5.0, 0.0], [3.0, 6.0, 2.0], yaw_q(yaw + rng.normal(0, 0.3))))
    a = tuple(np.array(v, float) for v in zip(*a_rows))
    b = tuple(np.array(v, float) for v in zip(*b_rows))
    A = [box3d(geometry, *x) for x in a_rows]
    B = [box3d(geometry, *x) for x in b_rows]
    ref = np.array([x.ground_bbox_coords.intersection(y.ground_bbox_coords).area for x, y in zip(A, B)])
    smaller = np.minimum([x.ground_bbox_coords.area for x in A], [y.ground_bbox_coords.area for y in B])
    got = G.area_intersection(a, b, geometry=geometry)
    assert (np.abs(got - ref) <= 1e-12 * smaller).all(), np.abs(got - ref).max()
    assert (ref == 0).sum() > 20 and ((ref > 0) & (ref < smaller * 0.999)).sum() > 100 and (ref == smaller).sum() > 40
    np.testing.assert_array_equal(got[ref == 0], 0.0)  # boxes apart or touching: 0, not a rounding's crumb
    ref_iou = np.array([x.get_iou(y) for x, y in zip(A, B)])
    assert (np.abs(G.iou(a, b, geometry=geometry) - ref_iou) <= 1e-12).all()
    outer = G.area_intersection(a, b, outer=True, geometry=geometry)
    np.testing.assert_array_equal(np.diag(outer), got)  # all pairs: the same numbers


def test_all_pairs_in_blocks(monkeypatch):
    a, b = random_boxes(64, 5, 50.0)
    whole = G.intersection(a, b, outer=True)
    monkeypatch.setattr(G, "_BLOCK_PAIRS", 100)  # rows of 1 box (64 pairs) at a time
    np.testing.assert_array_equal(G.intersection(a, b, outer=True), whole)


@pytest.mark.parametrize("geometry", G.GEOMETRIES)
def test_values_on_the_thresholds_are_the_sdks(geometry):
    # IoUs of exactly 0.5 (boxes twice as wide, long or high), 1/3, 0.75 and 0.95 on a tilted box:
    # the SDK's own bits, so that a comparison with a threshold decides as the SDK (and evaluate)
    one = ([0, 0, 0], [1, 1, 1], [0, 0, 0, 1])
    pairs = [
        ([0, 0, 0], [2, 1, 1], [0, 0, 0, 1]),
        ([0, 0, 0], [1, 2, 1], [0, 0, 0, 1]),
        ([0, 0, 0], [1, 1, 2], [0, 0, 0, 1]),
        ([0.5, 0, 0], [1, 1, 1], [0, 0, 0, 1]),
    ]
    q = [0.9, 0.1, -0.2, 0.3]
    big = ([5, 6, 1], [2, 3, 4], q)
    pairs_big = [([5, 6, 1], [2, 3, 4 * t], q) for t in (0.75, 0.95, 0.5)]
    for x, ys, thr in ((one, pairs, G.THRESHOLDS + (1 / 3,)), (big, pairs_big, G.THRESHOLDS)):
        got = G.iou(
            tuple(np.array([v] * len(ys), float) for v in x),
            tuple(np.array(v, float) for v in zip(*ys)),
            geometry=geometry,
            thresholds=thr,
        )
        ref = [box3d(geometry, *x).get_iou(box3d(geometry, *y)) for y in ys]
        np.testing.assert_array_equal(got, ref)
        for t in thr:
            np.testing.assert_array_equal(got > t, np.array(ref) > t)


BAD = [
    ((([0, 0, math.nan], [1, 1, 1], [1, 0, 0, 0]),), "a: box 0: translation is not finite ([0.0, 0.0, nan])"),
    ((([[0, 0, 0], [0, 0, 0]], [[1, 1, 1], [1, 0, 1]], [[1, 0, 0, 0]] * 2),), "a: box 1: size must be positive"),
    ((([0, 0, 0], [1, 1, 1], [1, 0, 0]),), "a: rotation has shape (3,), expected (n, 4) or (4,)"),
    ((([0, 0, 0], [1, 1, 1], [0, 0, 0, 0]),), "a: box 0: rotation [0.0, 0.0, 0.0, 0.0] has norm 0"),
    ((([0, 0, 0], [1, 1, math.inf], [1, 0, 0, 0]),), "a: box 0: size is not finite"),
    ((([0, 0, 0], [[1, 1, 1]] * 2, [1, 0, 0, 0]),), "a: size has 2 boxes, translation 1"),
]


@pytest.mark.parametrize("args,message", BAD)
def test_bad_boxes_are_one_line_naming_the_box_and_field(args, message):
    good = ([0, 0, 0], [1, 1, 1], [1, 0, 0, 0])
    for f in (G.iou, G.intersection, G.area_intersection, G.height_intersection):
        with pytest.raises(UsageError) as err:
            f(args[0], good)
        assert message in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(UsageError, match="b: "):
        G.iou(good, args[0])
    with pytest.raises(UsageError, match="boxes: "):
        G.ground_corners(args[0])


def test_unknown_geometry_and_mismatched_pairs():
    good = ([0, 0, 0], [1, 1, 1], [1, 0, 0, 0])
    with pytest.raises(UsageError, match="unknown geometry 'sdk': use corrected or sdk-0.0.8"):
        G.iou(good, good, geometry="sdk")
    two = ([[0, 0, 0]] * 2, [[1, 1, 1]] * 2, [[1, 0, 0, 0]] * 2)
    three = tuple(np.array([v[0]] * 3) for v in two)
    with pytest.raises(UsageError, match="a has 2 boxes and b 3"):
        G.iou(two, three)
    assert G.iou(two, good).shape == (2,) and G.iou(good, three).shape == (3,)
    assert G.iou(two, three, outer=True).shape == (2, 3)


def test_boxes_of_a_file(tmp_path):
    from l5dask.perception.detection import read_boxes
    from tests.detection_data import generate, write_json

    gt, pred = generate(2, seed=1, yaws=True)
    write_json(gt, tmp_path / "gt.json")
    b = read_boxes(str(tmp_path / "gt.json"), "gt")
    cols = (b.xyz, b.size, b.rotation)
    np.testing.assert_array_equal(G.iou(b, b, outer=True), G.iou(cols, cols, outer=True))
    np.testing.assert_array_equal(G.ground_area(b), G.ground_area(cols))


@pytest.mark.parametrize("geometry", G.GEOMETRIES)
def test_iou_at_the_sdks_last_bit_before_a_threshold_decides_as_the_sdk(geometry):
    # a second box raised until the SDK's IoU falls to a threshold, to the last bit (bisection):
    # on both sides of that point the decision "> t" is the SDK's, whatever the compiled IoU's bits
    rng = np.random.default_rng(11)
    (xyz, size, rot), _ = random_boxes(40, 3, 2500.0)
    lows, highs = [], []
    for i in range(len(xyz)):
        t = G.THRESHOLDS[i % 4]
        a = (xyz[i], size[i], rot[i])
        shift = xyz[i] + np.r_[rng.normal(0, 0.05, 2), 0.0]

        def sdk(dz):
            b = (shift + [0, 0, dz], size[i], rot[i])
            return box3d(geometry, *b).get_iou(box3d(geometry, *a))

        lo, hi = 0.0, float(size[i, 2])
        if not (sdk(lo) > t >= sdk(hi)):
            continue
        for _ in range(200):
            mid = (lo + hi) / 2
            if mid in (lo, hi):
                break
            lo, hi = (mid, hi) if sdk(mid) > t else (lo, mid)
        for dz, out in ((lo, lows), (hi, highs)):
            b = (shift + [0, 0, dz], size[i], rot[i])
            out.append((G.iou(b, a, geometry=geometry)[0] > t, sdk(dz) > t))
    assert len(lows) > 20
    assert all(got == want for got, want in lows + highs)
    assert all(want for _, want in lows) and not any(want for _, want in highs)
