"""The manifest: fingerprints written before dispatch, and resume's check against them."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from trollout.collector.deployment.discovery import Deployment
from trollout.errors import ConfigError, RunChangedError, RunFolderError
from trollout.recovery.layout import RunLayout
from trollout.recovery.manifest import (
    FolderState,
    ManifestCheck,
    build_manifest,
    check_manifest,
    folder_state,
    locate_run,
    read_manifest,
    sha256_file,
    write_manifest,
)
from trollout.settings import RunConfig

URLS = {"math_agent": "http://127.0.0.1:1"}


@pytest.fixture
def layout(tmp_path: Path) -> RunLayout:
    """A run folder with an input file beside it."""
    (tmp_path / "in.jsonl").write_text('{"responses_create_params": {}}\n')
    return RunLayout.for_output(tmp_path / "run" / "r.jsonl")


def config(layout: RunLayout, **kw: object) -> RunConfig:
    """Return a config reading in.jsonl beside the run folder."""
    source = str(layout.output.parent.parent / "in.jsonl")
    return RunConfig(input_jsonl_fpath=source, output_jsonl_fpath=str(layout.output), **kw)  # type: ignore[arg-type]


def started(layout: RunLayout, cfg: RunConfig, deployment: Deployment) -> None:
    """Write the manifest of a run begun with cfg and deployment."""
    layout.output.parent.mkdir(parents=True, exist_ok=True)
    digest = sha256_file(cfg.input_jsonl_fpath or "")
    write_manifest(
        layout, build_manifest(cfg, deployment, input_sha256=digest, expected=4, tasks=2)
    )


def test_manifest_round_trip_keeps_settings_and_fingerprints(layout: RunLayout) -> None:
    """A written manifest reads back equal, with absolute paths and no per-session flags."""
    cfg = config(layout, num_repeats=2, resume_from_cache=True)
    deployment = Deployment.from_agent_urls(URLS)
    started(layout, cfg, deployment)
    manifest = read_manifest(layout)
    assert manifest is not None
    assert manifest.settings_sha256 == cfg.plan_fingerprint()
    assert manifest.deployment_sha256 == deployment.fingerprint()
    assert manifest.settings["num_repeats"] == 2
    assert Path(manifest.settings["input_jsonl_fpath"]).is_absolute()
    assert "resume_from_cache" not in manifest.settings
    assert manifest.deployment == {"agents": ["math_agent"], "environment_servers": []}
    assert len(manifest.run_id) == 16


def test_manifest_unchanged_run_passes(layout: RunLayout) -> None:
    """Same input, settings and agents: no change; non-plan settings may differ."""
    cfg = config(layout)
    deployment = Deployment.from_agent_urls(URLS)
    started(layout, cfg, deployment)
    manifest = read_manifest(layout)
    assert manifest is not None
    now = config(layout, num_samples_in_parallel=7, max_attempts=9)
    other_port = Deployment.from_agent_urls({"math_agent": "http://127.0.0.1:2"})
    check = ManifestCheck.of(now, other_port, input_sha256=sha256_file(now.input_jsonl_fpath or ""))
    assert check_manifest(layout, manifest, check, allow_unsafe=False) == []


def test_manifest_changes_are_named_and_refused(layout: RunLayout) -> None:
    """Input, num_repeats and agent set changes are each named in one refusal."""
    cfg = config(layout)
    started(layout, cfg, Deployment.from_agent_urls(URLS))
    manifest = read_manifest(layout)
    assert manifest is not None
    Path(cfg.input_jsonl_fpath or "").write_text('{"responses_create_params": {"x": 1}}\n')
    now = config(layout, num_repeats=3)
    more = Deployment.from_agent_urls({**URLS, "code_agent": "http://127.0.0.1:3"})
    check = ManifestCheck.of(now, more, input_sha256=sha256_file(now.input_jsonl_fpath or ""))
    with pytest.raises(RunChangedError) as info:
        check_manifest(layout, manifest, check, allow_unsafe=False)
    message = str(info.value)
    assert "input file" in message
    assert "in.jsonl" in message
    assert "num_repeats 1 -> 3" in message
    assert "agents added: code_agent" in message
    assert message.endswith("--allow-unsafe-resume to resume anyway")
    assert len(check_manifest(layout, manifest, check, allow_unsafe=True)) == 3


def test_manifest_of_an_earlier_version_stays_resumable(layout: RunLayout) -> None:
    """A manifest written before prompt_config existed, with the old fingerprint and the
    library's round-robin off, resumes under today's command line (round-robin on); a real
    plan change is still refused."""
    cfg = config(layout)
    deployment = Deployment.from_agent_urls(URLS)
    started(layout, cfg, deployment)
    manifest = read_manifest(layout)
    assert manifest is not None
    old_settings = {k: v for k, v in manifest.settings.items() if k != "prompt_config"}
    old = attrs.evolve(manifest, settings_sha256="0" * 64, settings=old_settings)
    now = config(layout, round_robin_agents=True, interleave_repeats=True)
    digest = sha256_file(now.input_jsonl_fpath or "")
    check = ManifestCheck.of(now, deployment, input_sha256=digest)
    assert check_manifest(layout, old, check, allow_unsafe=False) == []
    changed = ManifestCheck.of(
        config(layout, prompt_config="p.yaml"), deployment, input_sha256=digest
    )
    with pytest.raises(RunChangedError, match=r"prompt_config None -> 'p\.yaml'"):
        check_manifest(layout, old, changed, allow_unsafe=False)


def test_plan_fingerprint_of_unused_new_keys_is_unchanged(layout: RunLayout) -> None:
    """A key added to the fingerprint later changes it only when set."""
    plain = config(layout).plan_fingerprint()
    assert config(layout, prompt_config=None).plan_fingerprint() == plain
    assert config(layout, prompt_config="p.yaml").plan_fingerprint() != plain


def test_manifest_unreadable_is_a_run_folder_error(layout: RunLayout) -> None:
    """A damaged manifest is named; a missing one reads as None."""
    assert read_manifest(layout) is None
    layout.output.parent.mkdir(parents=True)
    layout.manifest.write_text("{not json")
    with pytest.raises(RunFolderError, match=r"manifest .* is damaged"):
        read_manifest(layout)


def test_manifest_folder_states(layout: RunLayout) -> None:
    """New, resumable, unmanifested (NeMo Gym) and broken folders are told apart."""
    layout.output.parent.mkdir(parents=True)
    assert folder_state(layout) is FolderState.NEW
    layout.materialized_inputs.write_text("{}\n")
    assert folder_state(layout) is FolderState.NEW  # inputs but no outcome: nothing to lose
    layout.failures.write_text('{"_ng_task_index": 0}\n')
    assert folder_state(layout) is FolderState.UNMANIFESTED
    layout.materialized_inputs.unlink()
    assert folder_state(layout) is FolderState.BROKEN
    layout.manifest.write_text("{}")
    assert folder_state(layout) is FolderState.BROKEN
    layout.materialized_inputs.write_text("{}\n")
    assert folder_state(layout) is FolderState.RESUMABLE


def test_manifest_locate_run_accepts_file_manifest_or_folder(layout: RunLayout) -> None:
    """RUN may be the output file, its manifest, or a folder holding one run."""
    folder = layout.output.parent
    folder.mkdir(parents=True)
    layout.manifest.write_text("{}")
    assert locate_run(layout.output) == layout
    assert locate_run(layout.manifest) == layout
    assert locate_run(folder) == layout
    (folder / "s_manifest.json").write_text("{}")
    with pytest.raises(ConfigError, match="several runs"):
        locate_run(folder)
    with pytest.raises(ConfigError, match="holds no run"):
        locate_run(folder.parent)
