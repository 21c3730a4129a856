"""A fake NeMo Gym deployment on loopback, for tests, benchmarks and the demo.

In process (Trio)::

    async with open_fake_deployment("fixtures/demo_deployment.yaml") as fake:
        fake.head_url, fake.run_urls["math_agent"], fake.stats.max_in_flight

In a subprocess (any caller)::

    with spawn_fake_deployment("fixtures/demo_deployment.yaml") as urls:
        urls.head_url

or ``python -m trollout.testing serve --spec fixtures/demo_deployment.yaml``. It speaks
docs/protocol.md sections 1 to 4: episode environment servers (`EpisodeServerSpec`, `episodes`)
answer materialized task rows (`episode_task_rows`). Faults are scripted per request (`Fault`,
`FaultPlan`, a row's ``fake_fault`` field, or the fault hook: a callable given the request's
`FaultContext`, its index within its attempt included; `FaultScript` is the hook as a file,
which the fake in its own process follows too); answers come from a seeded policy (`policy`).
`trollout.testing.strategies` (needs hypothesis: the ``testing`` extra) draws fault sequences
per attempt for property tests of a driver's own code. `assert_exactly_once` (`audit`) checks
a run folder or a folder of shards, with the fake's request log (each entry names the batch
that sent it), for rollouts lost, duplicated or miscounted.
"""

from __future__ import annotations

from .aggregate import aggregate_metrics
from .audit import AuditReport, assert_exactly_once, audit_folder, audit_run
from .deployment import FAKE_API_KEY, FakeDeployment, FakeUrls, build_config, open_fake_deployment
from .fault_scripts import FaultScript, fault_to_dict, read_fault_script, write_fault_script
from .faults import (
    FAULT_FIELD,
    Fault,
    FaultContext,
    FaultFn,
    FaultKind,
    FaultPlan,
    fault_from_dict,
    plan_from_dict,
)
from .policy import answer_row, solve
from .process import serve_until_signal, spawn_fake_deployment
from .spec import (
    AgentSpec,
    DeploymentSpec,
    EpisodeServerSpec,
    Generation,
    Latency,
    load_spec,
    spec_from_dict,
    spec_to_dict,
)
from .stats import FakeStats, RunSeen
from .tasks import episode_task_rows, task_row, task_rows, write_episode_tasks, write_tasks

__all__ = [
    "FAKE_API_KEY",
    "FAULT_FIELD",
    "AgentSpec",
    "AuditReport",
    "DeploymentSpec",
    "EpisodeServerSpec",
    "FakeDeployment",
    "FakeStats",
    "FakeUrls",
    "Fault",
    "FaultContext",
    "FaultFn",
    "FaultKind",
    "FaultPlan",
    "FaultScript",
    "Generation",
    "Latency",
    "RunSeen",
    "aggregate_metrics",
    "answer_row",
    "assert_exactly_once",
    "audit_folder",
    "audit_run",
    "build_config",
    "episode_task_rows",
    "fault_from_dict",
    "fault_to_dict",
    "load_spec",
    "open_fake_deployment",
    "plan_from_dict",
    "read_fault_script",
    "serve_until_signal",
    "solve",
    "spawn_fake_deployment",
    "spec_from_dict",
    "spec_to_dict",
    "task_row",
    "task_rows",
    "write_episode_tasks",
    "write_fault_script",
    "write_tasks",
]
