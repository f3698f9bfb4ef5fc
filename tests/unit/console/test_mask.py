"""Secrets in a rank's lines are masked before they leave the node, and ordinary lines are left
as they are (tables of cases: each rule, and lines that must not change)."""

from __future__ import annotations

import pytest

from ray_wandb_nodes._mask import RULES, mask, secret_name

KEY = "0123456789abcdef0123456789abcdef01234567"  # the shape of a W&B API key (40 hex digits)
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.SflKxwRJSMeKKF2QT4fw"

MASKED: list[tuple[str, str, str]] = [
    # W&B keys
    ("a W&B key in an environment dump", f"WANDB_API_KEY={KEY}", "WANDB_API_KEY=***"),
    ("a W&B key alone in a line", f"using key {KEY} now", "using key *** now"),
    ("an on-prem key keeps its prefix", f"local-{KEY}", "local-***"),
    ("a v1 key", "wandb_v1_" + "A1b2C3d4" * 10, "wandb_v1_***"),
    ("a JWT, which wandb takes as a key", f"key={JWT}", "key=eyJ***"),
    ("a JWT alone", f"got {JWT}", "got eyJ***"),
    ("a SHA-1 digest is a W&B key's shape", f"sha1 {KEY[::-1]}", "sha1 ***"),
    # cloud keys
    ("an AWS access key id keeps AKIA", "id AKIAIOSFODNN7EXAMPLE ok", "id AKIA*** ok"),
    ("a temporary one keeps ASIA", "ASIAY34FZKBOKMUTVV7A,", "ASIA***,"),
    (
        "aws_secret_access_key",
        "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        "aws_secret_access_key = ***",
    ),
    ("in upper case", "AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG", "AWS_SECRET_ACCESS_KEY=***"),
    (
        "an STS answer's JSON",
        '{"SecretAccessKey": "wJalr/K7MD", "SessionToken": "FwoGZX"}',
        '{"SecretAccessKey": "***", "SessionToken": "***"}',
    ),
    (
        "GCP's private_key in JSON",
        '{"private_key": "-----BEGIN PRIVATE KEY-----\\nMIIEvQIB\\n-----END PRIVATE KEY-----\\n", '
        '"client_email": "sa@p.iam"}',
        '{"private_key": "***", "client_email": "sa@p.iam"}',
    ),
    (
        "an Azure connection string's AccountKey",
        "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=abc+def/ghi==;EndpointSuffix=core.windows.net",
        "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=***;EndpointSuffix=core.windows.net",
    ),
    (
        "an Azure SAS's sig",
        "https://acct.blob.core.windows.net/c/b?sv=2022-11-02&ss=b&sig=abc%2Bdef%3D&se=2024",
        "https://acct.blob.core.windows.net/c/b?sv=2022-11-02&ss=b&sig=***&se=2024",
    ),
    (
        "a Python repr of secrets",
        "Namespace(lr=0.1, api_key='abc', password=hunter2)",
        "Namespace(lr=0.1, api_key='***', password=***)",
    ),
    ("a dict of them", "{'password': 'p@ss word', 'user': 'me'}", "{'password': '***', 'user': 'me'}"),
    ("a header's name", "X-Api-Key: 12345abcde", "X-Api-Key: ***"),
    # bearer tokens
    ("an Authorization header", f"Authorization: Bearer {JWT}", "Authorization: Bearer ***"),
    ("basic credentials", "Authorization: Basic dXNlcjpwYXNz", "Authorization: Basic ***"),
    ("in a dict", "headers={'Authorization': 'Bearer abc.def'}", "headers={'Authorization': 'Bearer ***'}"),
    ("a bearer token anywhere", "curl -H 'Bearer sometokenvalue123' url", "curl -H 'Bearer ***' url"),
    # URL signatures
    (
        "a presigned S3 URL",
        "https://b.s3.amazonaws.com/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F2024"
        "&X-Amz-Date=20240101T000000Z&X-Amz-Signature=abcdef0123&X-Amz-Security-Token=FQoGZXIvYXdz",
        "https://b.s3.amazonaws.com/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=***"
        "&X-Amz-Date=20240101T000000Z&X-Amz-Signature=***&X-Amz-Security-Token=***",
    ),
    (
        "a signed GCS URL",
        "https://storage.googleapis.com/b/o?X-Goog-Algorithm=GOOG4-RSA-SHA256&X-Goog-Credential=sa%40p&X-Goog-Signature=0a1b",
        "https://storage.googleapis.com/b/o?X-Goog-Algorithm=GOOG4-RSA-SHA256&X-Goog-Credential=***&X-Goog-Signature=***",
    ),
    (
        "a CloudFront signature",
        "https://d.cloudfront.net/f?Expires=1&Signature=Zm9v~bar&Key-Pair-Id=K2",
        "https://d.cloudfront.net/f?Expires=1&Signature=***&Key-Pair-Id=K2",
    ),
    ("a token in a link", "open https://h/x?user=a&token=s3cr3t#top", "open https://h/x?user=a&token=***#top"),
    ("an access_token in a link", "GET /api?access_token=s3cr3t HTTP/1.1", "GET /api?access_token=*** HTTP/1.1"),
    # tokens of known shapes
    ("a Hugging Face token", "HF token hf_abcdefghijklmnopqrstuvwxyzABCDEFGH loaded", "HF token hf_*** loaded"),
    ("HF_TOKEN= in an env dump", "HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyzABCDEFGH", "HF_TOKEN=***"),
    ("a GitHub token", "ghp_abcdefghijklmnopqrstuvwxyz0123456789", "ghp_***"),
    ("a fine-grained GitHub token", "github_pat_11ABCDEFG0abcdefghijkl_mnopqrstuvwxyz0123456789", "github_pat_***"),
    ("an OpenAI key", "sk-proj-abcdefghijklmnopqrstuvwxyz012345", "sk-proj-***"),
    ("a Google API key", "AIzaSyA1234567890abcdefghijklmnopqrstu", "AIza***"),
    # a line cut short
    (
        "a cut line's last token",
        "x" * 20 + " AKIAIOSFODNN7EXAMP [... 1,234 more bytes]",
        "x" * 20 + " *** [... 1,234 more bytes]",
    ),
]

UNCHANGED: list[tuple[str, str]] = [
    ("a training print", "step 000000123 loss 0.123 lr 3.0e-04 grad_norm 1.25"),
    ("a metrics dict", "{'loss': 0.23, 'accuracy': 0.91, 'epoch': 3, 'tokens_per_s': 51234.5}"),
    ("a tqdm bar", "Epoch 3: 100%|##########| 500/500 [01:23<00:00, 6.00it/s, loss=0.123, v_num=1]"),
    ("a traceback frame", '  File "/home/user/train.py", line 59, in train_loop'),
    ("a KeyError", "KeyError: 'learning_rate'"),
    ("tokenizer settings", "max_tokens=512 pad_token='<pad>' eos_token: </s> valid_token=3 num_tokens: 12"),
    ("a commit id, as git prints it", f"commit {KEY}"),
    ("a commit id after Commit:", f"Commit: {KEY}"),
    ("a DeviceMesh group's hashed name in NCCL's line", f"[PG ID 3 PG GUID {KEY}(mesh_dp) Rank 2] Watchdog caught"),
    ("a SHA-256 digest (64 hex digits)", "sha256:" + "ab" * 32),
    ("a hex word longer than 40", f"{KEY}ff"),
    ("a 39-digit hex word", KEY[:39]),
    ("a UUID", "run id 123e4567-e89b-12d3-a456-426614174000"),
    ("an ordinary URL with a query", "https://huggingface.co/api/models?search=bert&limit=5"),
    ("a time and a path", "12:00:01 /mnt/data/shard-00017.parquet"),
    ("AKIA in a word", "AKIAIOSFODNN7EXAMPLEXX is too long"),
    ("a short line cut", "short [... 12 more bytes]"),
    ("nothing at all", ""),
    ("the mask itself again", "password=*** Authorization: Bearer *** AKIA***"),
]


@pytest.mark.parametrize(("line", "expected"), [c[1:] for c in MASKED], ids=[c[0] for c in MASKED])
def test_a_secret_is_masked(line: str, expected: str) -> None:
    assert mask(line) == expected


@pytest.mark.parametrize("line", [c[1] for c in UNCHANGED], ids=[c[0] for c in UNCHANGED])
def test_an_ordinary_line_is_left_as_it_is(line: str) -> None:
    assert mask(line) == line


@pytest.mark.parametrize(("line", "expected"), [c[1:] for c in MASKED], ids=[c[0] for c in MASKED])
def test_masking_twice_changes_nothing_more(line: str, expected: str) -> None:
    assert mask(mask(line)) == expected


NAMES = [
    ("aws_secret_access_key", True), ("AWS_SECRET_ACCESS_KEY", True), ("X-Api-Key", True), ("db.password", True),
    ("client_secret", True), ("token", True), ("HF_TOKEN", True), ("x-amz-security-token", True),
    ("max_tokens", False), ("pad_token", False), ("valid_token", False), ("aws_access_key_id", False),
    ("key", False), ("learning_rate", False),
]  # fmt: skip


@pytest.mark.parametrize(("name", "secret"), NAMES, ids=[n for n, _ in NAMES])
def test_secret_names(name: str, secret: bool) -> None:
    assert secret_name(name) is secret


def test_every_rule_masks_at_least_one_case_of_the_table() -> None:
    # A rule that no case exercises is untested: each rule's pattern must fire on some line above.
    for rule in RULES:
        assert any(rule.pattern.search(line) for _, line, _ in MASKED), rule.name
