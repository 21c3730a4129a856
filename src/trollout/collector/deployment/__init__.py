"""Deployment discovery: which servers a run talks to, and where each agent's rollouts go.

`discovery.discover` reads the head server's ``GET /global_config_dict_yaml`` (or takes
``--agent-url`` pairs) into an immutable `discovery.Deployment`: servers, routes, the
fingerprint a resume checks. `served_config` parses the served NeMo Gym config, resolving
interpolations only in the values trollout reads.
"""
