"""The W&B settings of the driver's environment, captured once and carried to every node.

On a real cluster every node was started with its own environment, and Ray
propagates none of ``WANDB_*`` to the Train controller or to actors. The
callback therefore captures them on the driver when it is built; the API key
travels inside the pickled callback (never in ``runtime_env``, which the Ray
dashboard shows) wrapped in :class:`Secret` so no repr or log line shows it.
"""

from __future__ import annotations

import netrc
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

# Settings of the driver's environment that apply on the controller and on every node.
CAPTURED_ENV_VARS = ("WANDB_BASE_URL", "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_MODE", "WANDB_DIR")


class Secret:
    """A string that never shows itself in ``repr``, ``str`` or f-strings."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __reduce__(self) -> tuple[type[Secret], tuple[str]]:
        return (Secret, (self._value,))


@dataclass(frozen=True)
class CapturedEnv:
    """What the driver knew about W&B when the callback was built."""

    base_url: str | None = None
    project: str | None = None
    entity: str | None = None
    mode: str | None = None
    dir: str | None = None
    api_key: Secret | None = None
    api_key_source: str | None = None  # "api_key", "api_key_file", "WANDB_API_KEY", "netrc"

    def __repr__(self) -> str:  # the dataclass repr would be fine too; say it plainly
        return (
            f"CapturedEnv(base_url={self.base_url!r}, project={self.project!r}, entity={self.entity!r}, "
            f"mode={self.mode!r}, dir={self.dir!r}, api_key={'***' if self.api_key else None}, "
            f"api_key_source={self.api_key_source!r})"
        )


def _netrc_key(base_url: str | None, netrc_path: str | None) -> str | None:
    """The password stored for the W&B host in the netrc file (what `wandb login` writes)."""
    if not base_url:
        return None
    host = urlparse(base_url).hostname
    path = netrc_path or os.environ.get("NETRC") or str(Path.home() / ".netrc")
    if not host or not os.path.isfile(path):
        return None
    try:
        auth = netrc.netrc(path).authenticators(host)
    except (netrc.NetrcParseError, OSError):
        return None
    return auth[2] if auth and auth[2] else None


def read_api_key_file(path: str) -> str:
    """The key in ``path`` (first non-empty line); ValueError when the file is unusable."""
    try:
        text = Path(path).expanduser().read_text()
    except OSError as e:
        raise ValueError(
            f"api_key_file={path!r} cannot be read ({e.strerror}); give a readable file holding the W&B API key"
        ) from None
    key = next((line.strip() for line in text.splitlines() if line.strip()), "")
    if not key:
        raise ValueError(f"api_key_file={path!r} is empty; it must hold the W&B API key on its first line")
    return key


def capture_env(
    environ: Mapping[str, str],
    *,
    api_key: str | None = None,
    api_key_file: str | None = None,
    default_base_url: str | None = None,
    netrc_path: str | None = None,
) -> CapturedEnv:
    """Capture the driver's W&B settings; the key from the first of the arguments, env, netrc."""
    base_url = environ.get("WANDB_BASE_URL") or None
    key: str | None = None
    source: str | None = None
    if api_key:
        key, source = api_key, "api_key"
    elif api_key_file:
        key, source = read_api_key_file(api_key_file), "api_key_file"
    elif environ.get("WANDB_API_KEY"):
        key, source = environ["WANDB_API_KEY"], "WANDB_API_KEY"
    else:
        found = _netrc_key(base_url or default_base_url, netrc_path)
        if found:
            key, source = found, "netrc"
    return CapturedEnv(
        base_url=base_url,
        project=environ.get("WANDB_PROJECT") or None,
        entity=environ.get("WANDB_ENTITY") or None,
        mode=environ.get("WANDB_MODE") or None,
        # Relative to the driver's working directory, not to the controller's or a node's.
        dir=os.path.abspath(environ["WANDB_DIR"]) if environ.get("WANDB_DIR") else None,
        api_key=Secret(key) if key else None,
        api_key_source=source,
    )
