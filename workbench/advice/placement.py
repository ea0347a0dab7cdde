"""Rules about where work runs: GPUs unevenly loaded, offload traffic on PCIe."""

from __future__ import annotations

from typing import Any

from .core import OFFLOAD_KNOBS, Finding, Measurements, finding, limit, no_knob


def _role_on(m: Measurements, node: Any, gpu: int) -> str | None:
    """The role seen most often on that GPU in the process table, if there is one."""
    if m.procs is None or m.procs.empty or "role" not in m.procs:
        return None
    here = m.procs[m.procs["gpu"] == gpu]
    if "node" in here:
        here = here[here["node"].fillna("") == node]
    roles = here["role"].dropna()
    return str(roles.mode().iloc[0]) if len(roles) else None


def util_spread(m: Measurements) -> Finding | None:
    if m.per_gpu.empty:
        return None
    means = m.per_gpu.set_index(["node", "gpu"])["util_mean"].dropna()
    if len(means) < 2 or len(m.util_samples) < limit("min_samples"):
        return None
    spread = float(means.max() - means.min())
    if spread <= limit("util_spread_points"):
        return None
    (busy_node, busy_gpu), (idle_node, idle_gpu) = means.idxmax(), means.idxmin()
    several_nodes = means.index.get_level_values("node").nunique() > 1

    def label(node: Any, gpu: int) -> str:
        return f"{node} GPU {gpu}" if several_nodes else f"GPU {gpu}"

    busy, idle = label(busy_node, busy_gpu), label(idle_node, idle_gpu)
    role = _role_on(m, idle_node, idle_gpu)
    pools = {"critic": "critic_gpus", "reward": "reward_gpus"}
    if role in pools and m.knobs[pools[role]] > 0:
        change = {pools[role]: 0}
        expected = (f"The {role} shares the actor's GPUs again and {idle} joins the actor pool, so no GPU waits "
                    "on a light role.")
    elif role in ("actor/rollout/ref", "colocated") and m.knobs["trainer_mode"] == "separate_async" \
            and not m.knobs["hybrid_switch"]:
        change = {"hybrid_switch": True}
        expected = f"{idle}, a trainer GPU, is lent to rollout while it would wait."
    else:
        change, expected = {}, no_knob(
            f"no placement knob moves {'its ' + role if role else 'the unattributed'} work; compare the roles on "
            f"{idle} and {busy} in the process table.")
    where = f" ({role})" if role else ""
    return finding(
        m, rule="util-spread", title=f"{idle} idles while {busy} works", severity="medium",
        evidence={"spread_points": spread, "busiest_gpu": int(busy_gpu), "idlest_gpu": int(idle_gpu),
                  "util_mean": {label(node, gpu): float(u) for (node, gpu), u in means.items()},
                  "idlest_role": role},
        text=f"Mean utilization ranged {spread:.0f} points across GPUs: {busy} {means.max():.0f}%, "
             f"{idle}{where} {means.min():.0f}%",
        change=change, expected=expected,
    )


def pcie_offload(m: Measurements) -> Finding | None:
    offloaded = [knob for knob in OFFLOAD_KNOBS if m.knobs[knob]]
    if not offloaded or m.per_gpu.empty:
        return None
    busiest = m.per_gpu[["pcie_tx_p90", "pcie_rx_p90"]].max(axis=1).dropna()
    if busiest.empty or busiest.max() <= limit("pcie_near_saturation_mb_s"):
        return None
    row = m.per_gpu.loc[busiest.idxmax()]
    gpu = int(row["gpu"])
    room = m.peak_memory_share < limit("memory_room_peak")
    change = {knob: False for knob in offloaded} if room else {}
    return finding(
        m, rule="pcie-offload", title="Offload traffic saturates PCIe", severity="medium",
        evidence={"gpu": gpu, "pcie_tx_p90_mb_s": float(row["pcie_tx_p90"]),
                  "pcie_rx_p90_mb_s": float(row["pcie_rx_p90"]), "offloaded": offloaded,
                  "peak_memory_share": m.peak_memory_share},
        text=f"PCIe on GPU {gpu} ran at {busiest.max() / 1000:.0f} GB/s in one direction at the 90th percentile "
             f"(limit {limit('pcie_near_saturation_mb_s') / 1000:.0f} GB/s) with {', '.join(offloaded)} on; "
             f"{m.peak_memory_text}",
        change=change,
        expected=("Parameters and optimizer state stay on the GPU, so the steps stop waiting on host transfers."
                  if room else no_knob(f"memory peaks above {limit('memory_room_peak'):.0%}, too full to keep "
                                        "the offloaded state on the GPU.")),
    )
