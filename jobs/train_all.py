"""The platform's main job: train, fine-tune, evaluate and register every region's model.

    ray job submit --working-dir . -- python jobs/train_all.py --profile quick
    python jobs/train_all.py --profile paper --groups gavalas --mode global-ft

Runs on the Ray cluster it is submitted to (or starts a local one); see README.md. Same as
``optw job run`` (whose output keeps Ray's internals off the terminal: they stay in Ray's log
folder, ``/tmp/ray/session_latest/logs``; see :mod:`optw.raylogs`).
"""

import sys

from optw.cli import main

if __name__ == "__main__":
    sys.exit(main(["job", "run", *sys.argv[1:]]))
