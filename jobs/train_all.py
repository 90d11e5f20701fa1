"""The platform's main job: train, fine-tune, evaluate and register every region's model.

    ray job submit --working-dir . -- python jobs/train_all.py --profile quick
    python jobs/train_all.py --profile paper --groups gavalas --mode global-ft

Runs on the Ray cluster it is submitted to (or starts a local one); see README.md. Same as
``optw job run``, with a quieter output: the job's own progress lines, warnings and summary,
not Ray's internals (those stay in Ray's log folder, ``/tmp/ray/session_latest/logs``).
"""

import logging
import re
import sys
import threading

#: Lines of Ray's internals that reach a driver's output although nobody has to act on them:
#: the raylet's "N PYTHON worker processes have been started ..." (many workers start at once
#: when packs train side by side). The raylet's log (raylet.out) keeps them.
RAY_NOISE = re.compile(r"\(raylet\).*PYTHON worker processes have been started on node")


class DropLines:
    """A text stream that passes every line to ``stream`` except those matching ``pattern``
    (Ray prints each worker line with its own ``print``: whole lines, from several threads)."""

    def __init__(self, stream, pattern: re.Pattern):
        self._stream, self._pattern = stream, pattern
        self._partial, self._lock = "", threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            *lines, self._partial = (self._partial + text).split("\n")
            kept = "".join(f"{line}\n" for line in lines if not self._pattern.search(line))
            if kept:
                self._stream.write(kept)
        return len(text)

    def flush(self) -> None:
        with self._lock:
            if self._partial and not self._pattern.search(self._partial):
                self._stream.write(self._partial)
            self._partial = ""
            self._stream.flush()

    def __getattr__(self, name: str):  # encoding, isatty, fileno, ...
        return getattr(self._stream, name)


def quiet_ray_output() -> None:
    """Keep Ray's internals off this driver's output (its warnings and errors still show)."""
    sys.stdout = DropLines(sys.stdout, RAY_NOISE)
    for name in ("ray", "ray.train", "ray.tune", "ray.data"):
        logging.getLogger(name).setLevel(logging.WARNING)


if __name__ == "__main__":
    quiet_ray_output()
    from optw.cli import main

    code = main(["job", "run", *sys.argv[1:]])
    sys.stdout.flush()
    sys.exit(code)
