"""Ray Tune sweep of the training hyper-parameters (ASHA, compared by gap to ILS).

    ray job submit --working-dir . -- python jobs/tune.py --regions c101,pr01 --samples 16
    python jobs/tune.py --regions r101 --samples 4 --write-profile my_profile.toml

Same as ``optw tune``.
"""

import sys

from optw.cli import main

if __name__ == "__main__":
    sys.exit(main(["tune", *sys.argv[1:]]))
