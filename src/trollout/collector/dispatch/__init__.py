"""Dispatch: one rollout's request loop, and the policy that decides every re-send.

`request.dispatch` sends one rollout under its time limit and turns what happened into an
outcome (through `..classify`); `retry` is the whole retry policy in one table: what is re-sent
and after how long, each endpoint's health (breaker, outage grace) and the run's retry budget.
"""
