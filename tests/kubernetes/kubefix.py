"""Constants of the Kubernetes tests (a module of its own: `conftest` is ambiguous when
tests/hub runs in the same session)."""

from __future__ import annotations

from typing import Any

TOKENS = {"alice": "alice-token-k8s-01", "bob": "bob-token-k8s-0002", "root": "root-token-k8s-03"}
TOKEN_FILE = {
    "tokens": {
        TOKENS["alice"]: {"user": "alice", "groups": ["vision"]},
        TOKENS["bob"]: {"user": "bob", "groups": ["vision"]},
        TOKENS["root"]: {"user": "root", "admin": True},
    }
}
# One a100 node of 2 GPUs and one t4 node of 1 (simulated at the gateway; the tests add
# KWOK Nodes of the same names to the real cluster).
QUOTAS: dict[str, Any] = {
    "flavors": {"a100": {"nodes": 1, "gpus_per_node": 2}, "t4": {"nodes": 1, "gpus_per_node": 1}},
    "tenants": {"vision": {"quota": {"a100": 2, "t4": 1}}},
    "policy": {"idle_timeout": 0, "reservation_ttl": 0},
}
DEVICES = "simulated:a100=1x2,t4=1x1"
# The spawners' flavors: the node pool labels and taints of the tests' KWOK Nodes.
FLAVORS = {
    "a100": {
        "display_name": "NVIDIA A100 80GB",
        "node_selector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    },
    "t4": {"resource": "nvidia.com/gpu", "node_selector": {"pool": "t4"}},
}


class Group:
    def __init__(self, name: str) -> None:
        self.name = name


class HubUser:
    """What a spawner uses of JupyterHub's User: name, groups, url, and a token minted
    for the request (here: the user's token in the gateway's token file, recorded in this
    user's own in-memory Hub database, as JupyterHub records the tokens it mints, so the
    spawner can find its id and revoke it)."""

    def __init__(self, name: str, groups: list[str]) -> None:
        from jupyterhub import orm

        self.name = name
        self.id = 1
        self.url = f"/user/{name}/"
        self.groups = [Group(g) for g in groups]
        self.db = orm.new_session_factory("sqlite://")()
        self.orm_user = orm.User(name=name)
        self.db.add(self.orm_user)
        self.db.commit()
        self.minted: list[str] = []

    def orm_spawner(self) -> Any:
        """A row of the Hub's spawners table (user_options, last_activity, server)."""
        from jupyterhub import orm

        row = orm.Spawner(name="", user=self.orm_user)
        self.db.add(row)
        self.db.commit()
        return row

    def new_api_token(self, **kw: Any) -> str:
        from jupyterhub import orm

        self.minted.append(kw.get("note", ""))
        token = TOKENS[self.name]
        if orm.APIToken.find(self.db, token) is None:  # revoked before: record it again
            # The row alone (APIToken.new also wants the Hub's roles), issued by the Hub's
            # own OAuth client as JupyterHub's tokens are (find() drops client-less ones).
            if self.db.query(orm.OAuthClient).filter_by(identifier="jupyterhub").first() is None:
                self.db.add(orm.OAuthClient(identifier="jupyterhub"))
            row = orm.APIToken(
                user=self.orm_user,
                client_id="jupyterhub",
                note=kw.get("note", ""),
                scopes=list(kw.get("scopes") or []),
                generated=False,
            )
            row.token = token
            self.db.add(row)
            self.db.commit()
        return token
