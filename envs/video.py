"""Videos of evaluation episodes: H.264 MP4 files written with PyAV (FFmpeg's libx264), and the offscreen OpenGL
backend that MuJoCo renders them with on a machine with no display and no GPU.

MuJoCo picks its OpenGL backend from the MUJOCO_GL environment variable when it is first imported. A process
that renders sets it to "egl" where it is unset and the system has EGL: EGL with Mesa's software rasteriser
(llvmpipe) needs no display and no GPU (Debian packages libegl1, libegl-mesa0 and libgl1-mesa-dri), and uses the
GPU's EGL where a driver provides one. A user's own MUJOCO_GL ("osmesa" with libosmesa6, "glfw" on a desktop) is
kept.
"""

from __future__ import annotations

import fractions
import os
import sys

import numpy as np

from rlfleet.common.files import fsync_path

OFFSCREEN_GL = "egl"


def use_offscreen_rendering() -> None:
    """Sets MUJOCO_GL to "egl" (and PYOPENGL_PLATFORM to match) unless the user set it, where the system has an
    EGL library ("osmesa" where it has OSMesa only; neither: nothing is set, so that MuJoCo still imports, and a
    frame asked for fails with `rendering_error`'s message). Call it before anything imports `mujoco`, and only
    to render: MuJoCo's import fails outright under a MUJOCO_GL whose library is missing. Does nothing once
    `mujoco` is imported (it keeps the backend it chose)."""
    if "mujoco" in sys.modules or "MUJOCO_GL" in os.environ:
        return
    import ctypes.util

    for backend, library in ((OFFSCREEN_GL, "EGL"), ("osmesa", "OSMesa")):
        if ctypes.util.find_library(library):
            os.environ["MUJOCO_GL"] = backend
            os.environ.setdefault("PYOPENGL_PLATFORM", backend)
            return


class VideoError(RuntimeError):
    """A frame could not be rendered or a video not written; the message names the cause and the fix."""


def rendering_error(env_id: str, error: BaseException) -> VideoError:
    """The `VideoError` for an env whose `render()` failed with `error`, naming the backend and what to install."""
    import gymnasium

    if isinstance(error, gymnasium.error.DependencyNotInstalled):
        return VideoError(f"{env_id}: its renderer needs a package that is not installed: {error}")
    backend = os.environ.get("MUJOCO_GL", "(unset)")
    return VideoError(
        f"{env_id}: rendering a frame failed with MUJOCO_GL={backend} ({type(error).__name__}: {error}). Offscreen "
        "rendering needs EGL: on Debian or Ubuntu, apt-get install libegl1 libegl-mesa0 libgl1-mesa-dri; or "
        "OSMesa: apt-get install libosmesa6 and set MUJOCO_GL=osmesa."
    )


class VideoWriter:
    """Encodes RGB frames into an H.264 MP4 file as they come (no frame is held in memory), written to a
    temporary file beside `path` and renamed onto it by `close()`, so that `path` is only ever a whole video.

    Args:
        path: the .mp4 file to write.
        fps: frames per second of playback (the env's `metadata["render_fps"]`: real time).
    Raises:
        VideoError: PyAV is missing, or the file cannot be written (from `add` and `close` too).
    """

    def __init__(self, path: str, fps: float):
        try:
            import av
        except ImportError as e:
            raise VideoError(f"writing {path} needs PyAV ({e}); pip install av.") from None
        self.path, self.frames = path, 0
        self._temporary = os.path.join(os.path.dirname(os.path.abspath(path)), f".{os.path.basename(path)}.partial")
        self._rate = fractions.Fraction(fps).limit_denominator(1001)
        self._av = av
        self._file = self._container = self._stream = None
        # A file object, not the path: FFmpeg would read a path's "name:" prefix as a protocol.
        self._guarded(lambda: self._open())

    def _open(self) -> None:
        self._file = open(self._temporary, "wb")
        self._container = self._av.open(self._file, mode="w", format="mp4")

    def _guarded(self, step):
        """Runs `step`; any error of it (FFmpeg's, the file system's, a frame PyAV cannot take) discards the video
        and is raised as a VideoError."""
        try:
            return step()
        except Exception as e:  # av.FFmpegError, OSError, ValueError (a frame of another shape), ...
            self.discard()
            raise VideoError(f"cannot write the video {self.path}: {type(e).__name__}: {e}") from None

    def add(self, frame: np.ndarray) -> None:
        """Encodes one frame, uint8 [H, W, 3] RGB; every frame must have the first one's size (odd sizes are cut
        by one row or column: H.264's 4:2:0 needs even ones).

        Raises:
            VideoError: the frame is not [H, W, 3], or it cannot be encoded or written (the video is discarded).
        """
        self._guarded(lambda: self._add(frame))
        self.frames += 1

    def _add(self, frame) -> None:
        frame = np.asarray(frame, np.uint8)
        if frame.ndim != 3 or frame.shape[2] != 3:
            raise ValueError(f"a frame must be RGB, [height, width, 3], not {list(frame.shape)}")
        frame = np.ascontiguousarray(frame[: frame.shape[0] // 2 * 2, : frame.shape[1] // 2 * 2])
        if self._stream is None:
            self._stream = self._container.add_stream("libx264", rate=self._rate)
            self._stream.height, self._stream.width = frame.shape[:2]
            self._stream.pix_fmt = "yuv420p"
        for packet in self._stream.encode(self._av.VideoFrame.from_ndarray(frame, format="rgb24")):
            self._container.mux(packet)

    def close(self) -> str:
        """Ends the video and moves it onto `path`; returns `path`.

        Raises:
            VideoError: no frame was added, or the end of the video cannot be written (nothing is left of it).
        """
        if self._stream is None:
            self.discard()
            raise VideoError(f"no frame was rendered for {self.path}.")
        return self._guarded(self._close)

    def _close(self) -> str:
        for packet in self._stream.encode():
            self._container.mux(packet)
        self._container.close()
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self._temporary, self.path)
        fsync_path(os.path.dirname(os.path.abspath(self.path)))
        return self.path

    def discard(self) -> None:
        """Abandons the video: nothing is left of it."""
        for thing in (self._container, self._file):
            try:
                if thing is not None:
                    thing.close()
            except Exception:  # a container that failed mid-write may not close cleanly; it is removed either way
                pass
        try:
            os.remove(self._temporary)
        except FileNotFoundError:
            pass


def read_video(path: str) -> tuple[np.ndarray, float]:
    """Decodes an MP4 file: (frames uint8 [N, H, W, 3], frames per second)."""
    import av

    with open(path, "rb") as f, av.open(f) as container:
        stream = container.streams.video[0]
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(stream)]
        return np.stack(frames), float(stream.average_rate)


def gif_of_video(path: str, max_frames: int = 100, width: int = 160) -> tuple[bytes, int, int]:
    """A small animated GIF of the MP4 at `path`, for TensorBoard: at most `max_frames` frames taken evenly over it,
    scaled to `width` pixels wide, in GIF's 256 colours. Returns (the GIF's bytes, height, width)."""
    import io

    import av
    import cv2

    with open(path, "rb") as f, av.open(f) as container:
        stream = container.streams.video[0]
        total = stream.frames or 0
        step = max(1, -(-total // max_frames)) if total else 1
        frames = [
            frame.to_ndarray(format="rgb24") for i, frame in enumerate(container.decode(stream)) if i % step == 0
        ][:max_frames]
        rate = float(stream.average_rate or 30) / step
    height = int(round(frames[0].shape[0] * width / frames[0].shape[1])) // 2 * 2
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="gif") as gif:
        out = gif.add_stream("gif", rate=fractions.Fraction(rate).limit_denominator(100))
        out.width, out.height, out.pix_fmt = width, height, "rgb8"
        for frame in frames:
            small = cv2.resize(frame, (width, height), interpolation=cv2.INTER_AREA)
            for packet in out.encode(av.VideoFrame.from_ndarray(small, format="rgb24")):
                gif.mux(packet)
        for packet in out.encode():
            gif.mux(packet)
    return buffer.getvalue(), height, width
