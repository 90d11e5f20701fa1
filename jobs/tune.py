"""Ray Tune sweep of the training hyper-parameters (ASHA, compared by gap to ILS).

    ray job submit --working-dir . -- python jobs/tune.py --regions c101,pr01 --samples 16
    python jobs/tune.py --regions r101 --samples 4 --write-profile my_profile.toml
"""

import argparse
import sys

from optw.distributed.profile import load_profile
from optw.distributed.tune import run_sweep, write_profile


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="tune.py", description=__doc__.splitlines()[0])
    p.add_argument("--profile", default="smoke", help="base profile (its [train] table)")
    p.add_argument("--regions", required=True, help="comma-separated region ids")
    p.add_argument("--samples", type=int, default=8, help="number of trials")
    p.add_argument("--epochs", type=int, default=None, help="max epochs per trial")
    p.add_argument("--val-every", type=int, default=None, help="epochs between validations")
    p.add_argument("--write-profile", default=None, help="write the best config as a profile")
    p.add_argument("--catalog", default=None)
    p.add_argument("--tracking-uri", default=None)
    args = p.parse_args(argv)
    profile = load_profile(args.profile)
    changes = {k: v for k, v in {"epochs": args.epochs, "val_every": args.val_every}.items()
               if v is not None}
    if changes:
        profile.train = profile.train.replace(**changes)
    if not profile.train.val_every:
        profile.train = profile.train.replace(val_every=max(1, profile.train.epochs // 4))
    regions = [r.strip() for r in args.regions.split(",") if r.strip()]
    res = run_sweep(profile, regions, num_samples=args.samples, catalog_dir=args.catalog,
                    tracking_uri=args.tracking_uri)
    print(res.trials.sort_values("val_gap_ils").to_string(index=False))
    print(f"\nbest gap to ILS {res.best_gap:.2f}% with {res.best_config}")
    if args.write_profile:
        print(f"profile written to {write_profile(profile, res.best_config, args.write_profile)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
