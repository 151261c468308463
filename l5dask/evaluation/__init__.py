"""Evaluation at scale: L5Kit's ground-truth and prediction CSVs, metrics, agent masks, ground
truth and chopped test sets, exact against L5Kit 1.5.0 and chunk-parallel.

The names mirror ``l5kit.evaluation`` (contract: the spec's ``evaluation.md``).
"""

from l5dask.evaluation.csvfiles import (MAX_MODES, CSVError, open_csv, read_gt_csv, read_pred_csv, scan,  # noqa: F401
                       write_gt_csv, write_pred_csv)
