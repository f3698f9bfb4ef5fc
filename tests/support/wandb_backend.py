"""A W&B-compatible test backend that the real wandb client talks to over HTTP.

It answers the GraphQL operations, the file_stream protocol and the uploads that
wandb-core needs for a run (creating and resuming it, joining it as a further
shared-mode writer, logging, artifacts, finishing it) and records, per run,
what each writer sent: history rows, system-metric events with their labels,
the merged summary, config, uploaded files, the client id of each writer, and
every ``complete`` with its exit code.

Shared mode has several writers per run, and each counts its file_stream
offsets from 0, so lines are stored per ``(client id, offset)``: a request the
client retries after a failure overwrites the same slots instead of adding rows.

Requests it has no answer for (a GraphQL operation without a handler, a path it
does not serve) are listed in ``backend.unhandled``.

Faults can be injected (``backend.faults``) to answer with an HTTP status,
delay, or drop the connection, for tests of outages.

Given an ``ssl.SSLContext`` (``tls=``) it serves HTTPS instead, as W&B's cloud does: its
``base_url`` and the upload URLs it hands out are then ``https://``; everything else is the same.
"""

from __future__ import annotations

import base64
import json
import re
import ssl
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

DEFAULT_ENTITY = "test-entity"
_LABEL_RE = re.compile(r"^system\.(?P<metric>.+)/l:(?P<label>[^/]+)$")
_OP_RE = re.compile(r"\b(?:query|mutation)\s+(\w+)")
# An anonymous operation (``query { viewer { id } }``, which wandb <= 0.28 sends to check a key
# before logging an artifact): named after its first field.
_ANON_OP_RE = re.compile(r"^\s*(?:query\s*)?\{\s*(\w+)")
_ANON_OPS = {"viewer": "Viewer"}
_FILE_STREAM_RE = re.compile(r"^/files/(?P<entity>[^/]+)/(?P<project>[^/]+)/(?P<run>[^/]+)/file_stream$")
_UPLOAD_RE = re.compile(r"^/upload/(?P<entity>[^/]+)/(?P<project>[^/]+)/(?P<run>[^/]+)/(?P<name>.+)$")


@dataclass
class Complete:
    client_id: str
    exit_code: int | None


@dataclass
class ArtifactRecord:
    """One artifact a run logged: its files (uploads) and its manifest (references too)."""

    id: str
    name: str
    type: str
    aliases: list[str]
    digest: str
    run_id: str | None
    entity: str = "test-entity"
    project: str = "uncategorized"
    version: int = 0  # the index among the artifacts of its name (v0, v1, ...)
    files: dict[str, bytes] = field(default_factory=dict)
    manifest: dict[str, Any] = field(default_factory=dict)
    committed: bool = False

    @property
    def references(self) -> dict[str, str]:
        """entry path -> reference URI, for entries that point at remote storage."""
        entries = self.manifest.get("contents") or {}
        return {path: e["ref"] for path, e in entries.items() if e.get("ref")}


_LEGACY_LINE = re.compile(
    r"^(?P<error>ERROR )?(?P<ts>\d{4}-\d\d-\d\dT[\d:.]+) (?:\[(?P<label>[^\]]*)\] )?(?P<text>.*)$", re.S
)


@dataclass(frozen=True)
class ConsoleLogLine:
    """One console line as the run stores it: the writer's label, ``"error"`` for a line wandb
    captured from stderr, and the text. wandb-core sends ``<ts> [label] text`` (``ERROR `` first for
    stderr), or JSON ``{"level", "ts", "label", "content"}`` where the server advertises
    ``STRUCTURED_CONSOLE_LOGS`` (``core/internal/runconsolelogs/runlogschangemodel.go``)."""

    label: str | None
    level: str | None
    text: str
    structured: bool

    @classmethod
    def parse(cls, line: str) -> ConsoleLogLine:
        if line.startswith("{"):
            data = json.loads(line)
            return cls(data.get("label"), data.get("level"), data["content"], True)
        m = _LEGACY_LINE.match(line)
        if m is None:
            return cls(None, None, line, False)
        return cls(m["label"], "error" if m["error"] else None, m["text"], False)


@dataclass
class RunRecord:
    """Everything the backend received for one run (entity, project, id)."""

    entity: str
    project: str
    run_id: str
    display_name: str | None = None
    group: str | None = None
    job_type: str | None = None
    tags: list[str] = field(default_factory=list)
    notes: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    wandb_config_by_client: dict[str, dict[str, Any]] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    files: dict[str, bytes] = field(default_factory=dict)
    completes: list[Complete] = field(default_factory=list)
    client_ids: set[str] = field(default_factory=set)
    upserts: int = 0
    upsert_times: list[tuple[float, str | None]] = field(default_factory=list)  # (time.time(), client id)
    api_keys: dict[str, set[str]] = field(default_factory=dict)  # client id -> keys it authenticated with
    hosts: dict[str, str] = field(default_factory=dict)  # client id -> its writer's hostname (UpsertBucket's host)
    artifacts: list[ArtifactRecord] = field(default_factory=list)
    alerts: list[dict[str, Any]] = field(default_factory=list)  # {title, text, severity, wait, client}
    # (client id, file name) -> {offset: parsed line}
    _lines: dict[tuple[str, str], dict[int, Any]] = field(default_factory=dict)

    def _file_lines(self, name: str) -> list[tuple[str, Any]]:
        out = []
        for (client, fname), by_offset in self._lines.items():
            if fname == name:
                out.extend((client, by_offset[o]) for o in sorted(by_offset))
        return out

    @property
    def history(self) -> list[dict[str, Any]]:
        """History rows, in the order each writer sent them, writers one after another."""
        return [row for _, row in self._file_lines("wandb-history.jsonl")]

    def history_by_client(self) -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = {}
        for client, row in self._file_lines("wandb-history.jsonl"):
            out.setdefault(client, []).append(row)
        return out

    @property
    def events(self) -> list[dict[str, Any]]:
        """System-metric rows (wandb-events.jsonl) from every writer."""
        return [row for _, row in self._file_lines("wandb-events.jsonl")]

    @property
    def output(self) -> list[str]:
        return [line for _, line in self._file_lines("output.log")]

    def console(self) -> list[ConsoleLogLine]:
        """The run's console lines (``output.log`` on the file_stream) from every writer, each
        writer's in order, parsed from either format wandb-core sends (see ``ConsoleLogLine``)."""
        return [ConsoleLogLine.parse(line) for line in self.output]

    def system_metrics(self) -> dict[str, dict[str, list[Any]]]:
        """label -> metric name -> values, from the labelled system-metric keys."""
        out: dict[str, dict[str, list[Any]]] = {}
        for row in self.events:
            for key, value in row.items():
                m = _LABEL_RE.match(key)
                if m:
                    out.setdefault(m["label"], {}).setdefault(m["metric"], []).append(value)
        return out

    @property
    def labels(self) -> set[str]:
        return set(self.system_metrics())

    def labels_by_client(self) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for client, row in self._file_lines("wandb-events.jsonl"):
            for key in row:
                m = _LABEL_RE.match(key)
                if m:
                    out.setdefault(client, set()).add(m["label"])
        return out

    @property
    def models(self) -> list[ArtifactRecord]:
        """The ``model`` artifacts (checkpoints), without the ``run_table`` ones W&B makes of tables."""
        return [a for a in self.artifacts if a.type == "model"]

    def tables(self, key: str) -> list[list[dict[str, Any]]]:
        """Every ``wandb.Table`` logged under ``key``, in order, each as a list of row dicts."""
        out = []
        for row in self.history:
            ref = row.get(key)
            if isinstance(ref, dict) and ref.get("_type") == "table-file" and ref.get("path") in self.files:
                table = json.loads(self.files[ref["path"]])
                out.append([dict(zip(table["columns"], data, strict=True)) for data in table["data"]])
        return out

    @property
    def exit_codes(self) -> list[int | None]:
        return [c.exit_code for c in self.completes]


class Faults:
    """Faults to inject: answer ``status``, wait ``delay_s`` or drop the connection.

    A fault applies to requests whose path contains ``path_contains`` (any path
    when None) until ``until`` (time.monotonic) or for ``count`` requests.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rules: list[dict[str, Any]] = []

    def add(
        self,
        *,
        status: int | None = None,
        delay_s: float = 0.0,
        drop: bool = False,
        path_contains: str | None = None,
        duration_s: float | None = None,
        count: int | None = None,
        joiners_only: bool = False,
        operation: str | None = None,
    ) -> None:
        """Add a fault; ``joiners_only`` limits it to writers joining a run another writer created,
        ``operation`` to one GraphQL operation (``CreateArtifactFiles``: before a checkpoint's files are read)."""
        until = time.monotonic() + duration_s if duration_s is not None else None
        with self._lock:
            self._rules.append(
                {
                    "status": status,
                    "delay_s": delay_s,
                    "drop": drop,
                    "path": path_contains,
                    "until": until,
                    "count": count,
                    "joiners_only": joiners_only,
                    "operation": operation,
                }
            )

    def clear(self) -> None:
        with self._lock:
            self._rules.clear()

    def take(self, path: str, joiner: bool = False, operation: str | None = None) -> dict[str, Any] | None:
        now = time.monotonic()
        with self._lock:
            self._rules = [
                r
                for r in self._rules
                if (r["until"] is None or r["until"] > now) and (r["count"] is None or r["count"] > 0)
            ]
            for rule in self._rules:
                if (rule["joiners_only"] and not joiner) or rule["operation"] not in (None, operation):
                    continue
                if rule["path"] is None or rule["path"] in path:
                    if rule["count"] is not None:
                        rule["count"] -= 1
                    return dict(rule)
        return None


class WandbTestBackend:
    """A local W&B backend on 127.0.0.1; use as a context manager or start()/stop().

    ``tls``: serve HTTPS with this server context (see ``tests/support/tls.py``)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, tls: ssl.SSLContext | None = None) -> None:
        self._lock = threading.RLock()
        self.runs: dict[tuple[str, str, str], RunRecord] = {}
        self.artifacts: dict[str, ArtifactRecord] = {}  # by artifact id
        self._manifests: dict[str, str] = {}  # manifest id -> artifact id
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, graphql operation)
        # Requests answered without a handler: ("graphql", operation or query) or (method, path).
        self.unhandled: list[tuple[str, str]] = []
        self.faults = Faults()
        # Server features it advertises (ServerFeaturesQuery), e.g. "STRUCTURED_CONSOLE_LOGS": each
        # run's wandb-core asks once, so set it before the run starts.
        self.features: set[str] = set()
        backend = self

        class Handler(_Handler):
            owner = backend

        self._server = _QuietServer((host, port), Handler)
        self._server.daemon_threads = True
        self._server.tls = tls
        self._thread: threading.Thread | None = None

    # lifecycle -------------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"{'https' if self._server.tls else 'http'}://{host}:{port}"

    def start(self) -> WandbTestBackend:
        self._thread = threading.Thread(target=self._server.serve_forever, name="wandb-test-backend", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> WandbTestBackend:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # queries ---------------------------------------------------------------------------------
    def run(self, run_id: str) -> RunRecord:
        """The one run with this id, whatever its entity and project."""
        with self._lock:
            found = [r for (_, _, rid), r in self.runs.items() if rid == run_id]
        if len(found) != 1:
            raise KeyError(f"expected one run with id {run_id!r}, found {len(found)}; runs: {sorted(self.runs)}")
        return found[0]

    def runs_in(self, project: str) -> list[RunRecord]:
        with self._lock:
            return [r for (_, p, _), r in self.runs.items() if p == project]

    def is_joiner(self, path: str, body: bytes, headers: Any) -> bool:
        """Is this a writer's first UpsertBucket on a run that another writer created?"""
        if not path.startswith("/graphql"):
            return False
        try:
            payload = json.loads(body or b"{}")
        except ValueError:
            return False
        if "UpsertBucket" not in (payload.get("query") or ""):
            return False
        v = payload.get("variables") or {}
        client_id = headers.get("X-WANDB-CLIENT-ID")
        with self._lock:
            run = self._find_run(v.get("entity"), v.get("project"), v.get("name") or v.get("id") or "")
            return run is not None and client_id not in run.client_ids

    # recording (called from handler threads) -------------------------------------------------
    def _get_run(self, entity: str | None, project: str | None, run_id: str) -> RunRecord:
        key = (entity or DEFAULT_ENTITY, project or "uncategorized", run_id)
        if key not in self.runs:
            self.runs[key] = RunRecord(entity=key[0], project=key[1], run_id=run_id)
        return self.runs[key]

    def _find_run(self, entity: str | None, project: str | None, run_id: str) -> RunRecord | None:
        return self.runs.get((entity or DEFAULT_ENTITY, project or "uncategorized", run_id))

    def graphql(self, body: dict[str, Any], client_id: str | None) -> dict[str, Any]:
        op = operation_of(body)
        variables = body.get("variables") or {}
        with self._lock:
            self.requests[-1] = (self.requests[-1][0], self.requests[-1][1], op)
            handler = {
                "UpsertBucket": self._upsert_bucket,
                "RunResumeStatus": self._run_resume_status,
                "ServerFeaturesQuery": self._server_features,
                "Viewer": self._viewer,
                "CreateRunFiles": self._create_run_files,
                "CreateArtifact": self._create_artifact,
                "CreateArtifactManifest": self._create_artifact_manifest,
                "UpdateArtifactManifest": self._update_artifact_manifest,
                "CreateArtifactFiles": self._create_artifact_files,
                "CommitArtifact": self._commit_artifact,
                "ArtifactByID": self._artifact_by_id,
                "FetchArtifactManifest": self._fetch_artifact_manifest,
                "ArtifactType": lambda v, c: {"data": {"project": None}},
                "NotifyScriptableRunAlert": self._alert,
            }.get(op or "")
            if handler is None:
                self.unhandled.append(("graphql", op or (body.get("query") or "")[:200]))
                return {"data": {}}
            result: dict[str, Any] = handler(variables, client_id)
            return result

    def _bucket(self, run: RunRecord) -> dict[str, Any]:
        return {
            "id": f"bucket-{run.run_id}",
            "name": run.run_id,
            "displayName": run.display_name or run.run_id,
            "description": run.notes,
            "config": json.dumps(run.config),
            "sweepName": None,
            "project": {
                "id": f"project-{run.project}",
                "name": run.project,
                "entity": {"id": f"entity-{run.entity}", "name": run.entity},
            },
            "historyLineCount": len(run.history),
        }

    def _upsert_bucket(self, v: dict[str, Any], client_id: str | None) -> dict[str, Any]:
        run_id = v.get("name") or v.get("id") or "unnamed"
        existed = self._find_run(v.get("entity"), v.get("project"), run_id) is not None
        run = self._get_run(v.get("entity"), v.get("project"), run_id)
        run.upserts += 1
        run.upsert_times.append((time.time(), client_id))
        if client_id:
            run.client_ids.add(client_id)
        for var, attr in (
            ("displayName", "display_name"),
            ("groupName", "group"),
            ("jobType", "job_type"),
            ("notes", "notes"),
        ):
            if v.get(var) is not None:
                setattr(run, attr, v[var])
        if v.get("tags") is not None:
            run.tags = list(v["tags"])
        if v.get("host") and client_id:
            run.hosts[client_id] = v["host"]
        if v.get("config"):
            config = json.loads(v["config"])
            # Each writer sends its own whole config: merge user keys, keep _wandb per writer.
            for key, value in config.items():
                if key == "_wandb":
                    run.wandb_config_by_client[client_id or "?"] = value.get("value", value)
                else:
                    run.config[key] = value
        if v.get("summaryMetrics"):
            run.summary.update(json.loads(v["summaryMetrics"]))
        return {"data": {"upsertBucket": {"bucket": self._bucket(run), "inserted": not existed}}}

    def _run_resume_status(self, v: dict[str, Any], client_id: str | None) -> dict[str, Any]:
        run = self._find_run(v.get("entity"), v.get("project"), v.get("name") or "")
        bucket = None
        if run is not None:
            history = run.history
            bucket = {
                **self._bucket(run),
                "summaryMetrics": json.dumps(run.summary),
                "logLineCount": len(run.output),
                "eventsLineCount": len(run.events),
                "historyTail": json.dumps([json.dumps(r) for r in history[-1:]]),
                "eventsTail": json.dumps([]),
                "tags": run.tags,
                "notes": run.notes,
                "wandbConfig": json.dumps({"t": next(iter(run.wandb_config_by_client.values()), {}).get("t", {})}),
            }
        project = v.get("project") or "uncategorized"
        entity = v.get("entity") or DEFAULT_ENTITY
        return {
            "data": {
                "model": {
                    "id": f"project-{project}",
                    "name": project,
                    "entity": {"id": f"entity-{entity}", "name": entity},
                    "bucket": bucket,
                }
            }
        }

    def _server_features(self, v: dict[str, Any], client_id: str | None) -> dict[str, Any]:
        features = [{"name": name, "isEnabled": True} for name in sorted(self.features)]
        return {"data": {"serverInfo": {"features": features}}}

    def _viewer(self, v: dict[str, Any], client_id: str | None) -> dict[str, Any]:
        return {
            "data": {
                "viewer": {
                    "id": "user-1",
                    "entity": DEFAULT_ENTITY,
                    "username": "tester",
                    "flags": "{}",
                    "teams": {"edges": []},
                }
            }
        }

    def _create_run_files(self, v: dict[str, Any], client_id: str | None) -> dict[str, Any]:
        entity, project, run_id = v.get("entity"), v.get("project"), v.get("run")
        files = [
            {"name": name, "uploadUrl": f"{self.base_url}/upload/{entity}/{project}/{run_id}/{name}"}
            for name in v.get("files") or []
        ]
        return {"data": {"createRunFiles": {"runID": f"bucket-{run_id}", "uploadHeaders": [], "files": files}}}

    def _alert(self, v: dict[str, Any], client_id: str | None) -> dict[str, Any]:
        run = self._get_run(v.get("entityName"), v.get("projectName"), str(v.get("runName")))
        run.alerts.append(
            {
                "title": v.get("title"),
                "text": v.get("text"),
                "severity": v.get("severity"),
                "wait": v.get("waitDuration"),  # as wandb sends it (ms)
                "client": client_id,
                "received": time.time(),
            }
        )
        return {"data": {"notifyScriptableRunAlert": {"success": True}}}

    # artifacts -------------------------------------------------------------------------------
    def _create_artifact(self, v: dict[str, Any], client_id: str | None) -> dict[str, Any]:
        i = v.get("input") or v
        # As W&B's: base64 of "Artifact:<n>" (wandb decodes it for a table's reference URL); six
        # digits keep "/" and "+" out of it, so it can stand in a URL path.
        artifact_id = base64.b64encode(f"Artifact:{len(self.artifacts) + 1:06d}".encode()).decode()
        names = i.get("artifactCollectionNames") or [i.get("artifactCollectionName") or "artifact"]
        record = ArtifactRecord(
            id=artifact_id,
            name=names[0],
            type=i.get("artifactTypeName") or "",
            aliases=[a.get("alias") if isinstance(a, dict) else a for a in i.get("aliases") or []],
            digest=i.get("digest") or "",
            run_id=i.get("runName"),
            entity=i.get("entityName") or DEFAULT_ENTITY,
            project=i.get("projectName") or "uncategorized",
            version=sum(1 for a in self.artifacts.values() if a.name == names[0]),
        )
        self.artifacts[artifact_id] = record
        run = self._find_run(i.get("entityName"), i.get("projectName"), i.get("runName") or "")
        if run is not None:
            run.artifacts.append(record)
        payload = {"id": artifact_id, "state": "PENDING", "artifactSequence": {"latestArtifact": None}}
        return {"data": {"createArtifact": {"artifact": payload}}}

    def _manifest_payload(self, manifest_id: str) -> dict[str, Any]:
        return {
            "id": manifest_id,
            "file": {
                "id": f"file-{manifest_id}",
                "uploadUrl": f"{self.base_url}/artifact-manifest/{manifest_id}",
                "uploadHeaders": [],
            },
        }

    def _create_artifact_manifest(self, v: dict[str, Any], client_id: str | None) -> dict[str, Any]:
        manifest_id = f"manifest-{v.get('artifactID')}"
        self._manifests[manifest_id] = v.get("artifactID") or ""
        return {"data": {"createArtifactManifest": {"artifactManifest": self._manifest_payload(manifest_id)}}}

    def _update_artifact_manifest(self, v: dict[str, Any], client_id: str | None) -> dict[str, Any]:
        manifest_id = v.get("artifactManifestID") or ""
        return {"data": {"updateArtifactManifest": {"artifactManifest": self._manifest_payload(manifest_id)}}}

    def _create_artifact_files(self, v: dict[str, Any], client_id: str | None) -> dict[str, Any]:
        edges = []
        for f in (v.get("input") or v).get("artifactFiles") or []:
            artifact_id = f.get("artifactID")
            url = f"{self.base_url}/artifact-file/{artifact_id}/{f.get('name')}"
            node = {
                "storagePath": f"{artifact_id}/{f.get('name')}",
                "uploadUrl": url,
                "uploadHeaders": [],
                "uploadMultipartUrls": None,
                "artifact": {"id": artifact_id},
            }
            edges.append({"node": node})
        return {"data": {"createArtifactFiles": {"files": {"edges": edges}}}}

    def _commit_artifact(self, v: dict[str, Any], client_id: str | None) -> dict[str, Any]:
        record = self.artifacts.get(v.get("artifactID") or "")
        if record is not None:
            record.committed = True
        return {
            "data": {
                "commitArtifact": {"artifact": {"id": v.get("artifactID"), "digest": record.digest if record else ""}}
            }
        }

    def _artifact_by_id(self, v: dict[str, Any], client_id: str | None) -> dict[str, Any]:
        """What wandb 0.28 and 0.29 ask of an artifact they just saved (a ``wandb.Table`` logged
        again under its key refers to the artifact of the previous one), and what ``Artifact.wait()``
        asks once the upload is committed."""
        record = self.artifacts.get(v.get("id") or "")
        if record is None:
            return {"data": {"artifact": None}}
        project_id = base64.b64encode(f"Project:{record.entity}/{record.project}".encode()).decode()
        entity = {"name": record.entity}
        project = {"id": project_id, "internalId": project_id, "name": record.project, "entity": entity}
        return {
            "data": {
                "artifact": {
                    "__typename": "Artifact",
                    "id": record.id,
                    "artifactSequence": {"__typename": "ArtifactSequence", "name": record.name, "project": project},
                    "versionIndex": record.version,
                    "artifactType": {"name": record.type},
                    "description": None,
                    "metadata": "{}",
                    "ttlDurationSeconds": -1,
                    "ttlIsInherited": True,
                    "tags": [],
                    "historyStep": None,
                    "state": "COMMITTED" if record.committed else "PENDING",
                    "size": sum(len(b) for b in record.files.values()),
                    "digest": record.digest,
                    "commitHash": None,
                    "fileCount": len(record.files),
                    "createdAt": "2026-01-01T00:00:00",
                    "updatedAt": None,
                    "aliases": [
                        {
                            "__typename": "ArtifactAlias",
                            "id": f"{record.id}-{alias}",
                            "alias": alias,
                            "artifactCollection": {
                                "__typename": "ArtifactSequence",
                                "name": record.name,
                                "project": project,
                            },
                        }
                        for alias in record.aliases
                    ],
                }
            }
        }

    def _fetch_artifact_manifest(self, v: dict[str, Any], client_id: str | None) -> dict[str, Any]:
        """Where wandb 0.28 and 0.29 download the manifest of an artifact they just saved."""
        artifact_id = v.get("id") or ""
        if artifact_id not in self.artifacts:
            return {"data": {"artifact": None}}
        url = f"{self.base_url}/artifact-manifest-of/{artifact_id}"
        return {"data": {"artifact": {"currentManifest": {"file": {"directUrl": url}}}}}

    def artifact_manifest(self, path: str) -> dict[str, Any] | None:
        """The manifest a ``GET /artifact-manifest-of/<artifact id>`` asks for (None: no such artifact)."""
        if not path.startswith("/artifact-manifest-of/"):
            return None
        with self._lock:
            record = self.artifacts.get(path.split("/", 2)[2])
            return None if record is None else record.manifest

    def artifact_upload(self, path: str, data: bytes) -> bool:
        with self._lock:
            if path.startswith("/artifact-manifest/"):
                artifact_id = self._manifests.get(path.split("/", 2)[2], "")
                if artifact_id in self.artifacts:
                    self.artifacts[artifact_id].manifest = json.loads(data or b"{}")
                    return True
            elif path.startswith("/artifact-file/"):
                _, _, artifact_id, name = path.split("/", 3)
                if artifact_id in self.artifacts:
                    self.artifacts[artifact_id].files[name] = data
                    return True
        return False

    def file_stream(self, entity: str, project: str, run_id: str, body: dict[str, Any], client_id: str) -> None:
        with self._lock:
            run = self._get_run(entity, project, run_id)
            run.client_ids.add(client_id)
            for name, chunk in (body.get("files") or {}).items():
                offset = int(chunk.get("offset", 0))
                content = chunk.get("content") or []
                if name == "wandb-summary.json":
                    for line in content:
                        run.summary.update(json.loads(line))
                    continue
                slots = run._lines.setdefault((client_id, name), {})
                for i, line in enumerate(content):
                    slots[offset + i] = json.loads(line) if name.endswith(".jsonl") else line
            if body.get("complete"):
                run.completes.append(Complete(client_id=client_id, exit_code=body.get("exitcode")))

    def record_key(self, entity: str, project: str, run_id: str, client_id: str, key: str | None) -> None:
        with self._lock:
            run = self._get_run(entity, project, run_id)
            if key is not None:
                run.api_keys.setdefault(client_id, set()).add(key)

    def upload(self, entity: str, project: str, run_id: str, name: str, data: bytes) -> None:
        with self._lock:
            self._get_run(entity, project, run_id).files[name] = data


def operation_of(body: dict[str, Any]) -> str | None:
    """The name of a GraphQL request's operation (None: none found)."""
    query = body.get("query") or ""
    op = body.get("operationName")
    if not op:
        m = _OP_RE.search(query)
        op = m.group(1) if m else None
    if not op:
        m = _ANON_OP_RE.match(query)
        op = _ANON_OPS.get(m.group(1)) if m else None
    return op


class _QuietServer(ThreadingHTTPServer):
    tls: ssl.SSLContext | None = None

    def get_request(self) -> tuple[Any, Any]:
        sock, address = super().get_request()
        if self.tls is not None:  # the handshake on the request's own thread, not the accepting one
            sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, address

    def finish_request(self, request: Any, client_address: Any) -> None:
        if self.tls is not None:
            try:
                request.settimeout(30)
                request.do_handshake()
                request.settimeout(None)
            except (ssl.SSLError, OSError):
                return  # a client that does not trust the certificate, or went away
        super().finish_request(request, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients that close keep-alive connections at exit are normal here.
        pass


class _Handler(BaseHTTPRequestHandler):
    owner: WandbTestBackend
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet by default
        pass

    def _read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _reply(self, status: int, payload: Any = None) -> None:
        data = json.dumps(payload if payload is not None else {}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _api_key(self) -> str | None:
        """The key of HTTP basic auth (wandb sends user ``api``, password = the key)."""
        auth = self.headers.get("Authorization") or ""
        if not auth.startswith("Basic "):
            return None
        try:
            return base64.b64decode(auth[6:]).decode().split(":", 1)[1]
        except (ValueError, IndexError):
            return None

    def _fault(self, body: bytes = b"") -> bool:
        """Apply an injected fault; True when the request has been answered or dropped."""
        operation = None
        if body and self.path.startswith("/graphql"):
            try:
                operation = operation_of(json.loads(body))
            except ValueError:
                pass
        joiner = self.owner.is_joiner(self.path, body, self.headers)
        rule = self.owner.faults.take(self.path, joiner=joiner, operation=operation)
        if rule is None:
            return False
        if rule["delay_s"]:
            time.sleep(rule["delay_s"])
        if rule["drop"]:
            self.close_connection = True
            self.connection.close()
            return True
        if rule["status"]:
            self._reply(rule["status"], {"error": "injected fault"})
            return True
        return False

    def _not_found(self, method: str) -> None:
        with self.owner._lock:
            self.owner.unhandled.append((method, self.path))
        self._reply(404, {"error": f"not found: {self.path}"})

    def do_POST(self) -> None:
        body = self._read_body()
        with self.owner._lock:
            self.owner.requests.append(("POST", self.path, None))
        if self._fault(body):
            return
        path = self.path.split("?", 1)[0]
        if path == "/graphql":
            client_id = self.headers.get("X-WANDB-CLIENT-ID")
            self._reply(200, self.owner.graphql(json.loads(body or b"{}"), client_id))
            return
        m = _FILE_STREAM_RE.match(path)
        if m:
            client_id = self.headers.get("X-WANDB-ASYNC-CLIENT-ID") or "sync-client"
            self.owner.file_stream(m["entity"], m["project"], m["run"], json.loads(body or b"{}"), client_id)
            self.owner.record_key(m["entity"], m["project"], m["run"], client_id, self._api_key())
            self._reply(200, {"exitcode": None, "limits": {}})
            return
        self._not_found("POST")

    def do_PUT(self) -> None:
        body = self._read_body()
        with self.owner._lock:
            self.owner.requests.append(("PUT", self.path, None))
        if self._fault():
            return
        path = self.path.split("?", 1)[0]
        if self.owner.artifact_upload(path, body):
            self._reply(200)
            return
        m = _UPLOAD_RE.match(path)
        if m:
            self.owner.upload(m["entity"], m["project"], m["run"], m["name"], body)
            self._reply(200)
            return
        self._not_found(self.command)

    def do_GET(self) -> None:
        with self.owner._lock:
            self.owner.requests.append(("GET", self.path, None))
        manifest = self.owner.artifact_manifest(self.path.split("?", 1)[0])
        if manifest is not None:
            self._reply(200, manifest)
            return
        self._not_found(self.command)
