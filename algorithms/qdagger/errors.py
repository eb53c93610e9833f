"""QDagger's error for teachers (`TeacherError`), below every module that checks or loads one."""


class TeacherError(ValueError):
    """A directory or model is not a usable teacher; the message says what is wrong and how to fix it."""
