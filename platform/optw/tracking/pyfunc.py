"""The registered artifact: an MLflow pyfunc model that carries one region's checkpoint.

Layout of a saved model (``mlflow.pyfunc`` "models from code", no pickled Python objects)::

    MLmodel                 flavor python_function, config {region, catalog_version, ...}
    _model_code.py          entry point: ``set_model(OptwSolverModel())``
    artifacts/<name>.pt     the checkpoint (optw.model format)
    artifacts/region.json   the region's data, so serving needs no catalog (when available)

Loading needs ``optw`` installed (``pip install -e .``); ``optw.model`` and ``optw.decode`` are
imported only when the model is first used, so this module imports without them.

Input of ``predict``: a DataFrame or a list of tourist dicts ``{start: [x, y], t_start, t_end,
scores}`` (missing keys take the region's benchmark values; ``scores`` has one value per node,
or per point of interest without the start/end nodes). Params: ``method`` (default ``beam``),
``beams`` (default 16). Output: a DataFrame with ``route, score, seconds`` per tourist.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import math
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import mlflow.pyfunc
import numpy as np
import pandas as pd

MODEL_CODE = Path(__file__).with_name("_model_code.py")
DEFAULT_METHOD = "beam"
DEFAULT_BEAMS = 16


# ----------------------------------------------------------------------------- region / tourists


def region_to_json(region) -> str:
    """A catalog ``Region`` as JSON (arrays with their dtype), for the model's artifacts."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(region):
        if not f.init or f.name.startswith("_"):
            continue
        value = getattr(region, f.name)
        if isinstance(value, np.ndarray):
            value = {"__array__": value.tolist(), "dtype": str(value.dtype)}
        out[f.name] = value
    return json.dumps(out)


def region_from_json(text: str):
    from optw.catalog import Region

    data = json.loads(text)
    kwargs = {k: (np.asarray(v["__array__"], dtype=v["dtype"])
                  if isinstance(v, dict) and "__array__" in v else v) for k, v in data.items()}
    return Region(**kwargs)


def _records(data: Any) -> list[Mapping[str, Any]]:
    if hasattr(data, "to_dict") and hasattr(data, "columns"):  # pandas DataFrame
        return data.to_dict("records")
    if isinstance(data, Mapping):
        return [data]
    if isinstance(data, (list, tuple)):
        return list(data)
    raise TypeError(f"tourists must be a Tourists batch, a dict, a list of dicts or a "
                    f"DataFrame, not {type(data).__name__}")


def tourists_from_records(region, data: Any):
    """A ``Tourists`` batch of ``region`` from records (see the module docstring)."""
    from optw.catalog import Tourists

    if isinstance(data, Tourists):
        if data.region_id != region.id:
            raise ValueError(f"tourists of region {data.region_id} given to a {region.id} model")
        return data
    recs = _records(data)
    if not recs:
        raise ValueError("no tourists given")
    n = region.n_nodes
    start, t_start, t_end, scores, ids = [], [], [], [], []
    for i, rec in enumerate(recs):
        if not isinstance(rec, Mapping):
            raise TypeError(f"tourist {i}: expected a dict, got {type(rec).__name__}")
        xy = rec.get("start", rec.get("start_xy"))
        xy = np.asarray(region.start_xy if xy is None else xy, dtype=np.float64).reshape(-1)
        if xy.shape != (2,):
            raise ValueError(f"tourist {i}: start must be [x, y]")
        s = rec.get("scores")
        s = np.asarray(region.score if s is None else s, dtype=np.float64).reshape(-1)
        if s.shape[0] == n - 2:
            s = np.concatenate([[0.0], s, [0.0]])
        elif s.shape[0] != n:
            raise ValueError(f"tourist {i}: {s.shape[0]} scores for region {region.id} with "
                             f"{n - 2} points of interest ({n} nodes)")
        start.append(xy)
        scores.append(s)
        t_start.append(float(rec.get("t_start", region.t_start)))
        t_end.append(float(rec.get("t_end", region.t_end)))
        ids.append(int(rec.get("tourist", i)))
    return Tourists(region_id=region.id, tourist_id=np.asarray(ids, dtype=np.int64),
                    kind="generated", start_xy=np.stack(start), t_start=np.asarray(t_start),
                    t_end=np.asarray(t_end), scores=np.stack(scores))


def solutions_frame(solutions):
    """``list[Solution]`` -> DataFrame ``route, score, seconds`` (JSON-friendly cells)."""
    rows = [{"route": [int(v) for v in getattr(s, "route", [])],
             "score": float(getattr(s, "score", math.nan)),
             "seconds": float(getattr(s, "seconds", math.nan))} for s in solutions]
    return pd.DataFrame(rows, columns=["route", "score", "seconds"])


# ----------------------------------------------------------------------------- the model


class OptwSolverModel(mlflow.pyfunc.PythonModel):
    """Pyfunc wrapper of one region's checkpoint; torch model and region load on first use."""

    def __init__(self) -> None:
        self.config: dict[str, Any] = {}
        self.region_id: str | None = None
        self.checkpoint: str | None = None
        self._region_file: str | None = None
        self._model = None
        self._region = None

    def load_context(self, context) -> None:
        self.config = dict(context.model_config or {})
        self.region_id = self.config.get("region")
        self.checkpoint = context.artifacts["checkpoint"]
        self._region_file = context.artifacts.get("region")

    @property
    def model(self):
        """The torch model (``optw.model.load_model`` of the checkpoint), loaded once."""
        if self._model is None:
            from optw.model import load_model

            self._model = load_model(self.checkpoint)
        return self._model

    @property
    def region(self):
        """The region: bundled ``region.json``, else the catalog (``optw.catalog``)."""
        if self._region is None:
            if self._region_file and Path(self._region_file).is_file():
                self._region = region_from_json(Path(self._region_file).read_text())
            else:
                from optw.catalog import open_catalog

                self._region = open_catalog().region(self.region_id)
        return self._region

    def solve(self, tourists: Any, method: str = DEFAULT_METHOD, beams: int = DEFAULT_BEAMS):
        """``optw.decode.solve`` for these tourists -> ``list[Solution]``."""
        from optw.decode import solve

        batch = tourists_from_records(self.region, tourists)
        return solve(self.model, self.region, batch, method=method, beams=int(beams))

    def predict(self, context, model_input: pd.DataFrame,
                params: dict[str, Any] | None = None) -> pd.DataFrame:
        """Solve each tourist (a DataFrame row; a list of dicts works too) -> DataFrame
        ``route, score, seconds``. The DataFrame hint tells MLflow not to coerce the input."""
        params = params or {}
        sols = self.solve(model_input, method=params.get("method") or DEFAULT_METHOD,
                          beams=int(params.get("beams") or DEFAULT_BEAMS))
        return solutions_frame(sols)


def _requirements() -> list[str]:
    reqs = []
    for dist in ("mlflow", "torch", "numpy", "pandas"):
        try:
            version = importlib.metadata.version(dist).split("+", 1)[0]
            reqs.append(f"{dist}=={version}")
        except importlib.metadata.PackageNotFoundError:
            reqs.append(dist)
    return reqs


def save_pyfunc(path: str | Path, region_id: str, checkpoint: str | Path, *,
                region=None, config: Mapping[str, Any] | None = None) -> Path:
    """Write the pyfunc model folder for ``region_id`` at ``path`` (which must not exist).

    ``region`` (a catalog ``Region``) is bundled as ``region.json`` when given. ``config`` adds
    entries to the model config (``MLmodel``), e.g. ``catalog_version`` and ``config_hash``.
    """
    from mlflow.models.signature import ModelSignature
    from mlflow.types.schema import ParamSchema, ParamSpec

    path, checkpoint = Path(path), Path(checkpoint)
    if not checkpoint.is_file():
        raise FileNotFoundError(f"checkpoint {checkpoint} not found")
    signature = ModelSignature(inputs=None, params=ParamSchema([
        ParamSpec("method", "string", DEFAULT_METHOD), ParamSpec("beams", "long", DEFAULT_BEAMS),
    ]))
    model_config = {"region": region_id, **{k: v for k, v in (config or {}).items()
                                             if isinstance(v, (str, int, float, bool))}}
    with tempfile.TemporaryDirectory(prefix="optw-region-") as tmp:
        artifacts = {"checkpoint": str(checkpoint)}
        if region is not None:
            region_file = Path(tmp) / "region.json"
            region_file.write_text(region_to_json(region))
            artifacts["region"] = str(region_file)
        with warnings.catch_warnings():  # "add type hints", "no input example": not for us
            warnings.simplefilter("ignore", UserWarning)
            mlflow.pyfunc.save_model(
                str(path), python_model=str(MODEL_CODE), artifacts=artifacts,
                model_config=model_config, signature=signature,
                pip_requirements=_requirements(),
                metadata={"optw_region": region_id,
                          "requires": "optw-platform (pip install -e .)"},
            )
    return path
