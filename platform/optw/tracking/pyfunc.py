"""The registered artifact (docs/tracking.md): an MLflow pyfunc model "from code" with one
region's checkpoint and ``region.json``; the model and decoder are imported on first use."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import logging
import numbers
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mlflow.pyfunc
import numpy as np
import pandas as pd

from optw.errors import OptwError, UserError

if TYPE_CHECKING:
    from optw.catalog import Region, TouristBatch

MODEL_CODE = Path(__file__).with_name("_model_code.py")
DEFAULT_METHOD = "beam"
log = logging.getLogger(__name__)


class MissingCheckpointError(OptwError, FileNotFoundError):
    """A checkpoint file to register or bundle that does not exist (names the path)."""


def region_to_json(region) -> str:
    """A catalog ``Region`` as JSON (arrays with their dtype), for the model's artifacts."""
    fields = {f.name: getattr(region, f.name) for f in dataclasses.fields(region)
              if f.init and not f.name.startswith("_")}
    return json.dumps(fields, default=_array_json)


def _array_json(value: Any) -> dict:
    if not isinstance(value, np.ndarray):  # as json.dumps itself: an unknown type is an error
        raise TypeError(f"region field of type {type(value).__name__} is not JSON serializable")
    return {"__array__": value.tolist(), "dtype": str(value.dtype)}


def region_from_json(text: str):
    """The ``Region`` of :func:`region_to_json`'s text."""
    from optw.catalog import Region

    return Region(**{k: (np.asarray(v["__array__"], dtype=v["dtype"])
                         if isinstance(v, dict) and "__array__" in v else v)
                      for k, v in json.loads(text).items()})


def _records(data: Any) -> list[Any]:
    if hasattr(data, "to_dict") and hasattr(data, "columns"):  # pandas DataFrame
        return data.to_dict("records")
    if isinstance(data, Mapping):
        return [data]
    if isinstance(data, (list, tuple)):
        return list(data)
    raise UserError(f"tourists must be a Tourists batch, a dict, a list of dicts or a "
                    f"DataFrame, not {type(data).__name__}")


def _alias(rec: Any) -> Any:
    """``start_xy`` (the ``Tourists`` field name) is accepted for ``start``."""
    if not isinstance(rec, Mapping) or "start_xy" not in rec:
        return rec
    if "start" in rec:
        from optw.catalog import TouristError

        raise TouristError("start_xy", "start_xy: give start or start_xy, not both")
    return {("start" if k == "start_xy" else k): v for k, v in rec.items()}


def tourists_from_records(region: Region, data: Any) -> TouristBatch:
    """The :class:`~optw.catalog.TouristBatch` of a ``Tourists`` batch or records."""
    from optw.catalog import TouristBatch, Tourists, read_tourists

    if isinstance(data, Tourists):
        if data.region_id != region.id:
            raise UserError(f"tourists of region {data.region_id} given to a {region.id} model")
        return TouristBatch.of(data)
    return read_tourists([_alias(r) for r in _records(data)], region, defaults=True)


class OptwSolverModel(mlflow.pyfunc.PythonModel):
    """Pyfunc wrapper of one region's checkpoint; torch model and region load on first use."""

    def __init__(self) -> None:
        self.region_id: str | None = None
        self.checkpoint: str | None = None
        self._region_file: str | None = None
        self._model = None
        self._region = None
        self._region_checked = False

    def load_context(self, context) -> None:
        self.region_id = (context.model_config or {}).get("region")
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

    def check_region(self) -> str | None:
        """:func:`optw.decode.region_mismatch`'s warning (logged on the first call) or None."""
        from optw.decode import region_mismatch

        if (warning := region_mismatch(self.model, self.region)) and not self._region_checked:
            log.warning("optw model of region %s (%s): %s", self.region.id,
                        self.checkpoint or "in memory", warning)
        self._region_checked = True
        return warning

    def solve(self, tourists: Any, method: str = DEFAULT_METHOD, beams: int | None = None):
        """``optw.decode.solve`` for these tourists -> ``list[Solution]`` (``tourist``: the given
        id); ``beams`` (default SERVE_BEAMS) is checked here, at the model's edge."""
        import torch

        from optw.decode import METHODS, solve
        from optw.decode.limits import SERVE_BEAMS, check_beams
        from optw.threads import set_torch_threads

        if method not in METHODS:
            raise UserError(f"method: {method!r} is not one of {', '.join(METHODS)}")
        if beams is None:
            beams = SERVE_BEAMS
        elif isinstance(beams, numbers.Integral) and not isinstance(beams, (bool, np.bool_)):
            beams = int(beams)  # numpy integers from a DataFrame or MLflow's params
        check_beams(beams, "beams")  # 4.5 or True is an error, not a silent int()
        batch = tourists_from_records(self.region, tourists)
        if not self._region_checked:
            self.check_region()
        before = torch.get_num_threads()
        set_torch_threads()
        try:
            sols = solve(self.model, self.region, batch.tourists, method=method, beams=beams)
        finally:
            torch.set_num_threads(before)
        return [dataclasses.replace(s, tourist=tid) for s, tid in zip(sols, batch.ids, strict=True)]

    def predict(self, context, model_input: pd.DataFrame,
                params: dict[str, Any] | None = None) -> pd.DataFrame:
        """:meth:`solve` each tourist (DataFrame rows or dicts, missing keys taking the benchmark's
        values) -> DataFrame ``tourist, route, score, seconds``; a None param takes its default."""
        params = params or {}
        method = params.get("method")
        sols = self.solve(model_input, method=DEFAULT_METHOD if method is None else method,
                          beams=params.get("beams"))
        rows = [{"tourist": int(s.tourist) if isinstance(s.tourist, numbers.Integral)
                 else s.tourist, "route": [int(v) for v in s.route], "score": float(s.score),
                 "seconds": float(s.seconds)} for s in sols]
        return pd.DataFrame(rows, columns=["tourist", "route", "score", "seconds"])


def save_pyfunc(path: str | Path, region_id: str, checkpoint: str | Path, *,
                region=None, config: Mapping[str, Any] | None = None) -> Path:
    """Write the pyfunc model folder at ``path`` (must not exist), bundling ``region`` when given
    and adding ``config``'s scalars (e.g. ``config_hash``) to the model config."""
    from mlflow.models.signature import ModelSignature
    from mlflow.types.schema import ParamSchema, ParamSpec

    from optw.decode.limits import SERVE_BEAMS

    path, checkpoint = Path(path), Path(checkpoint)
    if not checkpoint.is_file():
        raise MissingCheckpointError(f"checkpoint {checkpoint} not found")
    signature = ModelSignature(inputs=None, params=ParamSchema([
        ParamSpec("method", "string", DEFAULT_METHOD), ParamSpec("beams", "long", SERVE_BEAMS),
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
                # what loading the model imports, as installed (no local ``+cu...`` suffix)
                pip_requirements=[f"{dist}=={importlib.metadata.version(dist).split('+', 1)[0]}"
                                  for dist in ("mlflow", "torch", "numpy", "pandas")],
                metadata={"optw_region": region_id, "requires": "optw-platform (pip install -e .)"})
    return path
