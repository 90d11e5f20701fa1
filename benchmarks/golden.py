"""Golden outputs of training and decoding, for a bit-for-bit comparison across a refactor.

Runs tiny, seeded versions of every path the training loop and the decoders have on the CPU
(single-region REINFORCE, a mixed-region global model, imitation then REINFORCE on
demonstrations, demonstration tourists, a resume, a pack, greedy / sampling / beam / active
search) and writes every weight, metric and route to one file; ``--compare`` checks another
run's file against it, value for value, with ``torch.equal``::

    .venv/bin/python benchmarks/golden.py --out /tmp/before.pt     # on the old code
    .venv/bin/python benchmarks/golden.py --out /tmp/after.pt --compare /tmp/before.pt
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TINY = {"recipe": "fast", "batch_size": 4, "tourists_per_epoch": 2, "val_every": 3,
        "val_tourists": 2, "checkpoint_every": 0, "threads": 1, "device": "cpu",
        "model": {"d_model": 32, "n_heads": 4, "n_layers": 1, "d_ff": 64}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--compare", type=Path)
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT / "platform"))
    import torch

    from optw.catalog import open_catalog
    from optw.decode import solve
    from optw.train import Callback, TrainConfig, train
    from optw.train.pack import train_pack

    torch.set_num_threads(1)
    catalog = open_catalog()
    golden: dict[str, Any] = {}

    class Record(Callback):
        def __init__(self, name: str):
            self.name = name

        def on_epoch_end(self, ctx, metrics):
            golden[f"{self.name}/epoch{ctx.epoch}"] = {
                k: v for k, v in metrics.items() if k != "epochs_per_s"}

        def on_validation(self, ctx, metrics):
            golden[f"{self.name}/val{ctx.epoch}"] = {
                k: v for k, v in metrics.items() if k != "val_seconds"}

    def run(name: str, **table: Any):
        config = TrainConfig.from_dict({**TINY, **table})
        result = train(config, catalog, callbacks=[Record(name)])
        golden[f"{name}/weights"] = result.model.state_dict()
        return result

    single = run("single", regions=["pr01"], epochs=6)
    run("mixed", regions=["t101", "t201"], mix_regions=True, epochs=4)
    run("imitation", regions=["pr01"], epochs=3, demos=4, imitation_epochs=2,
        imitation_batch=4)
    run("demo_tourists", regions=["pr01"], epochs=3, demos=4, demo_tourists=True)
    if "advantage" in TrainConfig.__dataclass_fields__:
        run("normalised", regions=["t101"], epochs=3, advantage="normalised")
    with tempfile.TemporaryDirectory() as tmp:
        from optw.model import save_model

        start = save_model(single.model, Path(tmp) / "start.pt")
        tuned = train(TrainConfig.from_dict({**TINY, "regions": ["pr01"], "epochs": 3,
                                             "finetune": True, "val_every": 2}),
                      catalog, callbacks=[Record("finetune")], init=start)
        golden["finetune/weights"] = tuned.model.state_dict()
        packed = train_pack([TrainConfig.from_dict({**TINY, "regions": [r], "epochs": 2,
                                                    "finetune": True}) for r in ("pr01", "t101")],
                            catalog, callbacks=[[Record(f"packft{i}")] for i in range(2)],
                            inits=[start, start])
        for i, r in enumerate(packed):
            golden[f"packft{i}/weights"] = r.model.state_dict()
    with tempfile.TemporaryDirectory() as tmp:
        from optw.train.callbacks import Checkpointer

        config = TrainConfig.from_dict({**TINY, "regions": ["pr01"], "epochs": 6,
                                        "checkpoint_every": 3})
        cut = Checkpointer(Path(tmp), every=3)

        class StopAt3(Callback):
            def on_epoch_end(self, ctx, metrics):
                ctx.stop = ctx.epoch == 3
        train(config, catalog, callbacks=[cut, StopAt3()])
        resumed = train(config, catalog, callbacks=[Record("resumed")],
                        resume=Path(tmp) / "last.pt")
        golden["resumed/weights"] = resumed.model.state_dict()
    configs = [TrainConfig.from_dict({**TINY, "regions": [r], "epochs": e, "seed": s})
               for r, e, s in (("pr01", 5, 1), ("t101", 3, 2), ("c101", 4, 3))]
    results = train_pack(configs, catalog, callbacks=[[Record(f"pack{i}")] for i in range(3)])
    for i, r in enumerate(results):
        golden[f"pack{i}/weights"] = r.model.state_dict()
    model, region = single.model, catalog.region("pr01")
    tourists = catalog.validation("pr01")[:3]
    for method, kw in (("greedy", {}), ("beam", {"beams": 8}), ("sampling", {"samples": 8}),
                       ("active_search", {"epochs": 2, "batch_size": 4})):
        torch.manual_seed(0)
        golden[f"decode/{method}"] = [(s.route, s.score) for s in
                                      solve(model, region, tourists, method, **kw)]
    torch.save(golden, args.out)
    print(f"{len(golden)} golden entries written to {args.out}")
    if args.compare:
        return compare(torch.load(args.compare, weights_only=False), golden)
    return 0


def compare(before: dict[str, Any], after: dict[str, Any]) -> int:
    import torch

    def same(a: Any, b: Any) -> bool:
        if isinstance(a, torch.Tensor):
            return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
        if isinstance(a, dict):
            return isinstance(b, dict) and a.keys() == b.keys() and all(
                same(a[k], b[k]) for k in a)
        if isinstance(a, (list, tuple)):
            return isinstance(b, (list, tuple)) and len(a) == len(b) and all(
                same(x, y) for x, y in zip(a, b, strict=True))
        return a == b

    differ = sorted(k for k in before.keys() | after.keys()
                    if k not in before or k not in after or not same(before[k], after[k]))
    print(f"identical: {len(before.keys() | after.keys()) - len(differ)}; differ: {differ}")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
