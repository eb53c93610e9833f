"""Client side of the learner's GetStatus RPC: fetch and format."""

from __future__ import annotations

import math

import grpc
from google.protobuf import json_format
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rlfleet.proto import rlfleet_pb2, rlfleet_pb2_grpc
from rlfleet.proto.security import ClientSecurity, channel, tls_problem


class StatusError(RuntimeError):
    """The learner could not be queried."""


def get_status(address: str, timeout_s: float = 5.0, security: ClientSecurity | None = None) -> dict:
    """Calls GetStatus on the learner at `address` (TLS and token per `security`).

    Returns:
        dict with the snake_case fields of the `Status` message in proto/rlfleet.proto (NaN for values not yet
        known), and each of the algorithm's own values (`algorithm_values`) also at the top level under its
        name (e.g. QDagger's distillation_coefficient), where no field of the message has that name.
    Raises:
        StatusError: unreachable learner, refused token or RPC failure within `timeout_s` seconds.
        SecurityError: unreadable TLS files.
    """
    with channel(address, security) as ch:
        try:
            msg = rlfleet_pb2_grpc.LearnerStub(ch).GetStatus(
                rlfleet_pb2.GetStatusRequest(), timeout=timeout_s, wait_for_ready=False
            )
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.UNAUTHENTICATED:
                raise StatusError(f"the learner at {address} refused the call: {e.details()}") from None
            problem = tls_problem(address, security, timeout_s) if e.code() == grpc.StatusCode.UNAVAILABLE else None
            if problem:
                raise StatusError(f"cannot reach the learner at {address}: {problem}.") from None
            raise StatusError(
                f"cannot reach the learner at {address} ({e.code().name}: {e.details()}); "
                "check the address (`rlfleet up` prints it; under docker-compose it is the published port, "
                "RLFLEET_LEARNER_PORT) and that the learner runs; with TLS, "
                "pass --tls-ca (and --tls-cert/--tls-key when it requires client certificates)."
            ) from None
    st = _to_dict(msg)
    st.update({k: v for k, v in st["algorithm_values"].items() if k not in st})
    return st


def check_health(
    learner: str | None = None,
    replay: str | None = None,
    timeout_s: float = 5.0,
    security: ClientSecurity | None = None,
) -> tuple[bool, str]:
    """Asks the learner's gRPC health service (`learner` host:port) or a Reverb server (`replay`) whether
    it serves. Returns (ok, message); never raises for an unreachable service."""
    if replay:
        return _replay_health(replay, timeout_s)
    with channel(learner, security) as ch:
        try:
            resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout_s)
        except grpc.RpcError as e:
            return False, f"learner {learner}: unreachable ({e.code().name}: {e.details()})"
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
    return resp.status == health_pb2.HealthCheckResponse.SERVING, f"learner {learner}: {status}"


# Reverb's own RPC that `reverb.Client.server_info` makes (reverb/cc/reverb_service.proto). Called here with an
# empty request and the reply left as bytes, so that a health check needs neither Reverb's client nor the
# TensorFlow it imports (some 4 s of CPU per check in a container).
_REVERB_SERVER_INFO = "/deepmind.reverb.ReverbService/ServerInfo"


def _replay_health(address: str, timeout_s: float) -> tuple[bool, str]:
    """(ok, message): whether the Reverb server at `address` answers its ServerInfo RPC within `timeout_s`."""
    with grpc.insecure_channel(address) as ch:
        try:
            info = ch.unary_unary(_REVERB_SERVER_INFO)(b"", timeout=timeout_s)
        except grpc.RpcError as e:
            return False, f"replay {address}: unreachable ({e.code().name}: {e.details()})"
    return True, f"replay {address}: serving ({len(info)} bytes of table information)"


def _to_dict(msg) -> dict:
    d = json_format.MessageToDict(msg, preserving_proto_field_name=True, including_default_value_fields=True)

    # int64 fields come back as strings in proto JSON; scripts want numbers.
    def fix(obj, desc):
        for f in desc.fields:
            if f.name not in obj:
                continue
            if f.message_type is not None and f.message_type.GetOptions().map_entry:  # algorithm_values
                obj[f.name] = {k: float(v) for k, v in obj[f.name].items()}  # "NaN" -> nan
            elif f.message_type is not None and f.label == f.LABEL_REPEATED:
                for sub in obj[f.name]:
                    fix(sub, f.message_type)
            elif f.type in (f.TYPE_INT64, f.TYPE_UINT64):
                obj[f.name] = int(obj[f.name])
            elif f.type in (f.TYPE_DOUBLE, f.TYPE_FLOAT) and isinstance(obj[f.name], str):
                obj[f.name] = float(obj[f.name])  # "NaN"

    fix(d, msg.DESCRIPTOR)
    return d


def to_json_ready(st: dict) -> dict:
    """A status dict for strict JSON: NaN (a value not known yet) becomes null."""

    def clean(v):
        if isinstance(v, float) and math.isnan(v):
            return None
        if isinstance(v, list):
            return [clean(x) for x in v]
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        return v

    return clean(st)


def _algorithm_values(algo: str, values: dict) -> list[tuple[str, str]]:
    """(label, text) of each algorithm value: the definition's labels and formats (`Algorithm.status_values`)
    first, in its order, then the others by key (an algorithm this machine does not know: all by key)."""
    from rlfleet import algorithms

    try:
        known = algorithms.get(algo).status_values
    except (ValueError, ImportError):
        known = {}
    out = [(label, _num(values[k], fmt)) for k, (label, fmt) in known.items() if k in values]
    return out + [(k.replace("_", " "), _value(v)) for k, v in sorted(values.items()) if k not in known]


def _value(x: float) -> str:
    """A status value of unknown scale: 1 decimal from 1 up (returns), 3 significant digits below (β, λ)."""
    return _num(x, "{:,.1f}" if abs(x) >= 1 else "{:.3g}")


def _num(x, fmt="{:,.0f}") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)


def format_status(st: dict) -> str:
    """A readable multi-line table of a status dict."""
    lines = [
        f"algo {st['algo'] or '-'}  env {st['env_id'] or '-'}  phase {st['phase']}  "
        f"uptime {_num(st['uptime_seconds'])} s",
        f"env steps {_num(st['env_steps'])} ({_num(st['env_steps_per_second'])}/s)   "
        f"learner steps {_num(st['learner_steps'])} ({_num(st['learner_steps_per_second'], '{:,.1f}')}/s)   "
        f"policy version {st['policy_version']}",
        f"episode return (recent) {_num(st['episode_return_mean'], '{:,.1f}')}   "
        f"eval return {_num(st['eval_return_mean'], '{:,.1f}')}   "
        f"dropped env steps (policy lag) {_num(st.get('dropped_env_steps', 0))}",
    ]
    if st.get("fault"):
        lines.insert(1, f"FAULT: {st['fault']}")
    if st.get("waiting_for"):
        lines.insert(1, f"waiting for {st['waiting_for']}")
    values = st.get("algorithm_values") or {}
    if values:  # the algorithm's own values (QDagger: distillation coefficient, teacher and random returns)
        lines.append("   ".join(f"{label} {text}" for label, text in _algorithm_values(st["algo"], values)))
    lines.append("")
    lines.append(
        f"{'actor':>5}  {'host':<20} {'ip address':<16} {'envs':>5} {'policy ver':>10} "
        f"{'env steps':>12} {'heartbeat':>10}  {'env backend':<11}"
    )
    for a in st.get("actors", []):
        lines.append(
            f"{a['actor_id']:>5}  {a['host'][:20]:<20} {a.get('address', '')[:16]:<16} {a['num_envs']:>5} "
            f"{a['policy_version'] if a['policy_version'] >= 0 else 'none yet':>10} "
            f"{a['env_steps']:>12,} {a['seconds_since_heartbeat']:>9.1f}s  {a.get('env_backend') or '-':<11}"
        )
    for a in st.get("actors", []):  # why each actor steps its envs where it does
        if a.get("env_backend_reason"):
            lines.append(f"  actor {a['actor_id']} env backend: {a['env_backend_reason']}")
    if not st.get("actors"):
        lines.append("  (no actors)")
    lines.append("")
    lines.append(f"{'replay table':<20} {'size':>8} {'max':>8} {'inserts':>10} {'samples':>10}")
    for t in st.get("replay", []):
        lines.append(f"{t['table']:<20} {t['size']:>8} {t['max_size']:>8} {t['inserts']:>10} {t['samples']:>10}")
    if not st.get("replay"):
        from rlfleet.learner.status import STARTING_PHASES

        starting = st["phase"] in STARTING_PHASES
        lines.append("  (the learner is starting)" if starting else "  (the replay server does not answer the learner)")
    return "\n".join(lines)
