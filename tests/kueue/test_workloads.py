"""Kueue mode's pure parts: a Workload as the gateway shows it (`workload_view`), Kueue's
reasons for waiting in words (`waiting_words`), and the labels that hand what a holder
builds to Kueue (`kueue_labels`, in the Job and kernel pod builders). The Workloads are
shaped as the real Kueue 0.19 writes them (tests/kubernetes/test_kueue_mode.py runs the
real thing)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from jupyter_gpuaas.kubeapi.workloads import (
    OUTSIDE,
    WorkloadView,
    eviction_words,
    waiting_words,
    workload_view,
)
from jupyter_gpuaas.kubernetes.jobs import job_manifest
from jupyter_gpuaas.kubernetes.kernel_pods import kernel_pod_manifest
from jupyter_gpuaas.kubernetes.pods import kueue_labels

PENDING: dict[str, Any] = {
    "apiVersion": "kueue.x-k8s.io/v1beta2",
    "kind": "Workload",
    "metadata": {
        "name": "job-train-3f2a1",
        "namespace": "jhub",
        "uid": "0f8e2a4c-1b2d-4e6f-8a9b-0c1d2e3f4a5b",
        "creationTimestamp": "2026-12-06T10:00:00Z",
        "labels": {"gpuaas.jupyter.org/user": "carol"},
        "ownerReferences": [
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": "train",
                "uid": "j-1",
                "controller": True,
            }
        ],
    },
    "spec": {
        "queueName": "vision",
        "priority": 5,
        "podSets": [
            {
                "name": "main",
                "count": 2,
                "template": {
                    "spec": {
                        "containers": [
                            {
                                "name": "c",
                                "resources": {"requests": {"nvidia.com/gpu": "2", "cpu": "4"}},
                            }
                        ]
                    }
                },
            }
        ],
    },
    "status": {
        "conditions": [
            {
                "type": "QuotaReserved",
                "status": "False",
                "reason": "Pending",
                "message": "couldn't assign flavors to pod set main: insufficient unused quota "
                "for nvidia.com/gpu in flavor a100, 3 more needed",
            }
        ]
    },
}


def with_status(**status: Any) -> dict[str, Any]:
    out = copy.deepcopy(PENDING)
    out["status"] = status
    return out


def test_a_pending_workload_of_a_job() -> None:
    assert workload_view(PENDING) == WorkloadView(
        uid="0f8e2a4c-1b2d-4e6f-8a9b-0c1d2e3f4a5b",
        name="job-train-3f2a1",
        namespace="jhub",
        queue="vision",
        user="carol",
        kind="job",
        owner="Job train",
        owner_uid="j-1",
        gpus=4,
        priority=5,
        created=1796551200.0,
        state="queued",
        reason="Pending",
        message=PENDING["status"]["conditions"][0]["message"],
    )


def test_admitted_evicted_and_finished() -> None:
    admission = {
        "clusterQueue": "vision",
        "podSetAssignments": [
            {"name": "main", "flavors": {"cpu": "default", "nvidia.com/gpu": "a100"}}
        ],
    }
    reserved = {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"}
    admitted = workload_view(with_status(conditions=[reserved], admission=admission))
    assert (admitted.state, admitted.flavor, admitted.reason) == ("admitted", "a100", "")

    evicted = {
        "type": "Evicted",
        "status": "True",
        "reason": "Preempted",
        "message": "Preempted to accommodate a workload (UID: x) due to prioritization",
    }
    back = workload_view(with_status(conditions=[evicted]))
    assert back.state == "queued" and back.flavor is None
    assert (
        back.evicted
        == "Preempted: Preempted to accommodate a workload (UID: x) due to prioritization"
    )

    done = {"type": "Finished", "status": "True", "reason": "Succeeded", "message": "Job finished"}
    ended = workload_view(with_status(conditions=[reserved, done], admission=admission))
    assert (ended.state, ended.finished) == ("finished", "Succeeded: Job finished")

    inactive = copy.deepcopy(PENDING)
    inactive["spec"]["active"] = False
    assert workload_view(inactive).state == "finished"


def test_a_preempted_pod_says_when_and_for_whom() -> None:
    """A pod's Workload that Kueue preempted while it still holds its quota: the eviction's
    time, the preemptor's uid (from Kueue's message) and the pods' termination grace, from
    which the gateway dates its warning (gateway/kueue_engine.py)."""
    obj = copy.deepcopy(PENDING)
    obj["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "Pod", "name": "alice-k1", "uid": "p-1", "controller": True}
    ]
    obj["spec"]["podSets"][0]["template"]["spec"]["terminationGracePeriodSeconds"] = 45
    obj["status"] = {
        "conditions": [
            {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"},
            {
                "type": "Evicted",
                "status": "True",
                "reason": "Preempted",
                "lastTransitionTime": "2026-12-06T10:05:00Z",
                "message": "Preempted to accommodate a workload (UID: 9c1d, JobUID: 77aa) due "
                "to prioritization in the ClusterQueue; preemptor path: /vision; "
                "preemptee path: /vision",
            },
        ],
        "admission": {
            "clusterQueue": "vision",
            "podSetAssignments": [{"name": "main", "flavors": {"nvidia.com/gpu": "a100"}}],
        },
    }
    view = workload_view(obj)
    assert (view.state, view.owner, view.flavor) == ("admitted", "Pod alice-k1", "a100")
    assert (view.evicted_at, view.preemptor, view.grace) == (1796551500.0, "9c1d", 45.0)
    # No eviction: none of them; no grace in the pod spec: Kubernetes' 30 s.
    plain = workload_view(PENDING)
    assert (plain.evicted_at, plain.preemptor, plain.grace) == (0.0, "", 30.0)


def test_who_and_what_without_our_labels() -> None:
    bare = copy.deepcopy(PENDING)
    del bare["metadata"]["labels"]
    assert workload_view(bare).user == OUTSIDE
    pod = copy.deepcopy(bare)
    pod["metadata"]["ownerReferences"] = [{"kind": "Pod", "name": "k", "uid": "p-1"}]
    pod["metadata"]["annotations"] = {"gpuaas.jupyter.org/user": "dave"}
    seen = workload_view(pod)
    assert (seen.kind, seen.owner, seen.owner_uid, seen.user) == ("kernel", "Pod k", "p-1", "dave")
    # A kind that is none of ours (a label anyone may write) is not taken at its word.
    pod["metadata"]["labels"] = {"gpuaas.jupyter.org/kind": "x" * 40}
    assert workload_view(pod).kind == "kernel"


@pytest.mark.parametrize(
    ("reason", "message", "kind", "sentence"),
    [
        (
            "Pending",
            "couldn't assign flavors to pod set main: insufficient unused quota for "
            "nvidia.com/gpu in flavor a100, 1 more needed",
            "quota",
            "all of vision's a100 quota is in use: 1 more GPU must be freed first",
        ),
        (
            "Pending",
            "couldn't assign flavors to pod set main: insufficient quota for nvidia.com/gpu "
            "in flavor a100, previously considered podsets requests (0) + current podset "
            "request (9) > maximum capacity (4)",
            "quota",
            "this asks for more than vision may ever use at once",
        ),
        (
            "NoMatchingFlavor",
            "couldn't assign flavors to pod set main: flavor a100 doesn't match node affinity",
            "capacity",
            "no GPU flavor of this queue has nodes that fit it",
        ),
        ("Suspended", "", "quota", "the queue vision is stopped by an admin"),
        (
            "WaitingForPodsReady",
            "",
            "fifo",
            "waiting for the workloads admitted before it to start",
        ),
        ("", "", "fifo", "waiting for its turn in Kueue's queue"),
    ],
)
def test_kueues_reasons_in_words(reason: str, message: str, kind: str, sentence: str) -> None:
    assert waiting_words("vision", reason, message) == (kind, sentence)


@pytest.mark.parametrize(
    ("evicted", "words"),
    [
        (
            "Preempted: Preempted to accommodate a workload (UID: u, JobUID: j) due to "
            "prioritization in the ClusterQueue; preemptor path: /vision; preemptee path: /vision",
            "preempted by Kueue for a workload of higher priority in vision",
        ),
        (
            "Preempted: Preempted to accommodate a workload (UID: u, JobUID: j) due to "
            "reclamation within the cohort; preemptor path: /ai/nlp; preemptee path: /ai/vision",
            "preempted by Kueue because its cohort took back quota vision borrowed",
        ),
        (
            "PodsReadyTimeout: Exceeded the PodsReady timeout",
            "evicted by Kueue: its pods did not start in time",
        ),
        ("Odd: something", "evicted by Kueue (Odd)"),
    ],
)
def test_evictions_in_words(evicted: str, words: str) -> None:
    assert eviction_words("vision", evicted) == words


def test_kueue_labels() -> None:
    assert kueue_labels("") == {}
    assert kueue_labels("vision", user="alice", kind="kernel", priority_class="interactive") == {
        "kueue.x-k8s.io/queue-name": "vision",
        "kueue.x-k8s.io/priority-class": "interactive",
        "gpuaas.jupyter.org/kind": "kernel",
        "gpuaas.jupyter.org/user": "alice",
    }
    # Not a label value: the user stays in the annotation the builders always write.
    assert "gpuaas.jupyter.org/user" not in kueue_labels("vision", user="alice@example.org")


REQUEST = {"id": "r-1", "tenant": "vision", "gpus": 1, "grant": {"flavor": "a100", "node": "n"}}
FLAVORS = {"a100": {"node_selector": {"pool": "a100"}}}


def test_the_builders_label_for_kueue_only_in_kueue_mode() -> None:
    common = {"user": "alice", "command": ["python"], "image": "i", "request": REQUEST}
    job = job_manifest(job_id="r-1", cwd="/", flavors=FLAVORS, queue="vision", **common)
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "vision"
    assert job["metadata"]["labels"]["gpuaas.jupyter.org/kind"] == "job"
    # Kueue manages the Job; its pods are the Job's, in no queue of their own.
    assert "kueue.x-k8s.io/queue-name" not in job["spec"]["template"]["metadata"]["labels"]
    plain = job_manifest(job_id="r-1", cwd="/", flavors=FLAVORS, **common)
    assert "kueue.x-k8s.io/queue-name" not in plain["metadata"]["labels"]

    pod = kernel_pod_manifest(
        name="k", kernel_id="k1", flavors=FLAVORS, queue="vision", priority_class="p", **common
    )
    labels = pod["metadata"]["labels"]
    assert labels["kueue.x-k8s.io/queue-name"] == "vision"
    assert labels["kueue.x-k8s.io/priority-class"] == "p"
    assert labels["gpuaas.jupyter.org/kind"] == "kernel"
    plain_pod = kernel_pod_manifest(name="k", kernel_id="k1", flavors=FLAVORS, **common)
    assert "kueue.x-k8s.io/queue-name" not in plain_pod["metadata"]["labels"]
