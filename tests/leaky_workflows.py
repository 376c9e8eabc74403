"""Workflows that leak every planted secret (PLANTED), served by
``flowscope worker tests.leaky_workflows:ALL`` in the redaction tests."""

from __future__ import annotations

from typing import Any

from flowscope import START, NodeContext, Workflow, node

__all__ = ["ALL", "PLANTED", "SECRETS"]

#: (what a message holds, the secret part that must not survive): every credential shape
#: the one redactor must remove.
PLANTED = [
    ("key sk-live-4eC39HqLyjWDarjtT1zdp7dc rejected", "4eC39HqLyjWDarjtT1zdp7dc"),
    ("aws AKIAIOSFODNN7EXAMPLE denied", "IOSFODNN7EXAMPLE"),
    ("login password=hunter2plant failed", "hunter2plant"),
    ("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9abc", "eyJhbGciOiJIUzI1NiJ9abc"),
    ("cannot open /home/alice/secret-plans.txt", "alice"),
    ("connect postgresql://app:pgpw-plant@db.internal:5432/x", "pgpw-plant"),
    ('body {"password": "json-pw-plant", "user": "a"}', "json-pw-plant"),
    ("cfg {'api_key': 'repr-key-plant', 'n': 1}", "repr-key-plant"),
    ("env DB_PASSWORD=dbpw-plant set", "dbpw-plant"),
    ("env GITHUB_TOKEN=ghp_tokenplant123 set", "ghp_tokenplant123"),
    ("env PGPASSWORD=pgenv-plant set", "pgenv-plant"),
    ("env AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMIplant set", "wJalrXUtnFEMIplant"),
    ("oauth client_secret=cs-plant-9 refused", "cs-plant-9"),
    ("GET https://api.example.com/v1?access_token=qtok-plant&page=2", "qtok-plant"),
    ("header X-Api-Key: hdr-key-plant", "hdr-key-plant"),
    ("cannot read file:///home/bob/fileurl-plant.txt", "fileurl-plant"),
    ("sqlite:////srv/app/sqliteurl-plant.db is locked", "sqliteurl-plant"),
    ("copy at C:/Users/carol/winfwd-plant.txt", "winfwd-plant"),
    ("config path:/etc/app/afteracolon-plant.toml", "afteracolon-plant"),
    ("read //home/alice/dslash-plant.key failed", "dslash-plant"),
    ("clone https://ghp_urluserplant@github.com/org/repo", "ghp_urluserplant"),
    ("ssh passphrase=phrase-plant refused", "phrase-plant"),
    ("login credentials=cred-plant refused", "cred-plant"),
    ("proxy auth=auth-plant refused", "auth-plant"),
    ("header Cookie: sid-cookie-plant", "sid-cookie-plant"),
    ("cannot open /home/alice/My Secrets/spaced-plant.txt", "spaced-plant"),
    ("copy at C:\\Program Files\\App\\winspace-plant.txt", "winspace-plant"),
]
#: Every planted message in one.
SECRETS = " | ".join(text for text, _secret in PLANTED)


class _Hostile(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no")


@node
async def leak(ctx: NodeContext, x: Any) -> Any:
    raise ValueError(SECRETS)


@node
async def hostile(ctx: NodeContext, x: Any) -> Any:
    raise _Hostile()


@node
async def fetch(ctx: NodeContext, x: Any) -> Any:
    return await ctx.await_job(lambda job: None, payload=x)


ALL = [
    Workflow("leaking", edges=[(START, leak)]),
    Workflow("broken_str", edges=[(START, hostile)]),
    Workflow("leaky_job", edges=[(START, fetch)]),
]
