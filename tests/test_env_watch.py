"""The time limit on env calls (`rlfleet.envs.watch.EnvWatch`), in processes of its own: a call stuck in Python or
in a system call is interrupted with EnvHang on the main thread and on another, and a call that does not stop
when interrupted ends its process (exit 2) after its grace, with every stack written out and `on_stuck` run
first."""

import subprocess
import sys
import textwrap

from helpers import ENV, ROOT

SCRIPT = textwrap.dedent(
    """
    import sys, threading, time
    from rlfleet.common import logs
    from rlfleet.envs.watch import EnvHang, EnvWatch, watched

    logs.configure("test")

    class Env:
        def __init__(self, how):
            self.how, self.closed = how, None

        def step(self, action):
            while True:
                if self.how == "sleep":
                    time.sleep(3600)
                if self.how == "ignore":
                    try:
                        time.sleep(3600)
                    except EnvHang:
                        print("interrupted, going on", flush=True)

        def close(self, **kwargs):  # as gymnasium's vector envs: the keywords go to close_extras
            self.close_extras(**kwargs)

        def close_extras(self, terminate=False):
            self.closed = dict(terminate=terminate)

    def hang(how):
        with EnvWatch("Stuck-v0", 1.0, lambda: "env seeds from 7", on_stuck=lambda: print("on_stuck", flush=True),
                      grace_s=1.0) as watch:
            env = Env(how)
            wrapped = watched(env, watch)
            try:
                wrapped.step(0)
            except EnvHang as e:
                wrapped.close()
                print(f"{how}: {e} | closed with {env.closed}", flush=True)

    how, where = sys.argv[1], sys.argv[2]
    if where == "no-fileno":  # standard error replaced by an object without a file descriptor
        import io

        sys.stderr = io.StringIO()
    if where == "thread":
        t = threading.Thread(target=hang, args=(how,), daemon=True)
        t.start()
        t.join(timeout=10)
        print("thread still running" if t.is_alive() else "thread ended", flush=True)
    else:
        hang(how)
    """
)


def _run(how: str, where: str):
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, how, where], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=60
    )


def test_a_hung_env_call_is_interrupted_with_its_env_and_where_it_hangs():
    for how, where in (("loop", "main"), ("sleep", "main"), ("loop", "thread"), ("loop", "no-fileno")):
        out = _run(how, where)
        assert out.returncode == 0, out.stderr[-3000:]
        said = "Stuck-v0: its step() did not return within 1 s (env seeds from 7; --env-timeout sets the limit)"
        assert f"{how}: {said}" in out.stdout, (how, where, out.stdout, out.stderr[-3000:])
        assert "closed with {'terminate': True}" in out.stdout  # a batched env's workers are ended, not waited for
        if where != "no-fileno":
            assert "Where it hangs:" in out.stderr and "in step" in out.stderr, out.stderr[-3000:]
        assert "on_stuck" not in out.stdout


def test_a_call_that_does_not_stop_when_interrupted_ends_its_process_after_the_grace():
    out = _run("ignore", "main")
    assert out.returncode == 2, (out.stdout, out.stderr[-3000:])
    assert "interrupted, going on" in out.stdout and "on_stuck" in out.stdout
    assert "did not stop when interrupted within 1 s more, so this process ends (exit 2)" in out.stderr
    assert "most recent call first" in out.stderr  # every thread's stack (faulthandler)


def test_a_call_blocked_in_a_system_call_on_another_thread_is_reported_and_given_up_not_the_process():
    """Another thread (the learner's video thread) blocked in a system call cannot be interrupted: the hang is
    reported, then given up after the grace; the process goes on and `on_stuck` is not run."""
    out = _run("sleep", "thread")
    assert out.returncode == 0, (out.stdout, out.stderr[-3000:])
    assert "thread still running" in out.stdout and "on_stuck" not in out.stdout
    assert "Stuck-v0: its step() did not return within 1 s" in out.stderr
    assert "did not stop when interrupted within 1 s more: given up." in out.stderr
