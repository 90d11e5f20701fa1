"""What a job report shows, read from MLflow: the parent run, its children, their metric
histories, the job's tables and the children's evaluation rows (a failed job's: what exists)."""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from optw.errors import OptwError, UserError
from optw.evaluate.tables import GROUP_ORDER
from optw.tracking.runs import PARENT_TAG, run_url
from optw.tracking.uri import get_client, tracking_uri

#: Metric histories read from each child run (step = epoch; fine-tuning validates at 0 too).
CURVE_METRICS = ("mean_reward", "val_score", "benchmark_score", "val_gap_ils")
#: Tables of the parent run read from ``tables/<name>.csv``.
JOB_TABLES = ("summary", "regions", "pvalues", "beam_sweep")
_GROUP_BY_ID = ((re.compile(r"^pr\d"), "cordeau"), (re.compile(r"^(c|r|rc)\d"), "solomon"),
                (re.compile(r"^t\d"), "gavalas"))


class RunNotFoundError(OptwError, KeyError):
    """No such job (experiment), parent run or run in the tracking store (a ``KeyError``)."""

    def __str__(self) -> str:  # KeyError's str() would quote the whole message
        return str(self.args[0]) if self.args else ""


@dataclass
class ChildRun:
    """One (stage, key) model of the job."""

    run_id: str
    stage: str
    key: str
    status: str
    tags: dict[str, str]
    curves: dict[str, pd.DataFrame] = field(default_factory=dict)  # metric -> (step, value)
    group: str = "other"
    params: dict[str, str] = field(default_factory=dict)  # e.g. init_from, train.val_tourists
    methods: list[str] = field(default_factory=list)  # of its evaluation rows

    @property
    def started_from(self) -> str:
        """What the run started from: ``release gavalas v1 (sha256 …)``, a model key, or ""."""
        return (f"release {self.tags['release']}" if self.tags.get("release")
                else self.params.get("init_from", ""))


@dataclass(frozen=True)
class DemoUse:
    """How the runs of one stage learned from demonstrations (ILS routes), from their params."""

    stage: str
    runs: int
    demos: int  # most demonstrations per region
    imitation_epochs: int  # most imitation epochs before REINFORCE
    demo_tourists: bool  # REINFORCE epochs drew their tourists from the demonstrations


def _int_param(params: dict[str, str], key: str) -> int:
    try:
        return int(float(params.get(key, "0")))
    except ValueError:
        return 0


@dataclass
class JobData:
    """Everything a report needs, loaded once."""

    uri: str
    parent_run_id: str
    experiment_id: str
    experiment_name: str
    status: str
    start_time: int | None
    end_time: int | None
    tags: dict[str, str]
    children: list[ChildRun]
    tables: dict[str, pd.DataFrame]
    evaluation: pd.DataFrame

    @property
    def job_name(self) -> str:
        return self.tags.get("job", self.experiment_name)

    def run_url(self, run_id: str) -> str | None:
        """The run's page in the MLflow UI for an http(s) store, else ``None``."""
        return run_url(self.uri, self.experiment_id, run_id)

    def releases(self) -> list[str]:
        """The released global models the job started from (its tag ``releases``), e.g.
        ``gavalas v1 (sha256 1a2b3c4d5e6f)``; empty for a job that started from none."""
        return [r.strip() for r in self.tags.get("releases", "").split(";") if r.strip()]

    def demonstrations(self) -> list[DemoUse]:
        """Per stage, the runs whose logged config (``train.demos``) used demonstrations."""
        by_stage: dict[str, list[ChildRun]] = {}
        for c in self.children:
            if _int_param(c.params, "train.demos") > 0:
                by_stage.setdefault(c.stage, []).append(c)
        return [DemoUse(stage, len(runs),
                        max(_int_param(c.params, "train.demos") for c in runs),
                        max(_int_param(c.params, "train.imitation_epochs") for c in runs),
                        any(c.params.get("train.demo_tourists") == "True" for c in runs))
                for stage, runs in by_stage.items()]

    def groups(self) -> list[str]:
        """Groups present, in the paper's order (others after, sorted)."""
        present = {c.group for c in self.children}
        if "group" in self.tables.get("regions", pd.DataFrame()).columns:
            present |= set(self.tables["regions"]["group"].dropna().astype(str))
        return sorted(present, key=lambda g: (GROUP_ORDER.index(g) if g in GROUP_ORDER
                                              else len(GROUP_ORDER), g))


def region_groups(regions: pd.DataFrame | None) -> dict[str, str]:
    """Region -> group of a job's regions table (empty without one)."""
    if regions is None or not {"region", "group"} <= set(regions.columns):
        return {}
    return dict(zip(regions["region"].astype(str), regions["group"].astype(str), strict=True))


def group_of(key: str, known: dict[str, str]) -> str:
    """The group of a region or a ``<stage>-<group>`` model (custom groups from ``known``)."""
    if key in known:
        return known[key]
    tail = key.rsplit("-", 1)[-1]
    if "-" in key and (tail in GROUP_ORDER or tail in known.values()):
        return tail
    return next((group for pattern, group in _GROUP_BY_ID if pattern.match(key)), "other")


def find_parent_run(job: str | None = None, uri: str | None = None) -> str:
    """Run id of the newest parent run of job ``job`` (its experiment), else of any job."""
    client = get_client(uri)
    if job is None:
        exp_ids, filt = [e.experiment_id for e in client.search_experiments()], "tags.job != ''"
    else:
        if (exp := client.get_experiment_by_name(job)) is None:
            raise RunNotFoundError(f"no MLflow experiment named {job!r} in {tracking_uri(uri)}")
        exp_ids, filt = [exp.experiment_id], f"tags.job = '{job}'"
    runs = client.search_runs(exp_ids, filter_string=filt, order_by=["attributes.start_time DESC"],
                              max_results=1000) if exp_ids else []
    if not (parents := [r for r in runs if PARENT_TAG not in r.data.tags]):
        where = f"experiment {job!r}" if job else f"the store {tracking_uri(uri)}"
        raise RunNotFoundError(f"{where} has no parent run of a platform job")
    return parents[0].info.run_id


def _read_csv(client, run_id: str, path: str, tmp: Path) -> pd.DataFrame | None:
    """The run's artifact ``path`` as a table, or None when it is missing or unreadable."""
    try:
        return pd.read_csv(client.download_artifacts(run_id, path, str(tmp)))
    except Exception:  # noqa: BLE001 - a missing or unreadable artifact is no table
        return None


def _history(client, run_id: str, metric: str) -> pd.DataFrame:
    df = pd.DataFrame([(p.step, p.value, p.timestamp)
                       for p in client.get_metric_history(run_id, metric)],
                      columns=["step", "value", "timestamp"])
    # a retried worker may log a step twice: keep the latest point per step
    return (df.sort_values(["step", "timestamp"]).drop_duplicates("step", keep="last")
            .reset_index(drop=True)[["step", "value"]])


def load_job(parent_run_id: str, uri: str | None = None) -> JobData:
    """Read the parent run ``parent_run_id`` and everything of its job from the store."""
    from mlflow.exceptions import MlflowException

    uri = tracking_uri(uri)
    client = get_client(uri)
    try:
        parent = client.get_run(parent_run_id)
    except MlflowException:
        raise RunNotFoundError(f"no run {parent_run_id!r} in {uri}") from None
    if PARENT_TAG in parent.data.tags:
        raise UserError(f"run {parent_run_id} is a child run; pass its parent "
                        f"{parent.data.tags[PARENT_TAG]}")
    exp = client.get_experiment(parent.info.experiment_id)
    found = client.search_runs([exp.experiment_id],
                               filter_string=f"tags.`{PARENT_TAG}` = '{parent_run_id}'",
                               order_by=["attributes.start_time ASC"], max_results=5000)
    evaluation = []
    children: list[ChildRun] = []
    with tempfile.TemporaryDirectory(prefix="optw-report-") as tmp:
        tables = {name: df for name in JOB_TABLES if (df := _read_csv(
            client, parent_run_id, f"tables/{name}.csv", Path(tmp))) is not None}
        known = region_groups(tables.get("regions"))
        for run in found:
            tags = dict(run.data.tags)
            key = tags.get("region", run.info.run_name or run.info.run_id)
            child = ChildRun(run.info.run_id, tags.get("stage", ""), key, run.info.status, tags,
                             {m: _history(client, run.info.run_id, m) for m in CURVE_METRICS
                              if m in run.data.metrics},
                             group=group_of(key, known), params=dict(run.data.params))
            try:
                files = client.list_artifacts(run.info.run_id, "evaluation")
            except Exception:  # noqa: BLE001 - no evaluation folder
                files = []
            for path in [f.path for f in files if f.path.endswith(".csv")]:
                df = _read_csv(client, run.info.run_id, path, Path(tmp))
                if df is not None and len(df):
                    evaluation.append(df.assign(stage=child.stage, model=key))
                    if "method" in df.columns:
                        child.methods += [str(m) for m in dict.fromkeys(df["method"])]
            children.append(child)
    eval_df = pd.concat(evaluation, ignore_index=True) if evaluation else pd.DataFrame(
        columns=["region", "tourist", "kind", "method", "score", "seconds", "stage", "model"])
    eval_df["region"] = eval_df["region"].astype(str)
    return JobData(uri=uri, parent_run_id=parent_run_id, experiment_id=exp.experiment_id,
                   experiment_name=exp.name, status=parent.info.status,
                   start_time=parent.info.start_time, end_time=parent.info.end_time,
                   tags=dict(parent.data.tags), children=children, tables=tables,
                   evaluation=eval_df)
