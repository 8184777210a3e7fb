"""The admin's caps against the user's command line (asking more is an error), and the
variables the admin makes mandatory."""
from __future__ import annotations

from smartlaunch.errors import PolicyError
from smartlaunch.policy.api import Policy, format_value
from smartlaunch.policy.load import ADMIN_POLICY_PATH, replace_values
from smartlaunch.request import Request
from smartlaunch.vocab import Strategy


def check_request(policy: Policy, request: Request) -> None:
    """PolicyError when --nproc-per-node or --strategy goes beyond an enforced admin rule."""
    where = policy.admin_path or ADMIN_POLICY_PATH
    cap = policy.enforced.get("decision.max_gpus")
    if cap is not None and request.max_gpus is not None and request.max_gpus > cap:
        raise PolicyError(
            f"--nproc-per-node {request.max_gpus} exceeds the admin policy's cap "
            f"(enforce.decision.max_gpus={cap} in {where}); use --nproc-per-node {cap} "
            "or fewer")
    sizes = policy.enforced.get("decision.world_sizes")
    if sizes is not None and request.strategy == Strategy.DDP.value and \
            request.max_gpus is not None and request.max_gpus not in sizes:
        ddp = [n for n in sizes if n >= 2]
        below = [n for n in ddp if n < request.max_gpus]
        near = below[-1] if below else (ddp[0] if ddp else None)
        fix = f"use --nproc-per-node {near}" if near else "use --strategy single"
        raise PolicyError(
            f"--nproc-per-node {request.max_gpus} is a world size the admin policy does not "
            f"allow for DDP (enforce.decision.world_sizes={format_value(tuple(sizes))} in "
            f"{where}); {fix}")
    allowed = policy.enforced.get("decision.allowed_strategies")
    if allowed is not None and request.strategy != "auto" and request.strategy not in allowed:
        choices = ["auto", *allowed]
        raise PolicyError(
            f"--strategy {request.strategy} is forbidden by the admin policy "
            f"(enforce.decision.allowed_strategies={format_value(tuple(allowed))} in "
            f"{where}); use --strategy {', '.join(choices[:-1])} or {choices[-1]}")


SHUTDOWN_ENV = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"     # torchrun's, where --shutdown-timeout is not


def _shutdown_timeout(request: Request, environ) -> tuple[float, str] | None:
    """torchrun's SIGTERM -> SIGKILL wait as the command line or torch's variable gives it."""
    given = getattr(request.torchrun_args, "shutdown_timeout", None)
    if given is not None:
        return float(given), "cli:--shutdown-timeout"
    raw = (environ or {}).get(SHUTDOWN_ENV, "").strip()
    if raw.isdigit():
        return float(raw), f"env:{SHUTDOWN_ENV}"
    return None


def apply_request(policy: Policy, request: Request, environ=None) -> Policy:
    """The CLI layer: --nproc-per-node as decision.max_gpus, a forced --strategy as the only
    allowed one, torchrun's --shutdown-timeout (or TORCH_ELASTIC_SHUTDOWN_TIMEOUT in `environ`)
    as launch.signal_grace_s."""
    check_request(policy, request)
    out = policy
    grace = _shutdown_timeout(request, environ)
    if grace is not None:
        cap = policy.enforced.get("launch.signal_grace_s")
        if cap is not None and grace[0] > cap:
            where = policy.admin_path or ADMIN_POLICY_PATH
            raise PolicyError(
                f"{grace[1].split(':', 1)[1]}={grace[0]:g} s exceeds the admin policy's cap "
                f"(enforce.launch.signal_grace_s={format_value(cap)} in {where}); give "
                f"{format_value(cap)} or less")
        out = replace_values(out, {"launch.signal_grace_s": grace[0]}, grace[1])
    if request.max_gpus is not None:
        out = replace_values(out, {"decision.max_gpus": request.max_gpus}, "cli:--nproc-per-node")
    if request.strategy != "auto":
        changes: dict[str, object] = {"decision.allowed_strategies": (request.strategy,)}
        if policy.decision.fallback_strategy != request.strategy:
            changes["decision.fallback_strategy"] = request.strategy
        out = replace_values(out, changes, "cli:--strategy")
    return out


def enforced_env(policy: Policy, family: str | None = None) -> dict[str, str]:
    """Variables the admin makes mandatory: enforced launch.env, plus launch.nccl.<family>."""
    out = {k.split(".", 2)[2]: str(v) for k, v in policy.enforced.items()
           if k.startswith("launch.env.")}
    if family is not None and f"launch.nccl.{family}" in policy.enforced:
        out.update(policy.launch.nccl.get(family, {}))
    return out
