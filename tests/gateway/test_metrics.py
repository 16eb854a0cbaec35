"""Gateway metrics: INTERFACES.md names and labels, stale series dropped, histogram buckets."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from jupyter_gpuaas.devices import DeviceSample
from jupyter_gpuaas.gateway.metrics import GatewayMetrics, PendingCount, TenantUsage

Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(metrics: GatewayMetrics) -> Series:
    body, content_type = metrics.render()
    assert content_type.startswith("text/plain")
    out: Series = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def names(series: Series) -> set[str]:
    return {name for name, _ in series}


def value(series: Series, name: str, **labels: str) -> float:
    """The one series of `name` whose labels include `labels` (the device series carry
    dcgm-exporter's labels too, checked in test_dcgm_labels.py)."""
    found = [v for (n, ls), v in series.items() if n == name and labels.items() <= dict(ls).items()]
    assert len(found) == 1, (name, labels, found)
    return found[0]


def _snapshot(metrics: GatewayMetrics, *, with_t4: bool) -> None:
    tenants = [
        TenantUsage("vision", "a100", quota=4, admitted=3, parked=1, borrowed=0, pending_gpus=2)
    ]
    pending = [PendingCount("vision", "a100", "server", 1)]
    devices: list[tuple[DeviceSample, str, str | None, str | None]] = [
        (DeviceSample("a100-0", 0, 0.75, 2**30, 55.0, 250.5, True, {}), "a100", "vision", "ann"),
        (DeviceSample("a100-0", 1, 0.0, 0, None, None, False, {}), "a100", None, None),
    ]
    if with_t4:
        tenants.append(TenantUsage("nlp", "t4", 2, 2, 0, 1, 0))
        pending.append(PendingCount("nlp", "t4", "kernel", 3))
        devices.append((DeviceSample("t4-0", 0, 0.5, 0, 40.0, 30.0, True, {}), "t4", "nlp", "bo"))
    metrics.set_snapshot(
        tenants,
        pending,
        desired_nodes={"a100": 3, **({"t4": 1} if with_t4 else {})},
        idle_gpus={"vision": 1, **({"nlp": 2} if with_t4 else {})},
        devices=devices,
        simulated=True,
    )


def test_names_and_labels_of_interfaces_md() -> None:
    m = GatewayMetrics(user_label=True)  # --metrics-user-label (test_metrics_auth.py: off)
    _snapshot(m, with_t4=True)
    m.observe_wait("vision", "server", 42.0)
    m.inc_culled("vision", "kernel")
    m.inc_preempted("nlp", "job")
    s = scrape(m)
    assert {
        "gpuaas_pending_requests",
        "gpuaas_pending_gpus",
        "gpuaas_admitted_gpus",
        "gpuaas_parked_gpus",
        "gpuaas_quota_gpus",
        "gpuaas_borrowed_gpus",
        "gpuaas_admission_wait_seconds_bucket",
        "gpuaas_admission_wait_seconds_count",
        "gpuaas_admission_wait_seconds_sum",
        "gpuaas_culled_total",
        "gpuaas_preempted_total",
        "gpuaas_desired_nodes",
        "gpuaas_idle_gpus",
        "gpuaas_device_utilization_ratio",
        "gpuaas_device_memory_used_bytes",
        "gpuaas_device_temperature_celsius",
        "gpuaas_device_power_watts",
    } <= names(s)
    assert value(s, "gpuaas_pending_requests", tenant="nlp", flavor="t4", kind="kernel") == 3
    assert value(s, "gpuaas_pending_gpus", tenant="vision", flavor="a100") == 2
    assert value(s, "gpuaas_admitted_gpus", tenant="vision", flavor="a100") == 3
    assert value(s, "gpuaas_parked_gpus", tenant="vision", flavor="a100") == 1
    assert value(s, "gpuaas_quota_gpus", tenant="vision", flavor="a100") == 4
    assert value(s, "gpuaas_borrowed_gpus", tenant="nlp", flavor="t4") == 1
    assert value(s, "gpuaas_desired_nodes", flavor="a100") == 3
    assert value(s, "gpuaas_idle_gpus", tenant="nlp") == 2
    assert value(s, "gpuaas_culled_total", tenant="vision", kind="kernel") == 1
    assert value(s, "gpuaas_preempted_total", tenant="nlp", kind="job") == 1
    held = {"node": "a100-0", "device": "0", "flavor": "a100", "tenant": "vision", "user": "ann"}
    free = {"node": "a100-0", "device": "1", "flavor": "a100", "tenant": "", "user": ""}
    assert value(s, "gpuaas_device_utilization_ratio", **held) == 0.75
    assert value(s, "gpuaas_device_memory_used_bytes", **held) == 2**30
    assert value(s, "gpuaas_device_temperature_celsius", **held) == 55.0
    assert value(s, "gpuaas_device_power_watts", **held) == 250.5
    assert value(s, "gpuaas_device_healthy", **free) == 0
    # A device without a temperature sensor exports no made-up zero.
    assert not any(
        n == "gpuaas_device_temperature_celsius" and free.items() <= dict(ls).items() for n, ls in s
    )
    assert value(s, "gpuaas_devices_simulated") == 1


def test_stale_series_are_removed_on_the_next_snapshot() -> None:
    m = GatewayMetrics()
    _snapshot(m, with_t4=True)
    before = scrape(m)
    assert any(dict(labels).get("flavor") == "t4" for _, labels in before)
    _snapshot(m, with_t4=False)
    after = scrape(m)
    assert not any(dict(labels).get("flavor") == "t4" for _, labels in after)
    assert not any(dict(labels).get("tenant") == "nlp" for _, labels in after)
    assert value(after, "gpuaas_quota_gpus", tenant="vision", flavor="a100") == 4
    m.set_snapshot([], [], {}, {}, [])
    empty = scrape(m)
    assert not any(n.startswith("gpuaas_device_") or n == "gpuaas_quota_gpus" for n in names(empty))


def test_wait_histogram_buckets_span_seconds_to_hours() -> None:
    m = GatewayMetrics()
    for seconds in (0.5, 20, 700, 5000, 20000):
        m.observe_wait("vision", "job", seconds)
    s = scrape(m)
    buckets = {
        dict(labels)["le"]: v
        for (name, labels), v in s.items()
        if name == "gpuaas_admission_wait_seconds_bucket"
    }
    expected = ["1.0", "5.0", "15.0", "30.0", "60.0", "120.0", "300.0", "600.0", "1800.0"]
    expected += ["3600.0", "7200.0", "14400.0", "+Inf"]
    assert list(buckets) == expected
    assert buckets["1.0"] == 1 and buckets["30.0"] == 2 and buckets["1800.0"] == 3
    assert buckets["7200.0"] == 4 and buckets["14400.0"] == 4 and buckets["+Inf"] == 5
    assert value(s, "gpuaas_admission_wait_seconds_count", tenant="vision", kind="job") == 5


def test_two_gateways_in_one_process_do_not_clash() -> None:
    a, b = GatewayMetrics(), GatewayMetrics()
    a.inc_culled("vision", "kernel")
    assert value(scrape(a), "gpuaas_culled_total", tenant="vision", kind="kernel") == 1
    assert ("gpuaas_culled_total", (("kind", "kernel"), ("tenant", "vision"))) not in scrape(b)


def test_idle_gpus_are_zero_for_a_tenant_with_none_rather_than_absent() -> None:
    """So that an average over time (idle GPU-hours) counts the busy stretches as 0."""
    m = GatewayMetrics()
    m.set_snapshot(
        [TenantUsage("vision", "a100", 4, 2, 0, 0, 0), TenantUsage("nlp", "a100", 2, 1, 0, 0, 0)],
        [],
        {},
        {"nlp": 1},
        [],
    )
    s = scrape(m)
    assert value(s, "gpuaas_idle_gpus", tenant="vision") == 0
    assert value(s, "gpuaas_idle_gpus", tenant="nlp") == 1
