"""What every `rlfleet` command shares: its error exit, the TensorFlow check of commands that run it, the BLAS
thread limit of the services that run numpy products, and the type of its path options (`Path`)."""

from __future__ import annotations

import os
import sys

import click

from rlfleet.envs import ENV_TIMEOUT_S


def fail(message: str) -> None:
    """Prints `rlfleet: error: MESSAGE` on stderr and exits with status 2 (bad input: nothing was started)."""
    click.echo(f"rlfleet: error: {message}", err=True)
    sys.exit(2)


def quiet_tf() -> None:
    """Called first by every command that runs TensorFlow: checks that one TensorFlow build is installed (exits
    with the fix otherwise) and quiets its C++ log."""
    import importlib.metadata
    import importlib.util

    builds = []
    for dist in ("tensorflow-cpu", "tensorflow"):
        try:
            builds.append(f"{dist} {importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            pass
    if importlib.util.find_spec("tensorflow") is None:
        fail(
            "TensorFlow is not installed. Install rlfleet with one of its TensorFlow builds: "
            'pip install "rlfleet[cpu]" (from a checkout: pip install -e ".[cpu]"), or "rlfleet[gpu]" for an '
            "NVIDIA GPU."
        )
    if len(builds) > 1:
        fail(
            f"two TensorFlow builds are installed ({', '.join(builds)}); they overwrite each other's files. "
            "Uninstall both (pip uninstall tensorflow tensorflow-cpu), then install one: "
            '"rlfleet[cpu]" or "rlfleet[gpu]".'
        )
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")  # what OpenBLAS (numpy's BLAS) reads


def one_blas_thread() -> None:
    """Limits numpy's BLAS library (OpenBLAS) to one thread in this process (threadpoolctl), unless one of
    `BLAS_THREAD_VARIABLES` is set (the user's choice stands).

    Actors compute their policies, and learners their evaluations, as numpy products of a few envs' rows:
    there a second BLAS thread adds more CPU than speed, CPU that the machine's other processes (one actor per
    core) need. TensorFlow's own thread pools are not BLAS and keep their size."""
    if any(os.environ.get(v) for v in BLAS_THREAD_VARIABLES):
        return
    import numpy  # noqa: F401  (loads the BLAS library: threadpoolctl limits only those already loaded)
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1, user_api="blas")


class Path(click.Path):
    """`click.Path` whose value must be valid UTF-8: TensorFlow and Reverb take paths as UTF-8 text, so a name
    that is not (a folder named in another encoding) is refused before anything starts, naming the option."""

    def convert(self, value, param, ctx):
        """`click.Path.convert`, then refuses a value that is not valid UTF-8 (click's usage error, exit 2)."""
        value = super().convert(value, param, ctx)
        try:
            os.fsdecode(value).encode("utf-8")
        except UnicodeEncodeError:
            shown = os.fsencode(value)
            self.fail(
                f"{shown!r} is not a valid UTF-8 name, and TensorFlow and Reverb read paths as UTF-8 text: rename "
                "it to a UTF-8 name (e.g. with convmv), or give another path.",
                param,
                ctx,
            )
        return value


def env_timeout_option(f):
    """The `--env-timeout` option (into `env_timeout_s`, seconds) of the commands that step envs."""
    return click.option(
        "--env-timeout",
        "env_timeout_s",
        default=ENV_TIMEOUT_S,
        show_default=True,
        type=click.FloatRange(0),
        help="Seconds one env reset or step may take, in evaluations and on the actors, before it is reported as "
        "hung (the env id, its seeds and where it hangs, in the log) and interrupted (0: no limit).",
    )(f)
