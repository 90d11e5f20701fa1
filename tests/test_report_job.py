"""The report of a real tiny global-ft job (Ray Train, MLflow, ILS, registry; two tiny regions
of two groups) opened in a real headless Chromium: the global models' learning curves and the
fine-tuning before/after chart are there and decoded; the screenshot is saved as
``test-output/report-job-screenshot.png`` for a person to look at. Slow (a real job)."""

from __future__ import annotations

import pytest

from conftest import local_ray
from test_report import screenshot_report

pytestmark = pytest.mark.slow


def tiny_global_ft_profile(name: str):
    """Two tiny regions of two groups: a global model each (20 epochs, validated every 5),
    fine-tuned for 2 epochs per region, evaluated with beam 2."""
    from optw.distributed import JobProfile

    return JobProfile.from_dict({
        "job": {"name": name, "mode": "global-ft", "regions": ["r199", "pr99"]},
        "train": {"epochs": 20, "batch_size": 4, "val_every": 5, "val_tourists": 4,
                  "checkpoint_every": 10, "threads": 1},
        "finetune": {"epochs": 2},
        "evaluate": {"beams": 2, "validation_tourists": 4, "beam_sweep": [1, 2]},
        "resources": {"cpus_per_region": 1, "max_failures": 1, "regions_per_worker": 1},
    }, source=f"test-{name}")


def test_real_tiny_job_report_in_headless_chromium(tiny_catalog, tmp_path, output_dir):
    """The job's own report (runs/<job>/report, here under --out) shows one learning-curve
    figure of the two global models and one before/after chart of the two fine-tuned
    regions, each fine-tuning run having validated at epoch 0 and at its end."""
    import shutil

    from conftest import copy_catalog
    from optw.catalog import Catalog
    from optw.distributed.job import run_job
    from optw.report import load_job
    from optw.report.plots import finetune_points

    cat = Catalog(copy_catalog(tiny_catalog, tmp_path / "catalog"))  # the job stores ILS here
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with local_ray():
        summary = run_job(tiny_global_ft_profile("report-job"), catalog_dir=cat.path,
                          tracking_uri=uri, out_dir=tmp_path / "out", progress=False)
    index = summary.report
    assert index is not None and index.is_file()
    data = load_job(summary.parent_run_id, uri)
    points = finetune_points(data.children, data.tables.get("regions"))
    assert sorted(points["region"]) == ["pr99", "r199"] and (points["after_epoch"] == 2).all()
    info = screenshot_report(index, tmp_path, output_dir / "report-job-screenshot.png")
    srcs = [src for src, _, _ in info["images"]]
    assert srcs[:2] == ["plots/curves_global.png", "plots/finetune.png"], srcs
    shutil.copytree(index.parent, output_dir / "report-job", dirs_exist_ok=True)
