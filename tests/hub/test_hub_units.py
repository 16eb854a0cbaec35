"""Pure parts of the hub package: flavors, options, progress text, demo helpers.

The pods of QueuedKubeSpawner are tested in tests/kubernetes (test_pods.py by dict
equality, test_kube_spawner.py on a real Kubernetes control plane).
"""

from __future__ import annotations

import pytest

from jupyter_gpuaas.hub.demo import (
    CONFIG,
    FALLBACK_DEVICES,
    FAST_IDLE,
    detect_devices,
    fast_idle,
    quotas_for,
)
from jupyter_gpuaas.hub.k8s import validate_flavors
from jupyter_gpuaas.hub.options import (
    GpuOptions,
    OptionsError,
    options_from_form,
    parse_options,
    render_form,
    tenant_choices,
)
from jupyter_gpuaas.hub.status import QueueStatus, progress_event

FLAVORS = {
    "a100": {
        "display_name": "NVIDIA A100",
        "node_selector": {"nvidia.com/gpu.product": "A100-SXM4-80GB"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    },
    "mig": {"resource": "nvidia.com/mig-1g.10gb", "node_selector": {"pool": "mig"}},
}


def test_flavor_config_is_validated() -> None:
    assert validate_flavors(FLAVORS) == FLAVORS
    with pytest.raises(ValueError, match=r"flavors.a100: unknown key\(s\) gpus"):
        validate_flavors({"a100": {"gpus": 4}})
    with pytest.raises(ValueError, match=r"flavors\.a100\.node_selector"):
        validate_flavors({"a100": {"node_selector": {"x": 1}}})


def test_form_data_and_user_options() -> None:
    form = {"tenant": ["vision"], "flavor": [""], "gpus": ["2"]}
    assert options_from_form(form) == {"tenant": "vision", "gpus": 2}
    assert options_from_form({"gpus": ["x"]}) == {"gpus": "x"}
    assert options_from_form({"gpus": ["-1"]}) == {"gpus": -1}  # parse_options says why
    parse = parse_options
    kw = {"default_gpus": 0, "max_gpus": 4, "member_of": ["vision"]}
    assert parse({"gpus": 2}, **kw) == GpuOptions(2, "vision", None)  # the only tenant
    assert parse({}, **kw) == GpuOptions(0)
    assert parse({"gpus": 1, "flavor": "any"}, **kw).flavor is None
    with pytest.raises(OptionsError, match="not a member of tenant 'nlp'"):
        parse({"gpus": 1, "tenant": "nlp"}, **kw)
    with pytest.raises(OptionsError, match="not a member") as e:
        parse({"gpus": 1, "tenant": "nlp"}, **kw)
    assert e.value.status == 403
    # One sentence that names the field, the same for the form and the REST API.
    for bad, sentence in [
        ("x", "gpus must be a whole number, not 'x'"),
        (True, "gpus must be a whole number, not True"),
        (-1, "gpus must be 0 or more"),
        (5, "gpus must be at most 4 here"),
    ]:
        with pytest.raises(OptionsError) as e:
            parse({"gpus": bad}, **kw)
        assert str(e.value) == sentence and e.value.status == 400
    with pytest.raises(OptionsError) as e:
        parse(options_from_form({"gpus": ["-1"]}), **kw)
    assert str(e.value) == "gpus must be 0 or more"
    with pytest.raises(OptionsError, match="choose a tenant: one of nlp, vision"):
        parse({"gpus": 1}, default_gpus=0, max_gpus=4, member_of=["nlp", "vision"])


def test_form_lists_only_the_users_tenants_and_escapes() -> None:
    tenants = {
        "tenants": [
            {
                "name": "vision",
                "quota": {"a100": 2},
                "usage": [
                    {
                        "flavor": "a100",
                        "quota": 2,
                        "admitted": 1,
                        "parked": 1,
                        "pending_requests": 3,
                    }
                ],
            },
            {"name": "nlp", "quota": {"t4": 1}, "usage": []},
        ]
    }
    choices = tenant_choices(tenants, ["vision"])
    assert [c.name for c in choices] == ["vision"]
    assert choices[0].usage == (
        "uses all 2 of its a100 (1 of them parked for a culled kernel or server), 3 requests queued"
    )
    html = render_form(
        tenants=choices,
        flavor_names={"a100": "NVIDIA <A100>"},
        default_gpus=1,
        max_gpus=4,
        banner="SIMULATED",
    )
    assert 'value="vision"' in html and 'value="nlp"' not in html
    assert "NVIDIA &lt;A100&gt;" in html and 'id="gpuaas-banner"' in html
    assert 'value="1"' in html and "GPUs (0 to 4;" in html


def test_progress_messages() -> None:
    opts = GpuOptions(2, "vision", "a100")
    queued = progress_event(
        QueueStatus(
            "queued",
            opts,
            request={
                "id": "r-1",
                "position": {"tenant": 1, "tenant_of": 2, "overall": 3, "of": 5},
                "estimated_wait": {"seconds": 240, "basis": "..."},
                "waiting_for": {
                    "kind": "capacity",
                    "message": "waiting: all 4 a100 are in use; the next one frees when "
                    "alice's job ends (about 4 min)",
                },
            },
            usage=[
                {"flavor": "a100", "quota": 2, "admitted": 4, "parked": 0, "borrowed_from": ["nlp"]}
            ],
        )
    )
    assert queued["message"] == (
        "Queued for 2× a100 (team vision); position 1 of 2 in the team, 3 of 5 overall; "
        "vision uses 4 a100: 2 of its own and 2 borrowed from nlp; "
        "waiting: all 4 a100 are in use; the next one frees when alice's job ends (about 4 min)"
    )
    assert queued["gpuaas"]["position"] == 1 and queued["gpuaas"]["estimated_wait"] == 240
    # From an older gateway without waiting_for: the number in the same words, or none.
    older = QueueStatus("queued", opts, request={"estimated_wait": {"seconds": 238}})
    assert progress_event(older)["message"].endswith("; estimated wait about 4 min")
    unknown = QueueStatus("queued", opts, request={"estimated_wait": {"seconds": None}})
    assert progress_event(unknown)["message"].endswith("; no estimate yet")
    admitted = progress_event(
        QueueStatus(
            "admitted",
            opts,
            request={"grant": {"flavor": "a100", "node": "a100-0", "devices": [2, 3]}},
            simulated=True,
        )
    )
    assert "on a100-0, devices 2,3 (simulated devices)" in admitted["message"]


def test_demo_helpers() -> None:
    assert detect_devices("simulated:t4=1x2") == ("simulated:t4=1x2", None, 0)
    spec, flavor, _gpus = detect_devices("nvml")
    assert (spec == FALLBACK_DEVICES and flavor is None) or spec == f"nvml:flavor={flavor}"
    import yaml

    q = yaml.safe_load(quotas_for("h200", 1))
    assert q["flavors"] == {"h200": {"nodes": 1, "gpus_per_node": 1}}
    assert q["tenants"]["vision"]["quota"] == {"h200": 1}
    assert q["tenants"]["nlp"]["quota"] == {"h200": 0}


def test_fast_idle_shortens_every_idle_setting_and_keeps_the_rest() -> None:
    """`demo --fast-idle`'s quota file: the shipped one, or the machine's, with the idle
    policy short enough to watch warning, Keep, cull and resume in a few minutes."""
    import yaml

    from jupyter_gpuaas.admission.config import parse_config

    shipped = CONFIG.with_name("quotas.yaml").read_text(encoding="utf-8")
    for text in (shipped, quotas_for("h200", 2)):
        before, after = yaml.safe_load(text), yaml.safe_load(fast_idle(text))
        policy = parse_config(after).policy
        assert (policy.idle_timeout, policy.cull_warning, policy.reservation_ttl) == (
            FAST_IDLE["idle_timeout"],
            FAST_IDLE["cull_warning"],
            FAST_IDLE["reservation_ttl"],
        )
        assert after["tenants"] == before["tenants"] and after["flavors"] == before["flavors"]
        assert after["policy"]["preemption_grace"] == before["policy"]["preemption_grace"]
    own = "flavors: {a100: {nodes: 1, gpus_per_node: 1}}\n" + (
        "tenants: {vision: {quota: {a100: 1}, idle_timeout: 9000}}\n"
    )
    config = parse_config(yaml.safe_load(fast_idle(own)))
    assert config.tenants["vision"].idle_timeout is None  # the policy's, not 9000 s


def test_spawner_traits_are_validated() -> None:
    from traitlets import TraitError

    from jupyter_gpuaas.hub import QueuedSimpleLocalProcessSpawner

    s = QueuedSimpleLocalProcessSpawner()
    assert s.queue_timeout == 24 * 3600 and callable(s.options_form)
    with pytest.raises(TraitError):
        s.heartbeat_interval = 0
    with pytest.raises(TraitError):
        s.max_gpus = -1
    with pytest.raises(TraitError):
        s.flavors = {"a100": {"nope": 1}}


def test_kube_spawner_needs_kubespawner() -> None:
    import importlib.util

    import jupyter_gpuaas.hub as hub

    if importlib.util.find_spec("kubespawner") is not None:
        assert hub.QueuedKubeSpawner.__name__ == "QueuedKubeSpawner"
    else:
        with pytest.raises(ImportError, match="pip install jupyterhub-kubespawner"):
            _ = hub.QueuedKubeSpawner
