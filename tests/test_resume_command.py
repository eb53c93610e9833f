"""The command `rlfleet up` prints for continuing a stopped run."""

import shlex

from rlfleet.deploy.up_options import UpOptions, resume_command


def test_the_resume_command_keeps_the_videos_and_quotes_the_path():
    """It continues the run with the same --video-every (and none without), its path shell-quoted."""
    odd = "/runs/run:1 [a]*? ü"
    assert shlex.split(resume_command(UpOptions(odd, 2, video_every=3))) == [
        *("rlfleet", "up", "--resume", odd, "--actors", "2", "--video-every", "3")
    ]
    assert "--video-every" not in shlex.split(resume_command(UpOptions(odd, 2)))
