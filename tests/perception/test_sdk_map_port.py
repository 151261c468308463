"""The Lyft SDK's tests of its detection evaluation (``tests/test_map.py`` of lyft/nuscenes-devkit,
89 tests with their parameters), ported to l5dask's public API: the box geometry of
:mod:`l5dask.perception.geometry` where the SDK builds ``Box3D``s, :func:`l5dask.perception.evaluate`
where it calls ``recall_precision``. The SDK's inputs and assertions (its ``np.isclose`` and ``==``)
are kept; each test names the one it ports. The test data is the SDK's own (tests/sdk_test_jsons,
with its license). Every test runs in both geometries (the SDK's tests use yaws of 0, 90 and 180
degrees, where the two agree)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from l5dask.perception import evaluate
from l5dask.perception import geometry as G

DATA = Path(__file__).parent / "sdk_test_jsons"


@pytest.fixture(params=G.GEOMETRIES, autouse=True)
def geometry(request):
    return request.param


def box(translation, size, rotation):
    return (translation, size, rotation)


def one(values) -> float:
    (v,) = np.asarray(values).reshape(-1).tolist()
    return v


# --- Box3D ------------------------------------------------------------------------------------------
ROTATIONS = [
    [1, 0, 0, 0],  # angle = 0
    [0, 0, 0, 1],  # 180 rotation around z axis
    [math.sqrt(0.5), 0, 0, math.sqrt(0.5)],  # 90 rotation around z axis
]


@pytest.mark.parametrize("rotation", ROTATIONS)
def test_fround_area(rotation, geometry):
    """Ports test_map.py::test_fround_area."""
    translation = [0, 0, 1.5]
    size = 2, 4, translation[2] * 2  # width, length, height
    b = box(translation, size, rotation)
    assert one(G.volume(b)) == np.prod(size)


@pytest.mark.parametrize("rotation", ROTATIONS)
def test_ground_area(rotation, geometry):
    """Ports test_map.py::test_ground_area."""
    translation = [0, 0, 1.5]
    size = 2, 4, translation[2] * 2  # width, length, height
    b = box(translation, size, rotation)
    assert one(G.volume(b)) == np.prod(size)
    length, width = size[1], size[0]
    assert np.isclose(one(G.ground_area(b, geometry)), length * width, rtol=1e-05, atol=1e-08, equal_nan=False)


ORIGINAL = box([0, 0, 1.5], [2, 4, 3], [1, 0, 0, 0])


@pytest.mark.parametrize(
    ["target_box", "intersection"],
    [
        (box([0, 0, 1.5], [2, 4, 3], [1, 0, 0, 0]), 24),
        (box([4, 0, 1.5], [2, 4, 3], [1, 0, 0, 0]), 0),
        (box([0, 0, 1.5], [2, 2, 3], [1, 0, 0, 0]), 12),
        (box([0, 0, 1.5], [2, 4, 3], [0, 0, 0, 1]), 24),
        (box([0, 0, 1.5], [2, 4, 3], [math.sqrt(0.5), 0, 0, math.sqrt(0.5)]), 12),
    ],
)
def test_intersection(target_box, intersection, geometry):
    """Ports test_map.py::test_intersection."""
    got = one(G.intersection(ORIGINAL, target_box, geometry=geometry))
    assert np.isclose(got, intersection, rtol=1e-05, atol=1e-08, equal_nan=False)


CAR = box([2680.2830359779, 698.1969292853, -18.0477669237], [2.064, 5.488, 2.053], [0.2654919368, 0, 0, 0.9641130802])


def test_self(geometry):
    """Ports test_map.py::test_self."""
    b = CAR
    assert one(G.volume(b)) == np.prod([2.064, 5.488, 2.053])
    assert np.isclose(one(G.ground_area(b, geometry)), 2.064 * 5.488)
    assert np.isclose(one(G.area_intersection(b, b, geometry=geometry)), 2.064 * 5.488)
    assert np.isclose(one(G.height_intersection(b, b)), 2.053)
    assert np.isclose(one(G.intersection(b, b, geometry=geometry)), one(G.volume(b)))
    assert np.isclose(one(G.iou(b, b, geometry=geometry)), 1)


@pytest.mark.parametrize(
    ["original_box", "target_box", "intersection", "height_intersection", "area_intersection"],
    [(CAR, CAR, 23.254807296, 2.053, 2.064 * 5.488)],
)
def test_intersection_couples(original_box, target_box, intersection, height_intersection, area_intersection, geometry):
    """Ports test_map.py::test_intersection_couples."""
    assert np.isclose(
        one(G.height_intersection(original_box, target_box)),
        height_intersection,
        rtol=1e-05,
        atol=1e-08,
        equal_nan=False,
    )
    assert np.isclose(
        one(G.area_intersection(original_box, target_box, geometry=geometry)),
        area_intersection,
        rtol=1e-05,
        atol=1e-08,
        equal_nan=False,
    )


@pytest.mark.parametrize(
    ["target_box", "iou"],
    [
        (box([0, 0, 1.5], [2, 4, 3], [1, 0, 0, 0]), 1),
        (box([4, 0, 1.5], [2, 4, 3], [1, 0, 0, 0]), 0),
        # same but twice smaller
        (box([0, 0, 1.5], [2, 2, 3], [1, 0, 0, 0]), 0.5),
        # rotate by 180
        (box([0, 0, 1.5], [2, 4, 3], [0, 0, 0, 1]), 1),
        # rotated by 90
        (box([0, 0, 1.5], [2, 4, 3], [math.sqrt(0.5), 0, 0, math.sqrt(0.5)]), 1 / 3),
    ],
)
def test_iou(target_box, iou, geometry):
    """Ports test_map.py::test_iou."""
    assert np.isclose(one(G.iou(ORIGINAL, target_box, geometry=geometry)), iou, rtol=1e-05, atol=1e-08, equal_nan=False)


# --- recall_precision and the mAP -------------------------------------------------------------------
def _map(gt_file: Path, pred_file: Path, iou: float, geometry: str) -> dict:
    return evaluate(str(pred_file), str(gt_file), iou_thresholds=[iou], geometry=geometry)


@pytest.mark.parametrize("iou_threshold", np.arange(0, 1, 0.05))
def test_itself(iou_threshold, geometry, tmp_path):
    """Ports test_map.py::test_itself: same boxes, with all scores being the same should give 1 as mAP
    (the SDK's recall_precision of the class car: evaluate's AP of car)."""
    list_boxes = json.loads((DATA / "samples_merged.json").read_text())
    for item in list_boxes:
        item["score"] = 1
    (tmp_path / "boxes.json").write_text(json.dumps(list_boxes))
    r = _map(tmp_path / "boxes.json", tmp_path / "boxes.json", float(iou_threshold), geometry)
    assert r["ap"]["car"] == [1]


IOUS = [0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95]


@pytest.mark.parametrize("iou", IOUS)
def test_ground_truth(iou, geometry):
    """Ports test_map.py::test_ground_truth: the ground truth (not all classes present) as predictions.
    (The SDK's calc_map is the mean AP over the ground truth's classes: evaluate's mAP.)"""
    r = _map(DATA / "true_gt.json", DATA / "test_file_for_true_result.json", iou, geometry)
    assert r["map"] == [1]


@pytest.mark.parametrize("iou", IOUS)
def test_ground_truth_with_all_classes(iou, geometry):
    """Ports test_map.py::test_ground_truth_with_all_classes: the ground truth with all classes
    present, as predictions."""
    r = _map(DATA / "all_class_gt.json", DATA / "test_file_with_all_classes.json", iou, geometry)
    assert r["map"] == [1]


# --- boxes of the SDK's files and moved boxes -----------------------------------------------------------
def get_ground_truth_and_pred_box():
    """The SDK's helper of the same name: the first box of each of two files, as (translation,
    size, rotation)."""
    gt = json.loads((DATA / "all_class_gt.json").read_text())[0]
    pred = json.loads((DATA / "test_file_with_all_classes.json").read_text())[0]
    return box(gt["translation"], gt["size"], gt["rotation"]), box(pred["translation"], pred["size"], pred["rotation"])


def modify_prediction_and_get_box(translation=(0, 0, 0), size=(1, 1, 1), rotation=(0, 0, 0, 1)):
    """The SDK's helper of the same name."""
    return box([0, 0, 0], [1, 1, 1], [0, 0, 0, 1]), box(list(translation), list(size), list(rotation))


def _iou_of(geometry, **kw) -> float:
    ground_truth_box, prediction_box = modify_prediction_and_get_box(**kw)
    return one(G.iou(ground_truth_box, prediction_box, geometry=geometry))


def test_translation_change_x(geometry):
    """Ports test_map.py::test_translation_change_x: move the center_x of the prediction."""
    assert np.isclose(_iou_of(geometry, translation=[0.5, 0, 0]), 0.3333333, 1e-7)


def test_translation_change_y(geometry):
    """Ports test_map.py::test_translation_change_y: move the center_y of the prediction."""
    assert np.isclose(_iou_of(geometry, translation=[0, 0.5, 0]), 0.3333333, 1e-7)


def test_translation_change_z(geometry):
    """Ports test_map.py::test_translation_change_z: move the center_z of the prediction."""
    assert np.isclose(_iou_of(geometry, translation=[0, 0, 0.5]), 0.3333333, 1e-7)


def test_width_change(geometry):
    """Ports test_map.py::test_width_change."""
    assert np.isclose(_iou_of(geometry, size=[2, 1, 1]), 0.5, 1e-7)


def test_length_change(geometry):
    """Ports test_map.py::test_length_change."""
    assert np.isclose(_iou_of(geometry, size=[1, 2, 1]), 0.5, 1e-7)


def test_height_change(geometry):
    """Ports test_map.py::test_height_change."""
    assert np.isclose(_iou_of(geometry, size=[1, 1, 2]), 0.5, 1e-7)


def test_touch_edge_bounding_boxes(geometry):
    """Ports test_map.py::test_touch_edge_bounding_boxes: boxes meeting at an edge."""
    assert np.isclose(_iou_of(geometry, translation=[1, 1, 0]), 0, 1e-7)


def test_touch_side_bounding_boxes(geometry):
    """Ports test_map.py::test_touch_side_bounding_boxes: boxes meeting at a side."""
    assert np.isclose(_iou_of(geometry, translation=[0, 1, 0]), 0, 1e-7)


def test_touch_corner_bounding_boxes(geometry):
    """Ports test_map.py::test_touch_corner_bounding_boxes: boxes meeting at a corner."""
    assert np.isclose(_iou_of(geometry, translation=[1, 1, 1]), 0, 1e-7)


def test_area_intersection(geometry):
    """Ports test_map.py::test_area_intersection: the area intersection with itself."""
    ground_truth_box, prediction_box = get_ground_truth_and_pred_box()
    ground_truth_base = one(G.ground_area(ground_truth_box, geometry))
    got = one(G.area_intersection(ground_truth_box, prediction_box, geometry=geometry))
    assert np.isclose(got, ground_truth_base, 1e-7)


def test_height_intersection(geometry):
    """Ports test_map.py::test_height_intersection: the height intersection with itself."""
    ground_truth_box, prediction_box = get_ground_truth_and_pred_box()
    assert np.isclose(one(G.height_intersection(ground_truth_box, prediction_box)), ground_truth_box[1][2], 1e-7)


def test_selfintersection(geometry):
    """Ports test_map.py::test_selfintersection: the intersection with itself."""
    ground_truth_box, prediction_box = get_ground_truth_and_pred_box()
    area_calculated = one(G.ground_area(ground_truth_box, geometry)) * ground_truth_box[1][2]
    assert np.isclose(one(G.intersection(ground_truth_box, prediction_box, geometry=geometry)), area_calculated, 1e-7)


def test_selfiou(geometry):
    """Ports test_map.py::test_selfiou: the IoU with itself."""
    ground_truth_box, prediction_box = get_ground_truth_and_pred_box()
    assert np.isclose(one(G.iou(ground_truth_box, prediction_box, geometry=geometry)), 1, 1e-7)


def test_the_port_has_all_89():
    """Not a port: the count of the SDK's tests (with their parameters) that this file ports."""
    import sys

    module = sys.modules[__name__]
    counts = {"test_fround_area": 3, "test_ground_area": 3, "test_intersection": 5, "test_iou": 5, "test_itself": 20}
    counts |= {"test_ground_truth": 19, "test_ground_truth_with_all_classes": 19}
    ported = [n for n in dir(module) if n.startswith("test_") and n != "test_the_port_has_all_89"]
    total = 0
    for name in ported:
        marks = getattr(getattr(module, name), "pytestmark", [])
        n = 1
        for m in marks:
            if m.name == "parametrize":
                n *= len(m.args[1])
        assert n == counts.get(name, 1), name
        total += n
    assert total == 89
