"""`python -m tests.testbed run|up|down`: see tests/testbed/__init__.py and docs/testing.md."""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from pathlib import Path

from tests.testbed.bed import WORK_ROOT, Testbed, down_from_state, log
from tests.testbed.scenarios import SCENARIOS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.testbed", description=__doc__)
    parser.add_argument("command", choices=["run", "up", "down"],
                        help="run: up, the scenarios, a table, down; up: up until Ctrl-C; "
                        "down: clean what a killed run left")  # fmt: skip
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs) after a run")
    parser.add_argument("--gcs-ft", action="store_true",
                        help="Ray's GCS fault tolerance on (a Redis of Ray's own): the head restart "
                        "keeps presence serving on the workers")  # fmt: skip
    parser.add_argument("--partition-s", type=float, action="append",
                        help="cut a worker off this long, then heal (repeatable; default 30)")  # fmt: skip
    parser.add_argument("--only", action="append", choices=SCENARIOS,
                        help="run only this scenario (repeatable; bring-up and the shards' spread "
                        "after `ray up` are always checked)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.command == "down":
        down_from_state()
        return 0
    # SIGTERM tears down like Ctrl-C.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    # Not under /var/tmp or /tmp: sshd refuses keys below a world-writable directory.
    WORK_ROOT.mkdir(mode=0o755, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="run-", dir=WORK_ROOT))
    work.chmod(0o755)  # the embedded PostgreSQL runs as its own user
    bed = Testbed(work, args.nodes, gcs_ft=args.gcs_ft)
    ok = False
    try:
        bed.up()
        if args.command == "up":
            log("Ctrl-C tears it down")
            while True:
                time.sleep(3600)
        from tests.testbed.scenarios import run_all

        ok = run_all(bed, partitions=args.partition_s or [30.0], only=set(args.only or SCENARIOS))
    except KeyboardInterrupt:
        log("interrupted: tearing down")
    finally:
        bed.down()
        log(f"down; work directory {work}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
