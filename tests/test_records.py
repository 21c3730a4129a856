"""Records: an identity survives the row it stamps, field by field."""

from __future__ import annotations

import attrs
from hypothesis import given
from hypothesis import strategies as st

from trollout.records import DATASET_DIGEST, DIGEST, Identity

_TEXT = st.text(alphabet="abcxyz019-_.", min_size=1, max_size=8)


@st.composite
def identities(draw: st.DrawFn) -> Identity:
    """Any identity a collector writes: every optional field present or absent, all distinct."""
    # Provenance pairs come in PROVENANCE_KEYS order (how a row's task_data is read).
    provenance = tuple(
        (key, f"sha-{key}") for key in (DIGEST, DATASET_DIGEST) if draw(st.booleans())
    )
    task_id = draw(st.none() | st.builds(lambda t, i: {"taskset": t, "task_id": i}, _TEXT, _TEXT))
    return Identity(
        task_index=draw(st.integers(0, 10**6)),
        rollout_index=draw(st.integers(0, 10**3)),
        agent_name=draw(st.none() | _TEXT.map("agent-{}".format)),
        environment_server=draw(st.none() | _TEXT.map("env-{}".format)),
        result_type=draw(st.none() | _TEXT.map("type-{}".format)),
        rollout_id=draw(st.none() | _TEXT.map("rid-{}".format)),
        task_source=draw(st.none() | _TEXT.map("source-{}".format)),
        task_id=task_id,
        provenance=provenance,
        policy_model_server=draw(st.none() | _TEXT.map("model-{}".format)),
        run_id=draw(st.none() | _TEXT.map("run-{}".format)),
    )


@given(identities())
def test_identity_read_from_its_stamps_is_itself_field_by_field(identity: Identity) -> None:
    """`Identity.from_row` of the stamps an identity writes gives back every field, including
    those equality ignores (task_id, provenance, model server, run id)."""
    assert attrs.astuple(Identity.from_row(identity.stamps())) == attrs.astuple(identity)
