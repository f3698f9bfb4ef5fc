"""Secrets in what a rank prints or raises, masked before the text leaves its node (pure).

A train function prints what it holds: an environment dump, a presigned URL, a request's headers,
a config with a token. The ranks' console goes into the run (its Logs tab, readable by everyone the
project is shared with), so every line the node's tailer hands on goes through :func:`mask` first,
live lines and last lines alike. What is masked, each by one rule of :data:`RULES`:

- **W&B API keys**: 40 hex digits (the classic key; an on-prem ``local-<40 hex>`` keeps its
  ``local-``), ``wandb_v1_...`` keys, and JWTs (``eyJ...``: wandb 0.31 takes them as keys too,
  ``wandb.sdk.lib.wbauth.validation``);
- **cloud keys**: AWS access key ids (``AKIA``/``ASIA``... and 16 more), and the value of any
  ``name=value`` / ``name: value`` / ``"name": "value"`` whose name says secret
  (``aws_secret_access_key``, ``aws_session_token``, ``SecretAccessKey``, GCP's ``private_key``,
  Azure's ``AccountKey``/``SharedAccessKey``, ``password``, ``api_key``, ``access_token``, ...);
- **bearer tokens** (``Authorization: Bearer ...``, ``Basic ...``, ``Bearer <token>`` anywhere);
- **URL signatures**: the values of ``X-Amz-Signature``, ``X-Amz-Credential``,
  ``X-Amz-Security-Token``, ``X-Goog-Signature``, ``X-Goog-Credential``, ``sig``, ``Signature``,
  ``token``, ``access_token``, ``key`` ... in a query string (a presigned S3/GCS URL, an Azure SAS);
- **tokens of known shapes**: Hugging Face ``hf_...``, GitHub ``ghp_``/``gho_``/``ghu_``/``ghs_``/
  ``ghr_`` and ``github_pat_...``, Google API keys ``AIza...``, OpenAI/Anthropic ``sk-...``;
- the token a cut line ends in (``[... N more bytes]``, see ``lines``): a secret cut short no
  longer has its shape.

A masked secret keeps a short prefix that is no secret where it tells a reader what it was
(``AKIA***``, ``hf_***``, ``Bearer ***``, ``X-Amz-Signature=***``). A 40-hex word right after
``commit`` (git's ``commit <sha>``, pip's ``... to commit <sha>``) is left as it is: it is a commit
id in every log that prints one, and a W&B key printed there is improbable; any other 40-hex word
is masked, a SHA-1 digest among them, since a W&B key has exactly that shape.

Cost: a line with nothing to mask (nearly all of them) costs a few regular-expression scans, each
skipped when the line lacks the characters its rule needs (``bench/console_cost.py`` gives the
figure in lines a second).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import NamedTuple

MASK = "***"

# Names whose value is a secret, matched as a whole name or its last parts (``_``, ``-`` and ``.``
# separate parts, case aside): ``aws_secret_access_key``, ``X-Api-Key``, ``db.password`` are;
# ``max_tokens``, ``pad_token``, ``valid_token`` are not.
SECRET_NAMES = frozenset(
    """
    secret_access_key secretaccesskey session_token sessiontoken security_token private_key
    private_key_id client_secret secret secret_key accountkey account_key sharedaccesskey
    shared_access_key sharedaccesssignature password passwd api_key apikey api_token auth_token
    access_token refresh_token id_token bearer_token oauth_token hf_token hub_token github_token
    gh_token sas_token connection_string connectionstring
    """.split()
)
WHOLE_NAMES = frozenset({"token", "sig"})  # secret as a whole name only (``pad_token`` is none)
# A line may hold such a name only if it holds one of these (lower case).
_NAME_NEEDS = ("key", "token", "secret", "passw", "sig", "connection")
_NAME_VALUE = re.compile(
    r"""(?x)
    (?<![\w.-])(["']?)([A-Za-z][\w.-]*)     # a name, maybe quoted
    (["']?\s*[=:]\s*)                        # then = or :
    ("[^"]*"|'[^']*'|[^\s"',;&})\]]+)       # its value: quoted, or up to a separator
    """
)
# Query-string parameters whose value is a secret (a presigned URL, a SAS, a token in a link).
_QUERY = re.compile(
    r"(?i)([?&;](?:x-amz-signature|x-amz-credential|x-amz-security-token|x-goog-signature"
    r"|x-goog-credential|sig|signature|token|access_token|api_key|apikey|key|client_secret"
    r"|password)=)[^&\s\"'#<>]+"
)
_TOKEN_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-+/=."
_CUT = " [... "  # how ``lines`` ends a line it cut: `` [... 1,234 more bytes]``


class Rule(NamedTuple):
    """One kind of secret: ``needs``, strings of which a line holds one if it may hold such a
    secret (a cheap test before the pattern; in lower case where ``lower``, else as written;
    empty: always tried); ``pattern`` and its replacement (a template, or a function of the
    match)."""

    name: str
    needs: tuple[str, ...]
    lower: bool
    pattern: re.Pattern[str]
    replace: str | Callable[[re.Match[str]], str]


def secret_name(name: str) -> bool:
    """Whether ``name`` names a secret (see :data:`SECRET_NAMES`, :data:`WHOLE_NAMES`)."""
    norm = name.lower().replace("-", "_").replace(".", "_")
    if norm in SECRET_NAMES or norm in WHOLE_NAMES:
        return True
    cut = norm.rfind("_")
    while cut > 0:
        if norm[cut + 1 :] in SECRET_NAMES:
            return True
        cut = norm.rfind("_", 0, cut)
    return False


def _named(m: re.Match[str]) -> str:
    if not secret_name(m.group(2)):
        return m.group(0)
    value = m.group(4)
    quote = value[0] if value[0] in "\"'" else ""
    if value.startswith(MASK, len(quote)):  # masked already (a query string's value, say)
        return m.group(0)
    return f"{m.group(1)}{m.group(2)}{m.group(3)}{quote}{MASK}{quote}"


def _hex(m: re.Match[str]) -> str:
    """40 hex digits: masked, unless part of a longer word, a commit id (after ``commit``) or a
    process group's name (after ``GUID``/``PG``: torch 2.13's DeviceMesh names its subgroups by a
    SHA-1 of their ranks, ``_hash_ranks_to_str``, which NCCL's lines and the failure rule need)."""
    before = m.string[max(m.start() - 8, 0) : m.start()]
    if before[-1:].isalnum():
        return m.group(0)
    word = before.rstrip(": ").lower()
    if word.endswith(("commit", "guid", "pg")):
        return m.group(0)
    return MASK


RULES: tuple[Rule, ...] = (
    Rule("query-string secret", ("?", "&", ";"), False, _QUERY, rf"\g<1>{MASK}"),
    Rule("secret-named value", _NAME_NEEDS, True, _NAME_VALUE, _named),
    Rule(
        "authorization header",
        ("authorization",),
        True,
        re.compile(
            r"(?i)\b((?:proxy-)?authorization[\"']?\s*[:=]\s*[\"']?(?:(?:bearer|basic|token|digest)\s+)?)"
            r"(?!\*\*\*)(?!(?:bearer|basic|token|digest)\s)[^\s\"',;]+"
        ),
        rf"\g<1>{MASK}",
    ),
    Rule(
        "bearer token",
        ("bearer",),
        True,
        re.compile(r"(?i)\b(bearer\s+)(?!\*\*\*)[A-Za-z0-9\-._~+/]+=*"),
        rf"\g<1>{MASK}",
    ),
    Rule(
        "AWS access key id",
        (),
        False,
        # From a literal "A", which the regular expression engine looks for fast.
        re.compile(r"A(?<![A-Z0-9]A)(KIA|SIA|GPA|IDA|ROA|IPA|NPA|NVA|PKA|BIA|CCA)[A-Z0-9]{16}(?![A-Z0-9])"),
        rf"A\g<1>{MASK}",
    ),
    Rule(
        "token of a known shape",
        ("hf_", "gh", "github_pat_", "AIza", "sk-", "wandb_v1_", "eyJ"),
        False,
        re.compile(
            r"\b(hf_|gh[pousr]_|github_pat_|AIza|sk-(?:ant-|proj-)?|wandb_v1_)[A-Za-z0-9_\-]{20,}"
            r"|\b(eyJ)[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]+"
        ),
        lambda m: f"{m.group(1) or m.group(2)}{MASK}",
    ),
    Rule("40 hex digits (a W&B key)", (), False, re.compile(r"[0-9a-f]{40}(?![0-9A-Za-z])"), _hex),
)


def _mask_cut(text: str) -> str:
    """A line cut short (``lines``) ends in a piece of a token that may be a secret's start,
    its shape lost: masked when it is 16 characters or more."""
    at = text.rfind(_CUT)
    if at < 0 or not text.endswith(" more bytes]"):
        return text
    head = text[:at]
    token = len(head) - len(head.rstrip(_TOKEN_CHARS))
    if token < 16:
        return text
    return head[: at - token] + MASK + text[at:]


def mask(text: str) -> str:
    """``text`` with every secret of :data:`RULES` masked (the same string when there is none)."""
    low = text.lower()
    for rule in RULES:
        needs = rule.needs
        if needs:
            seen = low if rule.lower else text
            for need in needs:
                if need in seen:
                    break
            else:
                continue
        masked = rule.pattern.sub(rule.replace, text)
        if masked is not text:  # (re gives the same string back where nothing matched)
            text, low = masked, masked.lower()
    if text.endswith(" more bytes]"):
        text = _mask_cut(text)
    return text
