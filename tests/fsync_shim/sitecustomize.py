"""A filesystem that refuses to fsync folders, as some network and FUSE mounts do, for the processes of a test:
this module, first on their PYTHONPATH, makes os.fsync of a folder raise EINVAL (files fsync as usual)."""

import errno
import os
import stat

_fsync = os.fsync


def _fsync_files_only(fd):
    if stat.S_ISDIR(os.fstat(fd).st_mode):
        raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
    return _fsync(fd)


os.fsync = _fsync_files_only
