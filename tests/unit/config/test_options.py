"""The table of options and what follows from it, option validation, and the callback object itself
(no cluster, no W&B)."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import pickle
import re
from typing import Any

import pytest

from ray_wandb_nodes import WandbNodesCallback, WandbNodesTuneCallback
from ray_wandb_nodes._config import options_doc as gen
from ray_wandb_nodes._config.options import (
    BY_NAME,
    OPTIONS,
    POSITIONAL,
    SECTIONS,
    TRAIN,
    TUNE,
    VAR_KEYWORD,
    Option,
    Options,
    build_options,
    options_of,
    resolve_mode,
)
from ray_wandb_nodes._config.values import Mode, NodeSelection, OnHang
from ray_wandb_nodes.offline.storage import Transfer

CLASSES = {TRAIN: WandbNodesCallback, TUNE: WandbNodesTuneCallback}

# the table ------------------------------------------------------------------------------------------


def as_compiled(annotation: str) -> str:
    """An annotation as Python keeps it under ``from __future__ import annotations`` (unparsed:
    ``Literal['a']`` where the source, formatted by ruff, has ``Literal["a"]``)."""
    return ast.unparse(ast.parse(annotation, mode="eval"))


def expected_params(callback: str) -> list[tuple[str, Any, Any, str]]:
    """(name, kind, default, annotation) of each ``__init__`` parameter after self, from the table alone:
    the callback's positional arguments in their order, then its other options in the table's order."""
    mine = [o for o in OPTIONS if callback in o.callbacks]
    first = [BY_NAME[n] for n in POSITIONAL[callback]]
    rest = [o for o in mine if o.name not in POSITIONAL[callback]]
    positional = inspect.Parameter.POSITIONAL_OR_KEYWORD
    out = [(o.name, positional, o.default_for(callback), as_compiled(o.annotation)) for o in first]
    for o in rest:
        if o.name == VAR_KEYWORD:
            out.append((o.name, inspect.Parameter.VAR_KEYWORD, inspect.Parameter.empty, as_compiled(o.annotation)))
        else:
            out.append((o.name, inspect.Parameter.KEYWORD_ONLY, o.default_for(callback), as_compiled(o.annotation)))
    return out


@pytest.mark.parametrize("callback", [TRAIN, TUNE])
def test_each_callbacks_signature_is_the_tables(callback: str) -> None:
    params = list(inspect.signature(CLASSES[callback].__init__).parameters.values())[1:]
    got = [(p.name, p.kind, p.default, p.annotation) for p in params]
    assert got == expected_params(callback), "run: python -m ray_wandb_nodes._config.options_doc"
    assert [name for name, *_ in got] == [o.name for o in options_of(callback)]


def args_entries(doc: str) -> list[tuple[str, str]]:
    """The (name, text) entries of a Google-style Args section, whitespace collapsed."""
    lines = inspect.cleandoc(doc).splitlines()
    start = lines.index("Args:") + 1
    entries: list[tuple[str, str]] = []
    for line in lines[start:]:
        if not line.strip():
            break
        entry = re.match(r"^    (\**\w+): (.*)$", line)
        if entry:
            entries.append((entry.group(1), entry.group(2)))
        else:
            assert line.startswith(" " * 8), f"not an Args line: {line!r}"
            entries[-1] = (entries[-1][0], f"{entries[-1][1]} {line.strip()}")
    return entries


@pytest.mark.parametrize("callback", [TRAIN, TUNE])
def test_each_callbacks_docstring_documents_each_of_its_options_by_the_table(callback: str) -> None:
    doc = CLASSES[callback].__doc__
    assert doc is not None
    want = [(("**" if o.name == VAR_KEYWORD else "") + o.name, " ".join(o.doc.split())) for o in options_of(callback)]
    assert args_entries(doc) == want, "run: python -m ray_wandb_nodes._config.options_doc"


@pytest.mark.parametrize("callback", [TRAIN, TUNE])
def test_the_docs_site_reads_the_same_args_statically(callback: str) -> None:
    # mkdocstrings reads docstrings from the source with griffe, never from the imported object.
    griffe = pytest.importorskip("griffe")
    path, class_name = gen.CALLBACKS[callback]
    pkg = griffe.load("ray_wandb_nodes", search_paths=[str(path.parent.parent)], allow_inspection=False)
    sections = pkg[f"{path.stem}.{class_name}"].docstring.parse("google")
    (params,) = [s.value for s in sections if s.kind.value == "parameters"]
    assert [(p.name, " ".join(p.description.split())) for p in params] == args_entries(CLASSES[callback].__doc__ or "")


@pytest.mark.parametrize("callback", [TRAIN, TUNE])
def test_the_generator_leaves_the_callbacks_source_as_it_is(callback: str) -> None:
    path, _ = gen.CALLBACKS[callback]
    source = path.read_text()
    assert gen.rewrite(source, callback) == source, "run: python -m ray_wandb_nodes._config.options_doc"


def test_the_options_page_is_the_generated_one() -> None:
    assert gen.PAGE.read_text() == gen.page(), "run: python -m ray_wandb_nodes._config.options_doc"
    assert gen.main(["--check"]) == 0


def test_the_options_page_has_each_option_once_in_its_section() -> None:
    text = gen.page()
    assert "python -m ray_wandb_nodes._config.options_doc" in text.split("\n## ")[0]  # how to regenerate, on top
    for key, (title, _) in SECTIONS.items():
        body = text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]
        rows = re.findall(r"^\| `\**(\w+)` \|", body, flags=re.M)
        assert rows == [o.name for o in OPTIONS if o.section == key]
    assert "| `log_config` | Train, Tune | `True` (Train), `False` (Tune) |" in text


def test_options_fields_are_the_tables_stored_options() -> None:
    stored = [o.name for o in OPTIONS if o.stored]
    assert [f.name for f in dataclasses.fields(Options)] == [*stored, "settings"]
    assert {o.name for o in OPTIONS if not o.stored} == {"api_key", "api_key_file"}  # secrets: the captured env
    assert all(o.section in SECTIONS and set(o.callbacks) <= {TRAIN, TUNE} and o.callbacks for o in OPTIONS)


def test_the_abort_warning_names_a_real_option() -> None:
    from ray_wandb_nodes._run.train_run import abort_uploads_warning

    text = abort_uploads_warning(10.0, ["checkpoint-r"], None)
    named = re.findall(r"\(([a-z_]+) bounds a run's end", text)
    assert named == ["upload_timeout"] and named[0] in BY_NAME


# One value each option does not take; every option of the table has one, but ``notes``, which
# takes any value as its str() (as wandb.init does).
ANY_VALUE = {"notes"}
BAD = {
    "project": "a/b",
    "entity": "",
    "group": 3,
    "name": " ",
    "tags": "one",
    "config": [1, 2],
    "log_config": "yes",
    "mode": "fast",
    "excludes": [1],
    "strategy": "rank",
    "rank_metrics": "mean",
    "rank_console": "errors",
    "nodes": "all",
    "sampling_interval_s": 0.05,
    "gpu_device_ids": [0, -1],
    "video_kwargs": [1],
    "image_kwargs": "gif",
    "upload_checkpoints": 1,
    "upload_timeout": 0,
    "straggler_metric": "",
    "straggler_mode": "mean",
    "straggler_threshold": 1.5,
    "straggler_window_s": float("inf"),
    "alerts": "on",
    "hang_timeout_s": "never",
    "on_hang": "kill",
    "init_timeout_s": -1,
    "finish_timeout_s": "10",
    "max_node_writers": 0,
    "offline_transfer": "s3",
    "egress": "proxy",
    "egress_hosts": ["storage.example.com/bucket"],
    "api_key": "",
    "api_key_file": 3,
    "wandb_init_kwargs": {"reinit": True},
}


def test_every_option_has_a_bad_value_case() -> None:
    assert set(BAD) | ANY_VALUE == set(BY_NAME) and not set(BAD) & ANY_VALUE
    assert build_options(notes=3).notes == "3"


@pytest.mark.parametrize("option", [o for o in OPTIONS if o.name not in ANY_VALUE], ids=lambda o: o.name)
def test_every_option_rejects_a_bad_value_naming_it_and_what_is_allowed(option: Option) -> None:
    value = BAD[option.name]
    callback = TRAIN if TRAIN in option.callbacks else TUNE
    kwargs = dict(value) if option.name == VAR_KEYWORD else {option.name: value}
    with pytest.raises(ValueError) as info:
        CLASSES[callback](**kwargs)
    text = str(info.value)
    if option.name == "api_key":  # a key is never shown, not even a bad one
        assert "invalid api_key (not shown)" in text
    elif option.name == VAR_KEYWORD:
        assert "reinit=True" in text
    else:
        assert f"invalid {option.name}={value!r}; expected " in text
        # the generic words are the page's "allowed" column; some checks say the case more closely
        assert option.check.allowed in text or option.name in ("project", "tags", "excludes")


def test_the_tune_callback_keeps_rays_log_config_default() -> None:
    assert build_options(callback=TUNE).log_config is False
    assert build_options(callback=TRAIN).log_config is True
    assert WandbNodesTuneCallback(project="p").options.log_config is False


def test_build_options_rejects_a_name_not_in_the_table() -> None:
    with pytest.raises(TypeError, match="upload_timeout_s"):
        build_options(upload_timeout_s=10)


# validation -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"mode": "shared"}, ["mode", "'shared'", "online, offline, disabled"]),
        ({"mode": "fast"}, ["mode", "'fast'", "online, offline, disabled"]),
        ({"nodes": "all"}, ["nodes", "'all'", "'workers', 'cluster'"]),
        ({"offline_transfer": "s3"}, ["offline_transfer", "'s3'", "'auto', 'ray', 'storage'"]),
        ({"sampling_interval_s": 0}, ["sampling_interval_s", "0", "greater than 0"]),
        ({"sampling_interval_s": -1.0}, ["sampling_interval_s", "-1.0"]),
        ({"sampling_interval_s": 0.05}, ["sampling_interval_s", "0.05", "at least 0.1"]),
        ({"sampling_interval_s": float("nan")}, ["sampling_interval_s", "nan"]),
        ({"init_timeout_s": 0}, ["init_timeout_s", "0"]),
        ({"finish_timeout_s": -5}, ["finish_timeout_s", "-5"]),
        ({"finish_timeout_s": "10"}, ["finish_timeout_s", "'10'"]),
        ({"gpu_device_ids": [0, -1]}, ["gpu_device_ids", "[0, -1]", ">= 0"]),
        ({"gpu_device_ids": "0,1"}, ["gpu_device_ids", "'0,1'"]),
        ({"project": "a/b"}, ["project", "'a/b'"]),
        ({"project": ""}, ["project", "''"]),
        ({"tags": "one"}, ["tags", "'one'", "list of strings"]),
        ({"excludes": [1]}, ["excludes", "[1]"]),
        ({"log_config": "yes"}, ["log_config", "'yes'"]),
        ({"config": [1, 2]}, ["config", "[1, 2]"]),
        ({"api_key": "x" * 40, "api_key_file": "/k"}, ["api_key", "api_key_file", "only one"]),
        ({"reinit": True}, ["reinit", "manages it"]),
        ({"resum": "allow"}, ["resum", "not a wandb.init parameter"]),
        ({"settings": {"x_primary": True}}, ["settings", "x_primary"]),
        ({"settings": 3}, ["settings", "3", "wandb.Settings"]),
        ({"straggler_metric": ""}, ["straggler_metric", "''", "non-empty string or None"]),
        ({"straggler_metric": 3}, ["straggler_metric", "3"]),
        ({"straggler_mode": "mean"}, ["straggler_mode", "'mean'", "'max'", "'min'"]),
        ({"straggler_threshold": 0}, ["straggler_threshold", "0", "(0, 1]"]),
        ({"straggler_threshold": 1.5}, ["straggler_threshold", "1.5", "(0, 1]"]),
        ({"straggler_threshold": True}, ["straggler_threshold", "True"]),
        ({"straggler_window_s": 0}, ["straggler_window_s", "0", "greater than 0"]),
        ({"alerts": "on"}, ["alerts", "'on'", "True or False"]),
    ],
)
def test_invalid_option_names_option_value_and_what_is_allowed(kwargs: dict[str, Any], names: list[str]) -> None:
    with pytest.raises(ValueError) as info:
        WandbNodesCallback(project=kwargs.pop("project", "p"), **kwargs)
    for text in names:
        assert text in str(info.value)


def test_api_key_is_never_echoed_in_errors() -> None:
    secret = "s" * 40
    with pytest.raises(ValueError) as info:
        WandbNodesCallback(project="p", api_key=secret, api_key_file="/some/file")
    assert secret not in str(info.value)
    with pytest.raises(ValueError) as info:
        WandbNodesCallback(project="p", settings={"api_key": secret})
    assert secret not in str(info.value)


def test_defaults() -> None:
    options = build_options()
    assert options.mode is Mode.ONLINE
    assert options.nodes is NodeSelection.WORKERS
    assert options.sampling_interval_s == 15.0
    assert options.log_config is True
    assert options.gpu_device_ids is None
    assert options.offline_transfer is Transfer.AUTO


@pytest.mark.parametrize(
    ("option", "env", "expected"),
    [
        (None, None, "online"),
        (None, "offline", "offline"),
        (None, "dryrun", "offline"),
        (None, "DISABLED", "disabled"),
        ("online", "offline", "online"),
        ("offline", None, "offline"),
    ],
)
def test_mode_comes_from_option_then_wandb_mode(option: str | None, env: str | None, expected: str) -> None:
    assert resolve_mode(option, env) is Mode(expected)


def test_bad_wandb_mode_in_env_is_named() -> None:
    with pytest.raises(ValueError, match="WANDB_MODE='turbo'"):
        resolve_mode(None, "turbo")


def test_wandb_mode_is_read_when_the_callback_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert WandbNodesCallback(project="p").options.mode is Mode.OFFLINE
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.setenv("WANDB_DISABLED", "true")
    assert WandbNodesCallback(project="p").options.mode is Mode.DISABLED


def test_settings_object_and_extra_init_kwargs_are_kept() -> None:
    import wandb

    cb = WandbNodesCallback(
        project="p", job_type="train", settings=wandb.Settings(x_file_stream_transmit_interval=2), gpu_device_ids=(1, 0)
    )
    assert cb.options.wandb_init_kwargs == {"job_type": "train"}
    assert cb.options.settings == {"x_file_stream_transmit_interval": 2}
    assert cb.options.gpu_device_ids == (1, 0)


def test_callback_pickles_with_its_options_and_captured_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:1")
    monkeypatch.setenv("WANDB_ENTITY", "team")
    cb = WandbNodesCallback(project="p", tags=["a"], excludes=["lr"], api_key="q" * 40)
    clone = pickle.loads(pickle.dumps(cb))
    assert clone.options == cb.options
    assert clone._env == cb._env
    assert clone._env.entity == "team" and clone._env.base_url == "http://127.0.0.1:1"
    assert clone._env.api_key is not None and clone._env.api_key.reveal() == "q" * 40
    assert clone._controller.run is None


def test_repr_never_shows_the_key() -> None:
    secret = "z" * 40
    cb = WandbNodesCallback(project="p", api_key=secret)
    assert secret not in repr(cb)
    assert secret not in repr(cb._env)
    assert secret not in repr(cb.__dict__)


def test_callback_is_a_train_v2_callback_and_not_a_user_callback() -> None:
    # A UserCallback would be routed only through Train's user-callback handler,
    # which never calls the controller and worker-group hooks the plugin needs.
    from ray.train import RunConfig, UserCallback

    cb = WandbNodesCallback(project="p")
    assert not isinstance(cb, UserCallback)
    assert RunConfig(callbacks=[cb]).callbacks == [cb]


@pytest.mark.parametrize("value", [0, -5, float("nan"), True, "soon", [60]])
def test_hang_timeout_s_rejects_what_is_no_timeout(value: object) -> None:
    with pytest.raises(ValueError, match=r"hang_timeout_s=.*expected a number of seconds > 0, \"auto\""):
        build_options(hang_timeout_s=value)


def test_hang_timeout_s_takes_seconds_auto_and_none() -> None:
    assert build_options().hang_timeout_s.auto and build_options().on_hang is OnHang.ALERT
    assert build_options(hang_timeout_s=" AUTO ").hang_timeout_s.auto
    assert build_options(hang_timeout_s=90).hang_timeout_s.seconds == 90.0
    assert not build_options(hang_timeout_s=None).hang_timeout_s.enabled
    assert build_options(on_hang="restart").on_hang is OnHang.RESTART
