"""Custom regions go the whole way through the platform.

Two custom regions are added to a private copy of the tiny catalog with the catalog's own
``add_region``: ``towncsv`` from ``tests/fixtures/custom/town.csv`` (group ``custom``) and
``towngeo`` from ``town.geojson`` (a custom group of its own, ``towns``). The job then runs as a
user would start it (``optw job run --mode transfer-to --groups custom,towns --from-groups
solomon --catalog ...``: the command line's profile, checked against THAT catalog) on a real
local Ray and a temporary MLflow sqlite store: ILS baseline, a global model of the Solomon group
(the tiny r199) evaluated as it is on both towns, then fine-tuned on each for a few epochs,
evaluation, registry, report. Then the planner (Ray Serve on the same Ray) serves the
registered champions over HTTP, and a lat/lon start with "HH:MM" times gets a named itinerary
that passes the route validator. (Training from scratch runs through the same job, worker and
evaluation code: test_embedded.py's job and test_distributed.py's killed-worker job.)
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import pandas as pd
import pytest

from conftest import copy_catalog, local_ray
from planner_service import check_legs, first_plan, get_json, validate_answer

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

FIXTURES = Path(__file__).parent / "fixtures" / "custom"
CUSTOM = {"towncsv": ("town.csv", "custom"), "towngeo": ("town.geojson", "towns")}
TINY_TRAIN = {"epochs": 4, "batch_size": 4, "val_every": 2, "val_tourists": 4,
              "checkpoint_every": 0, "threads": 1}


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("custom-job")


@pytest.fixture(scope="module")
def custom_catalog(root, tiny_catalog):
    """The tiny catalog plus the two towns (copies of the fixture files, as a user adds them)."""
    from optw.catalog import Catalog, add_region

    copy_catalog(tiny_catalog, root / "catalog")
    for rid, (name, group) in CUSTOM.items():
        src = root / name
        shutil.copy(FIXTURES / name, src)
        add_region(rid, src, catalog=root / "catalog", group=group)
    return Catalog(root / "catalog")


@pytest.fixture(scope="module")
def store(root) -> str:
    return f"sqlite:///{root / 'mlflow.db'}"


@pytest.fixture(scope="module")
def ray_cluster(store):
    """A local Ray for the job and the planner; the tracking store is in the environment
    before Ray starts, so the planner's replicas read the same registry."""
    from optw.tracking import get_client

    mp = pytest.MonkeyPatch()
    mp.setenv("MLFLOW_TRACKING_URI", store)
    get_client(store)
    with local_ray(dashboard=True) as ray:
        yield ray
    mp.undo()


def _profile(catalog, name: str, argv_mode: str = "scratch", **job):
    """The job's profile as ``optw job run`` builds it: a tiny profile file plus the command
    line's overrides, its groups checked against ``--catalog``. Each worker asks for both CPUs
    of the test cluster: a stage's models train in one worker (one Ray Train run)."""
    from optw.distributed.cli import profile_from_args

    path = Path(catalog.path).parent / f"{name}.toml"
    train = "\n".join(f"{k} = {v}" for k, v in TINY_TRAIN.items())
    path.write_text(f"[job]\nname = '{name}'\n[train]\n{train}\n[finetune]\nepochs = 2\n"
                    "[evaluate]\nbeams = 2\nvalidation_tourists = 4\nbeam_sweep = [1, 2]\n"
                    "[resources]\ncpus_per_region = 2\nregions_per_worker = 2\n")
    args = argparse.Namespace(profile=str(path), groups=job.get("groups"),
                              regions=job.get("regions"), from_groups=job.get("from_groups"),
                              mode=argv_mode, name=None, catalog=str(catalog.path))
    return profile_from_args(args, catalog)


@pytest.fixture(scope="module")
def job(ray_cluster, custom_catalog, store, root):
    """``optw job run --mode transfer-to --groups custom,towns --from-groups solomon`` on the
    custom catalog."""
    from optw.distributed.job import run_job

    profile = _profile(custom_catalog, "towns", argv_mode="transfer-to", groups="custom,towns",
                       from_groups="solomon")
    return run_job(profile, catalog_dir=custom_catalog.path, tracking_uri=store,
                   storage=root / "ray_train", out_dir=root / "out", progress=False)


def test_unknown_custom_group_is_refused_naming_it(custom_catalog, tiny_catalog):
    """A group the job's catalog does not have fails before anything runs, naming the option
    and the group (the profile is checked against the job's catalog, whose custom groups it
    may name, also in [global.<group>] tables); ``custom`` on a catalog without custom regions
    says how to add one."""
    from optw.distributed.plan import UnknownGroupError, select_regions
    from optw.distributed.profile import load_profile
    from optw.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^--groups: job\.groups.*'villages'.*'towns'"):
        _profile(custom_catalog, "bad", groups="custom,villages")
    path = Path(custom_catalog.path).parent / "global-towns.toml"
    path.write_text("[job]\ngroups = ['towns']\nmode = 'global-ft'\n[global.towns]\nepochs = 3\n")
    assert load_profile(path, custom_catalog).global_train["towns"].epochs == 3
    with pytest.raises(ConfigError, match=r"\[global\.towns\]: unknown group 'towns'"):
        load_profile(path, tiny_catalog)
    assert select_regions(custom_catalog, ["towns"], []) == ["towngeo"]
    assert select_regions(custom_catalog, ["custom", "solomon"], []) == ["r199", "towncsv"]
    with pytest.raises(UnknownGroupError, match=r"\['custom'\].*optw catalog add"):
        select_regions(tiny_catalog, ["custom"], [])
    with pytest.raises(UnknownGroupError, match=r"\['villages'\]"):
        select_regions(custom_catalog, ["villages"], [])


def test_custom_regions_train_evaluate_register_and_report(job, custom_catalog, store):
    """The job trains both towns (ILS baseline first), evaluates them against ILS, registers a
    champion for each with the town's data bundled, and writes its tables and report with
    the custom groups ("custom", "towns") as groups of their own."""
    from optw.tracking import champion

    assert sorted(job.trained) == sorted(["source-solomon", *CUSTOM])
    assert sorted(job.registered) == sorted(CUSTOM)
    for rid in CUSTOM:
        champ = champion(rid, uri=store)
        assert champ is not None and champ.version == job.registered[rid]
    df = pd.read_parquet(job.results_path)
    assert set(df["region"]) == set(CUSTOM) and {"ft_tl", "ft_tl_greedy"} <= set(df["method"])
    summary = job.tables["summary"]
    assert {"custom", "towns"} <= set(summary["group"].astype(str))
    assert summary["ils"].notna().all() and summary["gap_ils"].notna().all()
    page = job.report.read_text()
    assert "towncsv" in page and "towngeo" in page
    # `optw evaluate` with the best-known reference: custom regions simply have none
    from optw.baselines import load_ils_results
    from optw.evaluate import evaluate, load_best_known, validate_results
    from optw.evaluate.tables import default_reference_path

    if default_reference_path().exists():
        clean = validate_results(df.drop(columns=["kind"]), custom_catalog, check_routes=False)
        tables = evaluate(clean, load_ils_results(custom_catalog.path), load_best_known())
        assert tables["regions"]["best_known"].isna().all()
        assert tables["regions"]["gap_ils"].notna().all()


def test_job_logs_its_tables_and_a_rerun_changes_nothing(job, custom_catalog, store, root):
    """The job's summary table is logged to its parent run and each town has one registry
    version; running the job again (same profile and catalog) skips every region, registers
    nothing new and keeps the earlier report, results and parent run."""
    from optw.distributed.job import run_job
    from optw.tracking import get_client

    client = get_client(store)
    arts = [a.path for a in client.list_artifacts(job.parent_run_id, "tables")]
    assert any("summary" in a for a in arts), arts
    report = job.report.read_bytes()
    profile = _profile(custom_catalog, "towns", argv_mode="transfer-to", groups="custom,towns",
                       from_groups="solomon")
    again = run_job(profile, catalog_dir=custom_catalog.path, tracking_uri=store,
                    storage=root / "ray_train", out_dir=root / "out", progress=False)
    assert sorted(again.skipped) == sorted(CUSTOM) and again.trained == []
    assert again.parent_run_id == job.parent_run_id and again.report == job.report
    assert job.report.read_bytes() == report and again.results_path == job.results_path
    for rid in CUSTOM:
        assert len(client.search_model_versions(f"name = 'optw-{rid}'")) == 1


def test_planner_plans_a_latlon_trip_with_clock_times(job, custom_catalog, store):
    """The planner serves the job's champions: a lat/lon start near the station and "HH:MM"
    times get an itinerary of the town's POI names, clock times and travel legs that passes
    the route validator (for the CSV and the GeoJSON town alike)."""
    from optw.serve import start_planner, stop_planner
    from optw.tracking.server import free_port

    url = start_planner(port=free_port(), catalog=custom_catalog.path, tracking_uri=store,
                        check_interval=30)
    try:
        status, regions = get_json(f"{url}/regions")
        assert status == 200, regions
        for rid in CUSTOM:
            region = custom_catalog.region(rid)
            body = {"region": rid, "start": {"lat": 43.8380, "lon": 10.5060},
                    "t_start": "09:30", "t_end": "17:00", "method": "beam", "beams": 2}
            # the region's first plan: 503 "try again" while its model loads on a busy machine
            status, ans = first_plan(f"{url}/plan", body)
            assert status == 200, ans
            assert ans["coords"] == "latlon"
            assert int(ans["model_version"]) == job.registered[rid]  # the job's champion
            assert (ans["t_start_clock"], ans["t_end_clock"]) == ("09:30", "17:00")
            assert ans["visits"] >= 1
            validate_answer(region, ans)
            check_legs(region, ans)
            for s in ans["route"][1:-1]:
                assert s["name"] == region.names[s["node"]]
    finally:
        stop_planner()


def test_transfer_to_fine_tunes_a_benchmark_global_model_onto_the_towns(job, root):
    """Mode ``transfer-to``: the global model of the Solomon regions (r199 here, no town) is
    evaluated as it is on each town (``tl``), then fine-tuned on each town from its final
    checkpoint (the fine-tuning budget) and registered (``ft_tl``); both methods are in the
    job's results and summary table."""
    import torch

    models = root / "out" / "models"
    glob = torch.load(models / "global-source-solomon.pt", weights_only=True)
    assert glob["train"]["config"]["regions"] == ["r199"]
    for rid in CUSTOM:
        ft = torch.load(models / f"finetune-{rid}.pt", weights_only=True)
        assert ft["train"]["config"]["finetune"] is True and ft["train"]["epoch"] == 2
        assert ft["train"]["config"]["regions"] == [rid]
    methods = set(pd.read_parquet(job.results_path)["method"])
    assert {"tl", "tl_greedy", "ft_tl"} <= methods
    assert {"tl", "ft_tl"} <= set(job.tables["summary"]["method"])


def test_report_groups_custom_models_by_their_group():
    """The report puts a custom group's global model (``global-custom``) and a transfer-to
    source model (``source-solomon``) under their groups, not under "other"."""
    from optw.report.data import group_of

    known = {"towncsv": "custom", "towngeo": "towns", "r199": "solomon"}
    assert group_of("global-custom", known) == "custom"
    assert group_of("global-towns", known) == "towns"
    assert group_of("source-solomon", known) == "solomon"
    assert group_of("towngeo", known) == "towns" and group_of("global-nope", known) == "other"
