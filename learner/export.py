"""`rlfleet export`: a run's policy as a standalone model that needs neither rlfleet nor its weights' layout.

A TensorFlow SavedModel whose `serving_default` signature maps a batch of raw observations to env actions, with
everything between them inside it (the algorithm's `Agent.serving_module`: PPO's observation normalization, its
clip and the action scaling to the env's bounds; DQN's greedy action and Q-values), or the same function
converted to ONNX (tf2onnx, the `export` extra). Beside it, `policy.json` describes the spaces, the signature and
where the policy came from.
"""

from __future__ import annotations

import json
import os
import shutil

import tensorflow as tf

from rlfleet.common.files import atomic_write, fsync_path, glob_free, storage_error

FORMATS = ("savedmodel", "onnx")
SPEC_FILE = "policy.json"
ONNX_FILE = "policy.onnx"
ONNX_OPSET = 17  # an opset every onnxruntime release since 1.15 runs


class ExportError(ValueError):
    """The policy cannot be exported; the message names the cause and the fix."""


def describe(restored, module: tf.Module, fmt: str) -> dict:
    """policy.json: the run, checkpoint and counters the policy comes from, the observation and action spaces,
    and the signature's inputs and outputs (names, dtypes, shapes; None: any batch size)."""
    spec = restored.spec
    concrete = module.serve.get_concrete_function()
    (observations,) = concrete.structured_input_signature[0]
    inputs = {observations.name: dict(dtype=observations.dtype.name, shape=observations.shape.as_list())}
    outputs = {k: dict(dtype=v.dtype.name, shape=v.shape.as_list()) for k, v in concrete.structured_outputs.items()}
    observation = dict(shape=list(spec.obs_shape), dtype=spec.obs_dtype)
    if spec.frame_stack > 1:
        observation["preprocessing"] = (
            "Atari (ale-py v5 ids): sticky actions 0.25, frame skip 4 with max-pool over the last two frames, "
            "84x84 grey, the last 4 frames stacked on axis 0 oldest first (zeros before an episode's first), "
            "no noop or fire resets; e.g. gymnasium's AtariPreprocessing(frame_skip=4, screen_size=84, "
            "noop_max=0) and FrameStackObservation(4, padding_type='zero') on gym.make(id, frameskip=1)."
        )
    if spec.action_kind == "continuous":
        bounds = dict(low=list(spec.action_low), high=list(spec.action_high))
        action = dict(kind="continuous", shape=[spec.action_dim], **bounds)
    else:
        action = dict(kind="discrete", num_actions=spec.action_dim)
    return dict(
        format=fmt,
        file=ONNX_FILE if fmt == "onnx" else ".",
        signature=None if fmt == "onnx" else "serving_default",
        inputs=inputs,
        outputs=outputs,
        algo=restored.algo,
        env_id=restored.env_id,
        policy="mean action" if spec.action_kind == "continuous" else "greedy action (argmax of the Q-values)",
        observation=observation,
        action=action,
        run=os.path.abspath(restored.run_dir),
        checkpoint=os.path.abspath(restored.checkpoint),
        env_steps=restored.env_steps,
        policy_version=restored.policy_version,
    )


def export_policy(restored, out: str, fmt: str = "savedmodel") -> dict:
    """Writes the restored run's policy (`rlfleet.learner.restored.RestoredRun`) into the new folder `out`: a
    SavedModel (`tf.saved_model.load(out).signatures["serving_default"]`) or `out/policy.onnx`, and
    `out/policy.json` (`describe`). The folder appears whole or not at all (written beside it, then renamed).

    Returns:
        the policy.json record.
    Raises:
        ExportError: `out` exists and is not an empty folder, the algorithm gives no serving module, or ONNX
            was asked for without tf2onnx.
        StorageError: the folder cannot be written.
    """
    if os.path.exists(out) and not (os.path.isdir(out) and not os.listdir(out)):
        raise ExportError(f"--out {out} already exists; give a new folder (nothing in it was touched).")
    try:
        module = restored.agent.serving_module()
    except NotImplementedError as e:
        raise ExportError(str(e)) from None
    record = describe(restored, module, fmt)
    parent = os.path.dirname(os.path.abspath(out))
    try:
        os.makedirs(parent, exist_ok=True)
        staging = os.path.join(parent, f".rlfleet-export-{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        os.mkdir(staging)
    except OSError as e:
        raise storage_error(e, "the exported policy", parent) from None
    try:
        # TensorFlow reads its path as a file-name pattern: it is given the staging folder through an alias.
        target = os.path.join(glob_free(parent), os.path.basename(staging))
        if fmt == "onnx":
            _write_onnx(module, os.path.join(target, ONNX_FILE))
        else:
            signature = module.serve.get_concrete_function()
            tf.saved_model.save(module, target, signatures={"serving_default": signature})
        atomic_write(os.path.join(staging, SPEC_FILE), json.dumps(record, indent=2))
        for root, _, files in os.walk(staging):
            for name in files:
                fsync_path(os.path.join(root, name))
        if os.path.isdir(out):
            os.rmdir(out)  # the empty folder given
        os.rename(staging, out)
        fsync_path(parent)
    except OSError as e:
        shutil.rmtree(staging, ignore_errors=True)
        raise storage_error(e, "the exported policy", parent) from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return record


def _write_onnx(module: tf.Module, path: str) -> None:
    """The serving function converted to ONNX (opset `ONNX_OPSET`) at `path`.

    Raises:
        ExportError: tf2onnx is not installed (the `export` extra).
    """
    try:
        import tf2onnx
    except ImportError as e:
        raise ExportError(
            f'--format onnx needs tf2onnx ({e}); install the export extra: pip install -e ".[cpu,export]".'
        ) from None
    signature = list(module.serve.get_concrete_function().structured_input_signature[0])
    tf2onnx.convert.from_function(module.serve, input_signature=signature, opset=ONNX_OPSET, output_path=path)
