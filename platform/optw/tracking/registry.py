"""Model registry: ``optw-<region>`` per region, a version per run; alias ``champion`` moves only
to a strictly higher ``val_score`` (an unreadable one is the worst; rules: docs/tracking.md)."""

from __future__ import annotations

import dataclasses
import logging
import math
import re
import shutil
import tempfile
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from optw.errors import OptwError
from optw.tracking.uri import get_client, quiet, tracking_uri

log = logging.getLogger(__name__)

CHAMPION = "champion"
_MODEL_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/]+)|/(?P<version>\d+))/?$")


class VersionInfo(NamedTuple):
    """A registered version: ``version, tags = champion("c101")`` works."""

    version: int
    tags: dict[str, str]


class ModelNotFoundError(OptwError, LookupError):
    """A registered model, version or alias the registry does not have."""


def model_name(region: str) -> str:
    """Registered model name of a region: ``optw-<region>``."""
    return f"optw-{region}"


def _registered(client, name: str):
    """The registered model ``name``, or ``None`` when the registry has none."""
    from mlflow.exceptions import MlflowException

    try:
        return client.get_registered_model(name)
    except MlflowException as exc:
        if getattr(exc, "error_code", "") in ("RESOURCE_DOES_NOT_EXIST", "NOT_FOUND"):
            return None
        raise


def _score(tags: Mapping[str, str] | None) -> float | None:
    try:
        value = float((tags or {})["val_score"])
    except (KeyError, TypeError, ValueError):
        return None
    return None if math.isnan(value) else value


def _ensure_model(client, name: str, region: str, description: str | None = None) -> None:
    from mlflow.exceptions import MlflowException

    if _registered(client, name) is not None:
        return
    try:
        client.create_registered_model(
            name, tags={"region": region},
            description=description or f"optw neural OPTW solver for region {region}; alias "
                                       f"'{CHAMPION}' = best val_score")
    except MlflowException:  # created meanwhile by another process
        client.get_registered_model(name)


def versions_for_run(region: str, run_id: str, *, uri: str | None = None) -> list[int]:
    """Versions of ``optw-<region>`` registered from ``run_id`` (ascending)."""
    return sorted(int(mv.version) for mv in get_client(uri).search_model_versions(
        f"name='{model_name(region)}' and run_id='{run_id}'"))


def champion(region: str, *, uri: str | None = None) -> VersionInfo | None:
    """``(version, tags)`` of the region's champion, or ``None`` (no model or no champion)."""
    client = get_client(uri)
    name = model_name(region)
    model = _registered(client, name)
    aliases = {} if model is None else model.aliases or {}
    if CHAMPION not in aliases:
        return None
    mv = client.get_model_version(name, str(aliases[CHAMPION]))
    return VersionInfo(int(mv.version), dict(mv.tags))


def find_champion_with(region: str, config_hash: str, catalog_version: int | str, *,
                       uri: str | None = None) -> VersionInfo | None:
    """The champion if trained with this config hash on this catalog version, else ``None``."""
    champ = champion(region, uri=uri)
    if champ is not None and champ.tags.get("config_hash") == str(config_hash) \
            and champ.tags.get("catalog_version") == str(catalog_version):
        return champ
    return None


def set_champion(region: str, version: int, *, uri: str | None = None) -> None:
    """Point ``champion`` at ``version`` unconditionally (manual promotion or rollback)."""
    get_client(uri).set_registered_model_alias(model_name(region), CHAMPION, str(version))


def register_version(region: str, checkpoint_path: str | Path, run_id: str,
                     tags: Mapping[str, Any] | None = None, *, uri: str | None = None,
                     bundle_region: bool = True, region_data=None) -> int:
    """Register the checkpoint of ``run_id`` as a version of ``optw-<region>`` (once per run);
    returns its number. ``bundle_region`` stores the region (``region_data``, else the
    catalog's if it opens) in the model, so serving needs no catalog."""
    from optw.tracking.pyfunc import save_pyfunc

    uri = tracking_uri(uri)
    client = get_client(uri)
    name = model_name(region)
    tags = {k: str(v) for k, v in (tags or {}).items()}
    tags.setdefault("region", region)
    _ensure_model(client, name, region)
    if existing := versions_for_run(region, run_id, uri=uri):
        version = existing[0]
        log.info("%s: run %s already registered as version %d", name, run_id, version)
    else:
        if bundle_region and region_data is None:
            try:  # without a catalog the region is read where it is served
                from optw.catalog import open_catalog

                region_data = open_catalog().region(region)
            except Exception as exc:
                log.debug("region %s not bundled with the model (%s)", region, exc)
        artifact_path = f"model/{region}"
        with tempfile.TemporaryDirectory(prefix="optw-pyfunc-") as tmp:
            local = save_pyfunc(Path(tmp) / "model", region, checkpoint_path,
                                region=region_data if bundle_region else None,
                                config={k: tags[k] for k in ("config_hash", "catalog_version")
                                        if k in tags})
            client.log_artifacts(run_id, str(local), artifact_path)
        source = f"{client.get_run(run_id).info.artifact_uri.rstrip('/')}/{artifact_path}"
        mv = client.create_model_version(name, source=source, run_id=run_id, tags=tags)
        version = int(mv.version)
        # Two tries of the same task racing: keep the oldest version, drop ours.
        if (first := versions_for_run(region, run_id, uri=uri)[0]) != version:
            client.delete_model_version(name, str(version))
            version = first
    new = _score(client.get_model_version(name, str(version)).tags)
    current = champion(region, uri=uri)
    old = None if current is None else _score(current.tags)
    if current is None or (current.version != version and new is not None
                           and (old is None or new > old)):
        set_champion(region, version, uri=uri)
        log.info("%s: version %d is the new champion (val_score %s, was %s)", name, version,
                 new, None if current is None else current.tags.get("val_score"))
    return version


@dataclasses.dataclass(repr=False, eq=False)
class RegionSolver:
    """A registered model, ready to solve tourists of its region. ``version``: the registry's
    (``None`` for a path); ``local_path``: the model's folder (``None`` when loaded in memory)."""

    impl: Any
    version: int | None
    model_uri: str
    tags: dict[str, str]
    local_path: str | None

    @property
    def region_id(self) -> str | None:
        return self.impl.region_id

    @property
    def region(self):
        return self.impl.region

    @property
    def model(self):
        return self.impl.model

    def solve(self, tourists: Any, method: str = "beam", beams: int | None = None):
        """The pyfunc's solve (``beams``: its default, SERVE_BEAMS, when None)."""
        return self.impl.solve(tourists, method=method, beams=beams)

    def predict(self, tourists: Any, method: str = "beam", beams: int | None = None):
        return self.impl.predict(None, tourists, {"method": method, "beams": beams})

    def __repr__(self) -> str:
        return (f"RegionSolver(region={self.region_id!r}, version={self.version}, "
                f"uri={self.model_uri!r})")


def load_solver(model_uri: str, *, uri: str | None = None, dst_path: str | Path | None = None,
                load: bool = True) -> RegionSolver:
    """Open a registered model (``models:/optw-c101@champion``, ``models:/optw-c101/3``), a
    ``runs:/`` or artifact URI or a local folder. With ``dst_path`` the download stays there;
    else it is deleted once loaded, or (``load=False``) when the solver is garbage-collected."""
    import mlflow.artifacts
    import mlflow.pyfunc

    uri = tracking_uri(uri)
    quiet()
    version, tags, source = None, {}, model_uri
    if match := _MODEL_URI.match(model_uri):
        from mlflow.exceptions import MlflowException

        client = get_client(uri)
        name = match["name"]
        try:
            mv = (client.get_model_version_by_alias(name, match["alias"]) if match["alias"]
                  else client.get_model_version(name, match["version"]))
        except MlflowException as exc:  # no such model, version or alias
            raise ModelNotFoundError(f"no registered model {model_uri} in {uri} ("
                                     f"{' '.join(str(exc.message).split())[:200]})") from None
        version, tags = int(mv.version), dict(mv.tags)
        source = client.get_model_version_download_uri(name, str(mv.version))
    is_dir = Path(source).is_dir()
    if dst_path and not is_dir:
        Path(dst_path).mkdir(parents=True, exist_ok=True)
    tmp = None if dst_path or is_dir else tempfile.mkdtemp(prefix="optw-model-")
    try:
        local = str(source) if is_dir else mlflow.artifacts.download_artifacts(
            artifact_uri=source, dst_path=str(dst_path or tmp), tracking_uri=uri, registry_uri=uri)
        impl = mlflow.pyfunc.load_model(local).unwrap_python_model()
        if load:  # now, instead of on the first solve
            _ = impl.model, impl.region
        solver = RegionSolver(impl, version, model_uri, tags, None if tmp and load else local)
        if tmp and not load:  # opened lazily: the files stay as long as the solver lives
            weakref.finalize(solver, shutil.rmtree, tmp, True)
            tmp = None
        return solver
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


RELEASE = "release"
RELEASES_EXPERIMENT = "optw-releases"


def release_model_name(group: str) -> str:
    """Registered model name of a group's released global model: ``optw-global-<group>``."""
    return f"optw-global-{group}"


def register_release(group: str, weights: str | Path, manifest: str | Path,
                     curve: str | Path | None = None, *, uri: str | None = None) -> int:
    """Log a release (weights, manifest, pretraining curve) as a run of ``optw-releases`` and
    register it as a version of ``optw-global-<group>``, alias ``release``; returns the version."""
    import json

    from optw.tracking.runs import experiment_id, git_commit

    client = get_client(uri)
    card = json.loads(Path(manifest).read_text())
    run = client.create_run(experiment_id(RELEASES_EXPERIMENT, uri), run_name=f"{group}-v"
                            f"{card['version']}", tags={"group": group, "kind": "release"})
    run_id = run.info.run_id
    try:
        for key, value in (("median_greedy_above_ils", card["validation"]),
                           ("median_beam_above_ils", card["validation"]),
                           ("cpu_hours", card["training"]), ("epochs", card["training"])):
            client.log_metric(run_id, key, float(value[key]))
        client.log_param(run_id, "sha256", card["sha256"])
        client.log_param(run_id, "commit", git_commit())
        for path in (weights, manifest, curve):
            if path is not None and Path(path).is_file():
                client.log_artifact(run_id, str(path), "release")
        name = release_model_name(group)
        _ensure_model(client, name, group, f"optw global model of group {group}, pretrained "
                      f"long; alias '{RELEASE}' = the shipped release (docs/releases.md)")
        mv = client.create_model_version(
            name, source=f"{run.info.artifact_uri.rstrip('/')}/release", run_id=run_id,
            tags={"version": str(card["version"]), "sha256": card["sha256"]})
        client.set_registered_model_alias(name, RELEASE, mv.version)
        client.set_terminated(run_id, "FINISHED")
    except BaseException:
        client.set_terminated(run_id, "FAILED")
        raise
    return int(mv.version)
