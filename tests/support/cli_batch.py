"""Many `spikeloop` command lines, each in its own process, for the price of one interpreter start.

`python -m tests.support.cli_batch JOBS.json` imports the command line once, then forks one
child per job (`["check", "file.yaml"]`, ...): the child runs `spikeloop.experiments.cli.main`
exactly as the console script does, with its own stdout, stderr and exit status,
and prints a JSON list of {"argv", "code", "stdout", "stderr"} at the end. Every
child has `ray.init` replaced by a tripwire that exits 99 with "RAY STARTED" on
stderr, so a command that got as far as starting Ray is caught. Importing
spikeloop's modules (RLlib among them) takes seconds; a forked child starts in
milliseconds, which is what lets the default suite run a whole corpus of broken
files through both `check` and `train`.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import traceback

RAY_STARTED = 99


def _tripwire(*_args, **_kwargs):
    sys.stderr.write("RAY STARTED: ray.init was called\n")
    sys.stderr.flush()
    os._exit(RAY_STARTED)


def _run_child(argv: list[str], out_path: str, err_path: str) -> None:
    out = os.open(out_path, os.O_WRONLY)
    err = os.open(err_path, os.O_WRONLY)
    os.dup2(out, 1)
    os.dup2(err, 2)
    code = 1
    try:
        from spikeloop.experiments.cli import main

        code = main(argv)
    except SystemExit as exc:  # argparse and load_or_exit exit this way, as under the console script
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, int) and exc.code is not None:
            sys.stderr.write(f"{exc.code}\n")
    except BaseException:
        traceback.print_exc()  # what a user would see: the test looks for it
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(int(code or 0))


def main(jobs_path: str) -> int:
    """Run every job of JOBS.json (a list of argv lists); print the results as JSON."""
    import ray

    import spikeloop.experiments.cli  # noqa: F401  (the import every child shares)
    import spikeloop.experiments.commands.check  # noqa: F401
    import spikeloop.experiments.commands.train  # noqa: F401
    import spikeloop.experiments.runner  # noqa: F401

    ray.init = _tripwire
    with open(jobs_path) as f:
        jobs = json.load(f)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, argv in enumerate(jobs):
            out_path, err_path = os.path.join(tmp, f"{i}.out"), os.path.join(tmp, f"{i}.err")
            for path in (out_path, err_path):
                open(path, "w").close()
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _run_child(argv, out_path, err_path)
            _, status = os.waitpid(pid, 0)
            with open(out_path) as out, open(err_path) as err:
                results.append(
                    {
                        "argv": argv,
                        "code": os.waitstatus_to_exitcode(status),
                        "stdout": out.read(),
                        "stderr": err.read(),
                    }
                )
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
