"""``python -m optw.distributed.follow ADDRESS JOB_ID``: follow a submitted Ray job's output."""

from __future__ import annotations

import argparse
import asyncio
import sys

from optw.raylogs import DropLines, quiet_ray_loggers


def follow(address: str, job: str) -> int:
    """Print ``job``'s output (Ray's noise dropped); 0 if it succeeded, else 1 (a line why)."""
    from ray.job_submission import JobStatus, JobSubmissionClient

    quiet_ray_loggers()
    client = JobSubmissionClient(address)
    stream = DropLines(sys.stdout)

    async def tail() -> None:
        async for chunk in client.tail_job_logs(job):
            stream.write(chunk)
            stream.flush()

    try:
        asyncio.run(tail())
    finally:
        stream.flush()
    info = client.get_job_info(job)
    if info.status == JobStatus.SUCCEEDED:
        return 0
    # the message's first line: the rest repeats the job's last output lines
    why = "".join((info.message or "").strip().splitlines()[:1]).rstrip(":")
    print(f"job {job} {info.status.value}: {why}", file=sys.stderr, flush=True)
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m optw.distributed.follow",
                                     description="Follow a submitted Ray job's output.")
    parser.add_argument("address", help="the job server, e.g. http://127.0.0.1:8265")
    parser.add_argument("job", help="the submission id")
    args = parser.parse_args(argv)
    try:
        return follow(args.address, args.job)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
