"""Fine-tuning from a group's global model, variants side by side at their CPU cost.

For each region and variant: fine-tune the region's group's global model (its shipped release,
or with ``--models`` a job's ``models/global-global-<group>.pt``), then greedy and beam-8 on
the region's 64 validation tourists, against the stored ILS mean of the same tourists. Prints
one JSON line per (region, variant) with the gaps and the CPU seconds of the demonstrations'
ILS, of training and of the evaluation (one thread), and writes them to ``--out`` (CSV)::

    .venv/bin/python benchmarks/bench_finetune.py --regions c101,r105,pr02,t105 \\
        --variants none,base,ft:20,ft:6:3e-5,imit:128:16:1e-3:32:20

Variants (``base`` is the `quick` profile's fine-tune, read from the profile: its
``[finetune.release]`` from a release, its ``[finetune]`` from ``--models``):

- ``none``: the global model as it is;
- ``base``: the profile's fine-tune (REINFORCE at a fixed lr);
- ``ft:E[:LR]``: the same with E epochs (and lr LR);
- ``imit:D:S:LR[:B[:E]]``: D demonstrations, S imitation steps of B (32) at LR, then E (2)
  REINFORCE epochs;
- ``dt:D:E``: E REINFORCE epochs on demonstration tourists with their ILS routes;
- ``cap:MIN:D:S:B:LR:E``: ``imit`` (D = 0: none) then up to E epochs, within MIN minutes.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def variant(name: str) -> dict | None:
    """The changes to the profile's fine-tune of a variant (see the module docstring); None:
    no fine-tune."""
    kind, *arg = name.split(":")
    if kind == "none":
        return None
    if kind == "base":
        return {}
    if kind == "ft":
        return {"epochs": int(arg[0]), **({"finetune_lr": float(arg[1])} if arg[1:] else {})}
    if kind == "dt":
        return {"demos": int(arg[0]), "demo_tourists": True, "epochs": int(arg[1])}
    if kind == "imit":
        d, s, lr, b, e = [*arg, *["32", "2"][len(arg) - 3:]]
        return {"demos": int(d), "imitation_epochs": int(s), "imitation_lr": float(lr),
                "imitation_batch": int(b), "epochs": int(e)}
    if kind == "cap":
        m, d, s, b, lr, e = arg
        out = {"max_minutes": float(m), "epochs": int(e)}
        if int(d):
            out.update(demos=int(d), imitation_epochs=int(s), imitation_batch=int(b),
                       imitation_lr=float(lr))
        return out
    raise SystemExit(f"unknown variant {name!r}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", type=Path, default=None,
                   help="folder of a job's global models (global-global-<group>.pt); "
                        "default: the shipped releases")
    p.add_argument("--profile", default="quick", help="whose fine-tune is base")
    p.add_argument("--regions", required=True)
    p.add_argument("--variants", default="none,base")
    p.add_argument("--catalog", default=None)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT / "platform"))
    import numpy as np
    import torch

    from optw.baselines.demos import get_demos
    from optw.catalog import open_catalog
    from optw.decode import solve
    from optw.distributed.profile import load_profile
    from optw.evaluate.protocol import ils_validation_means
    from optw.model import load_model
    from optw.model.release import checked_release
    from optw.train import TrainConfig, train

    torch.set_num_threads(1)
    catalog = open_catalog(args.catalog)
    profile = load_profile(args.profile, catalog)
    base = (profile.finetune if args.models else profile.release_finetune).to_dict()
    regions = args.regions.split(",")
    ils = ils_validation_means(str(catalog.path), regions, 64)
    rows = []
    for rid in regions:
        region, val = catalog.region(rid), catalog.validation(rid)
        init = (args.models / f"global-global-{region.group}.pt" if args.models
                else checked_release(region.group)[0])
        for name in args.variants.split(","):
            changes, demo_s, train_s = variant(name), 0.0, 0.0
            if changes is None:
                model = load_model(init)
            else:
                config = TrainConfig.from_dict({**base, **changes, "regions": [rid],
                                                "val_every": 0, "device": "cpu"})
                demos = None
                if config.demos:
                    t0 = time.process_time()
                    demos = get_demos(catalog, [rid], config.demos, config.seed)
                    demo_s = time.process_time() - t0
                t0 = time.process_time()
                model = train(config, catalog, init=init, demos=demos).model
                train_s = time.process_time() - t0
            t0 = time.process_time()
            greedy = solve(model, region, val, "greedy")
            beam = solve(model, region, val, "beam", beams=8, greedy=greedy)
            g, b = (float(np.mean([s.score for s in sols])) for sols in (greedy, beam))
            row = {"region": rid, "variant": name, "ils": ils[rid],
                   "gap_greedy": 100 * (g / ils[rid] - 1), "gap_beam": 100 * (b / ils[rid] - 1),
                   "demo_s": demo_s, "train_s": train_s, "eval_s": time.process_time() - t0}
            rows.append(row)
            print(json.dumps({k: round(v, 3) if isinstance(v, float) else v
                              for k, v in row.items()}), flush=True)
    if args.out:
        with open(args.out, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
