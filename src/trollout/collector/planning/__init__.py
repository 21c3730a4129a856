"""Planning: from an input file (or rows) to the rollouts of a run, before anything is sent.

`plan.plan_rollouts` reads the whole input once to check it, then streams one
`records.MaterializedRow` per rollout in dispatch order: `input_file` reads and checks rows,
gives each task its identity and applies limit / task_ids / shard selection
(`task_selection`); `routing` picks each row's agent and environment server and fans out
repeats; `seeds` and `prompts` remove stale keys, apply overrides, the prompt and the seeds.
Every refusal happens here, before a file is touched or a request sent.
"""
