"""``optw job run`` (the platform job) and ``optw tune`` (sweeps)."""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING, Any

from optw.distributed.profile import MODES
from optw.errors import ConfigError, UserError

if TYPE_CHECKING:
    from optw.catalog import Catalog
    from optw.distributed.profile import JobProfile

#: ``optw job run``'s options that change a profile's ``[job]`` keys.
JOB_OPTIONS = {"groups": "--groups", "regions": "--regions", "from_groups": "--from-groups",
               "mode": "--mode", "name": "--name"}
CATALOG_HELP = "catalog folder or URI (default $OPTW_CATALOG or region_catalog/)"
ADDRESS_HELP = "Ray address (default: auto/local)"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("job", help="the platform job on Ray (train, evaluate, register)")
    jsub = p.add_subparsers(dest="job_command", required=True, metavar="ACTION")
    r = jsub.add_parser(
        "run", help="train, fine-tune, evaluate and register models for many regions",
        description="Train, fine-tune, evaluate and register OPTW models for many regions on "
        "Ray + MLflow.")
    r.add_argument("--profile", default="quick",
                   help="quick (default: every region on a laptop) | smoke (the pipeline in "
                   "minutes) | paper (the paper's budgets) | a TOML/YAML profile file")
    r.add_argument("--groups", help="comma-separated groups whose every region is trained "
                   "(solomon,cordeau,gavalas, custom or a custom group of the catalog); "
                   "default: the profile's. Not with --regions")
    r.add_argument("--regions", help="comma-separated region ids to train, of any group; "
                   "default: the profile's. Not with --groups")
    r.add_argument("--mode", choices=MODES,
                   help="default: the profile's. transfer-to: fine-tune a global model of "
                   "--from-groups onto each of the job's regions (e.g. a custom region)")
    r.add_argument("--from-groups", help="mode transfer-to: comma-separated benchmark groups "
                   "the global model is trained on (default: the profile's, else all three)")
    r.add_argument("--name", help="job (= MLflow experiment) name")
    r.add_argument("--force", action="store_true",
                   help="retrain regions that already have a champion from this config")
    r.add_argument("--catalog", help=CATALOG_HELP)
    r.add_argument("--tracking-uri",
                   help="MLflow store (default: local sqlite; on a cluster: the server's URL)")
    r.add_argument("--storage", help="Ray Train storage: a folder or a URI such as "
                   "s3://bucket/prefix (default $OPTW_STORAGE/ray_train or runs/ray_train)")
    r.add_argument("--out", help="models, results and report: a folder or a URI (default "
                   "$OPTW_STORAGE/NAME or runs/NAME); a folder of other files or of another "
                   "command's or job's output is refused")
    r.add_argument("--worker-resources", metavar="NAME=AMOUNT,...",
                   help="custom Ray resources each region worker asks for (e.g. trainer=1)")
    r.add_argument("--address", help=ADDRESS_HELP)
    r.add_argument("--quiet", action="store_true")
    r.set_defaults(func=_run_job)

    t = sub.add_parser(
        "tune", help="Ray Tune sweep of the training hyper-parameters (ASHA, gap to ILS)",
        description="Sweep lr, batch size, entropy β, logit clip C and layers with ASHA, "
        "comparing trials by the mean gap to ILS on the validation tourists.")
    t.add_argument("--profile", default="smoke", help="base profile (its [train] table)")
    t.add_argument("--regions", required=True, help="comma-separated region ids")
    t.add_argument("--samples", type=int, help="number of trials, 1..10,000 (default 8)")
    t.add_argument("--epochs", type=int, help="max epochs per trial (default: the profile's)")
    t.add_argument("--val-every", type=int, help="epochs between validations, 1..--epochs "
                   "(default: the profile's, else a quarter of the epochs)")
    t.add_argument("--write-profile", help="write the best config as a profile")
    t.add_argument("--name", help="sweep (= MLflow experiment) name (default: "
                   "<job>-tune-<time>)")
    t.add_argument("--storage", "--out", dest="storage", help="Ray Tune storage: a folder or "
                   "a URI, as the job's (default $OPTW_STORAGE/ray_tune or runs/ray_tune)")
    t.add_argument("--catalog", help=CATALOG_HELP)
    t.add_argument("--tracking-uri")
    t.add_argument("--address", help=ADDRESS_HELP)
    t.set_defaults(func=_tune)

    pt = sub.add_parser(
        "pretrain", help="train a group's global model for a long budget (a release's run)",
        description="Train GROUP's global model for --hours more CPU hours, resuming "
        "OUT/last.pt exactly; checkpoints every few minutes and appends learning-curve points "
        "(greedy and beam gaps to ILS on validation tourists) to OUT/curve.csv "
        "(docs/releases.md).")
    pt.add_argument("--group", required=True, help="solomon, cordeau or gavalas")
    pt.add_argument("--hours", type=float, required=True, help="CPU hours to train in this call")
    pt.add_argument("--epochs", type=int, help="stop at this many epochs in all (default: "
                    "the profile's)")
    pt.add_argument("--profile", help="pretraining profile (default: the package's "
                    "pretrain.toml)")
    pt.add_argument("--lr", type=float, help="the lr from now on (default: the resumed "
                    "state's, or the profile's for a new one): a long run steps it down")
    pt.add_argument("--out", help="state folder (default: pretraining/GROUP)")
    pt.add_argument("--catalog", help=CATALOG_HELP)
    pt.set_defaults(func=_pretrain)

    rl = sub.add_parser("release", help="the released global models: make one, list them",
                        description="Released global models (docs/releases.md).")
    rsub = rl.add_subparsers(dest="release_command", required=True, metavar="ACTION")
    mk = rsub.add_parser(
        "make", help="cool a pretraining state down, evaluate it and write the release",
        description="Branch off GROUP's pretraining state with a decay of the lr, evaluate the "
        "result (greedy and beam on the validation tourists against ILS), write "
        "optw/model/releases/GROUP.pt and GROUP.json, and register it in MLflow as "
        "optw-global-GROUP with alias 'release'.")
    mk.add_argument("--group", required=True)
    mk.add_argument("--state", help="pretraining state folder (default: pretraining/GROUP)")
    mk.add_argument("--regions", help="comma-separated regions evaluated for the manifest "
                    "(default: every region of the group)")
    mk.add_argument("--profile", help="pretraining profile (default: pretrain.toml)")
    mk.add_argument("--catalog", help=CATALOG_HELP)
    mk.add_argument("--tracking-uri", help="MLflow store (default: local sqlite)")
    mk.set_defaults(func=_release_make)
    ls = rsub.add_parser("list", help="the releases that ship with the package")
    ls.add_argument("--by-class", action="store_true",
                    help="also each region class's medians (the region id without its last two "
                    "digits: c1, r2, rc1, pr, t1)")
    ls.set_defaults(func=_release_list)


def comma_list(text: str | None, option: str) -> list[str] | None:
    """``"a, b"`` -> ``["a", "b"]`` (None stays None); bad lists are errors naming ``option``."""
    if text is None:
        return None
    items = [x.strip() for x in text.split(",")]
    if not any(items):
        raise UserError(f"{option}: empty list {text!r}; give comma-separated names or leave "
                        "the option out")
    if "" in items:
        raise UserError(f"{option}: {text!r} has an empty entry (entry {items.index('') + 1}); "
                        "give comma-separated names")
    if seen := [x for i, x in enumerate(items) if x in items[:i]]:
        raise UserError(f"{option}: {text!r} names {seen[0]!r} twice; give each name once")
    return items


def resource_amounts(text: str | None) -> dict[str, float]:
    """``"trainer=1, big_disk=0.5"`` -> ``{"trainer": 1.0, "big_disk": 0.5}`` (checked)."""
    out: dict[str, float] = {}
    for item in comma_list(text, "--worker-resources") or []:
        name, sep, amount = item.partition("=")
        try:
            value = float(amount)
        except ValueError:
            value = 0.0
        if not sep or not name.strip() or not 0 < value < float("inf"):
            raise UserError(f"--worker-resources: {item!r}; expected NAME=AMOUNT with an "
                            "amount > 0, e.g. trainer=1")
        out[name.strip()] = value
    return out


def profile_from_args(args: argparse.Namespace, catalog: Catalog) -> JobProfile:
    """The profile of ``--profile`` with the command line's ``[job]`` options."""
    from optw.distributed.profile import load_profile

    groups, regions = comma_list(args.groups, "--groups"), comma_list(args.regions, "--regions")
    if groups is not None and regions is not None:
        raise UserError("--regions and --groups: give one of them (--regions names the regions "
                        "to train, --groups trains every region of those groups)")
    profile = load_profile(args.profile, catalog)
    changes: dict[str, Any] = {k: v for k, v in {
        "groups": groups, "regions": [] if groups is not None else regions,
        "from_groups": comma_list(args.from_groups, "--from-groups"),
        "mode": args.mode, "name": args.name}.items() if v is not None}
    if changes.get("mode", profile.job.mode) != "transfer-to" and "from_groups" not in changes:
        changes["from_groups"] = []  # a transfer-to profile run in another mode
    return profile.with_job(changes, catalog, JOB_OPTIONS)


def format_summary(summary) -> str:
    """Per-group table of the job's results and where to look next."""
    from optw.catalog.cli import format_table

    lines = [f"job {summary.job_name}: {len(summary.trained)} model(s) trained, "
             f"{len(summary.skipped)} region(s) skipped (already current), "
             f"{len(summary.registered)} registered, {summary.seconds / 60:.1f} min"]
    if summary.releases:
        lines.append("fine-tuned from the released global models: "
                     + ", ".join(summary.releases.values()))
    table = summary.tables.get("summary")
    if table is not None and len(table):
        cols = [c for c in ("group", "kind", "method", "regions", "model", "ils", "gap_ils",
                            "gap_ils_median", "best_known", "gap_best", "time") if c in table]
        rows = [{k: round(v, 2) if isinstance(v, float) else v for k, v in r.items()}
                for r in table[cols].to_dict("records")]
        lines += ["", format_table(rows, cols)]
    if t := summary.timings:
        parts = ", ".join(f"{k} {t.get(k, 0.0) / 60:.1f}" for k in
                          ("startup", "training", "evaluation", "logging"))
        lines.append(f"\ntime: {t.get('wall', summary.seconds) / 60:.1f} min wall (ILS "
                     f"{t.get('ils', 0.0) / 60:.1f}, report {t.get('report', 0.0) / 60:.1f}); "
                     f"model minutes, summed over workers running side by side: {parts}")
    if summary.results_path:
        lines.append(f"\nresults: {summary.results_path}")
    if summary.report:
        lines.append(f"report:  {summary.report}")
    if summary.parent_run_id:
        lines.append(f"MLflow: parent run {summary.parent_run_id} in experiment "
                     f"'{summary.job_name}' at {summary.tracking_uri}")
    else:
        lines.append(f"MLflow: experiment '{summary.job_name}' at {summary.tracking_uri} (no "
                     "run of this job: nothing was left to train)")
    if summary.tracking_uri.startswith("sqlite"):
        lines.append(f"  see it with: mlflow ui --backend-store-uri {summary.tracking_uri}")
    lines.append("Ray dashboard: http://127.0.0.1:8265 (while the cluster runs)")
    return "\n".join(lines)


def _run_job(args: argparse.Namespace) -> int:
    from optw.distributed.job import open_job_catalog, run_job
    from optw.distributed.rayenv import own_connection
    from optw.raylogs import quiet_ray_output

    location, catalog = open_job_catalog(args.catalog)
    profile = profile_from_args(args, catalog)
    with quiet_ray_output(), own_connection():  # Ray's internals stay in its log folder
        summary = run_job(
            profile, catalog_dir=location, tracking_uri=args.tracking_uri, storage=args.storage,
            out_dir=args.out, force=args.force, progress=not args.quiet, ray_address=args.address,
            worker_resources=resource_amounts(args.worker_resources))
    print(format_summary(summary))
    return 0


def _tune(args: argparse.Namespace) -> int:
    from optw.distributed.job import open_job_catalog
    from optw.distributed.profile import load_profile
    from optw.distributed.rayenv import own_connection
    from optw.distributed.tune import new_profile_path, profile_name, run_sweep, write_profile
    from optw.raylogs import quiet_ray_output

    regions = comma_list(args.regions, "--regions")
    if args.val_every is not None and args.val_every < 1:
        raise UserError(f"--val-every: {args.val_every}; give a number of epochs >= 1 (a "
                        "sweep compares its trials at validations)")
    location, catalog = open_job_catalog(args.catalog)
    base = load_profile(args.profile, catalog)
    # the sweep's budget only ranks the trials; a written profile keeps the base profile's
    changes = {k: v for k, v in {"epochs": args.epochs, "val_every": args.val_every}.items()
               if v is not None}
    try:
        sweep = dataclasses.replace(base, train=base.train.replace(**changes))
    except ConfigError as exc:
        raise ConfigError(f"--{(exc.key or 'epochs').replace('_', '-')}: {exc}",
                          exc.key) from None
    if args.write_profile:
        new_profile_path(args.write_profile)  # refused now, not after the sweep
    with quiet_ray_output(), own_connection():  # Ray's and Tune's lines stay in its logs
        res = run_sweep(sweep, regions, catalog_dir=location, tracking_uri=args.tracking_uri,
                        storage=args.storage, name=args.name, ray_address=args.address,
                        **({} if args.samples is None else {"num_samples": args.samples}))
    print(res.trials.sort_values("val_gap_ils").to_string(index=False))
    print(f"\nbest gap to ILS {res.best_gap:.2f}% with {res.best_trial}")
    if args.write_profile:
        out = write_profile(base, res.best_trial, args.write_profile, catalog=catalog)
        print(f"profile written to {out} ([job] name = {profile_name(out)!r}; [train] is "
              f"{base.profile}'s with the best trial's values, its epochs = {base.train.epochs})")
    return 0


def _pretrain(args: argparse.Namespace) -> int:
    import math
    from pathlib import Path

    from optw.distributed.pretrain import pretrain

    if not (math.isfinite(args.hours) and 0 < args.hours <= 24 * 366):
        raise UserError(f"--hours {args.hours}: give CPU hours in (0, 8784]")
    done = pretrain(args.group, args.hours, Path(args.out) if args.out else None,
                    args.profile, args.catalog, args.epochs, args.lr)
    print(f"{args.group}: {done['epoch']:,} epochs, {done['routes']:,} routes, "
          f"{done['cpu_s'] / 3600:.2f} CPU hours in all")
    return 0


def _release_make(args: argparse.Namespace) -> int:
    from pathlib import Path

    from optw.distributed.pretrain import make_release

    card = make_release(args.group, Path(args.state) if args.state else None,
                        comma_list(args.regions, "--regions"), args.profile, args.catalog,
                        tracking_uri=args.tracking_uri)
    print(release_line(card))
    return 0


def release_line(card: dict[str, Any]) -> str:
    """One line naming a release and its figures."""
    t, v = card["training"], card["validation"]
    return (f"{card['group']} v{card['version']} ({card['sha256'][:12]}): "
            f"{t['epochs'] + t['cooldown_epochs']:,} epochs, {t['cpu_hours']:.2f} CPU-h; "
            f"median over {len(v['regions'])} regions: greedy "
            f"{v['median_greedy_above_ils']:+.2f} %, beam {v['beams']} "
            f"{v['median_beam_above_ils']:+.2f} % against ILS")


def class_lines(card: dict[str, Any]) -> list[str]:
    """Per region class (the id without its two last digits; an id without them is its own
    class), the medians of a release's greedy and beam gaps and how many of the class's
    regions are above ILS at the beam."""
    import re
    import statistics

    classes: dict[str, list[dict[str, float]]] = {}
    for region, gaps in card["validation"]["regions"].items():
        classes.setdefault(re.sub(r"\d\d$", "", region) or region, []).append(gaps)
    return [f"  {name} ({len(rows)} regions): greedy "
            f"{statistics.median(r['greedy'] for r in rows):+.2f} %, beam "
            f"{statistics.median(r['beam'] for r in rows):+.2f} %, "
            f"{sum(r['beam'] > 0 for r in rows)} above ILS at the beam"
            for name, rows in sorted(classes.items())]


def _release_list(args: argparse.Namespace) -> int:
    from optw.model.release import release_groups, release_manifest
    from optw.paths import releases_dir

    groups = release_groups()
    if not groups:
        print(f"no releases in {releases_dir()}")
    for group in groups:
        card = release_manifest(group)
        print(release_line(card))
        if args.by_class:
            print("\n".join(class_lines(card)))
    return 0
