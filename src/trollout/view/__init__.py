"""`trollout view`: a local, read-only web page over run folders, to read every rollout.

What: ``trollout view RUN [RUN ...]`` indexes each run (an output file, its folder, or a glob
of shards) and serves, on loopback, a JSON API and one static page: the run page (what was run,
progress, metrics with intervals and pass@k, failure classes, health verdicts, latency, and a
sortable, filterable, searchable rollout table), a rollout page on its own URL (the prompt as a
conversation, the output items, reward and verifier fields, every attempt, enrichment, health
findings, the raw JSON on demand) and two runs side by side. While a collector writes the
folder the page follows it.

Architecture, bottom up:

- `runs` turns the command line's RUN arguments into runs (each one or more shards, each a
  `recovery.layout.RunLayout`), and opens run files read-only, never through a link, only
  regular files. The browser never names a path: every URL names a run by its number on the
  command line and a rollout by (shard, task, rollout), so a path outside the given folders
  cannot be asked for.
- `index` keeps, per run, one compact summary per rollout in parallel arrays (task, rollout,
  agent, reward, outcome, class, attempts, latency, health) and the byte offsets of its rows in
  the materialized inputs, the rollouts file, the failures sidecar and the verdicts file. It is
  built by one streaming pass over each file and kept current by tailing: each request re-stats
  the files and reads only the complete lines appended since (a line without its newline is
  being written: left for the next look). A file that shrank or was replaced starts the index
  afresh. Nothing is written and no lock is taken, so a collector is never disturbed. A rollout
  page reads its few lines by seek. Text search reads the files once per query (bytes first,
  then the string values of candidate rows), and remembers the last few answers.
- `api` routes the JSON requests and checks their parameters; `answers` computes each answer
  from an index: every answer is bounded (pages of at most 500 rows; strings cut at 8,000
  characters and lists at 200 items, each cut marked so the page offers "show more", which
  asks for the next slice of that one field).
- `server` serves the API and the page with `trollout.httpserver` (the project's strict Trio
  HTTP/1.1 server) on 127.0.0.1; another host is an explicit choice and warned about. Requests
  whose ``Host`` is not the address served are refused (a web page elsewhere cannot reach the
  API by rebinding a name to 127.0.0.1), and every reply forbids framing, sniffing and, by a
  Content-Security-Policy, any script but the page's own.
- ``static/``: ``index.html``, ``app.js`` and ``app.css``, package data (pyproject.toml), plain
  JavaScript and CSS: no CDN, no network, no build step. Everything from a run folder is data:
  the script builds the page with ``textContent`` and ``createElement``, never ``innerHTML``
  with a value from a row, so markup and scripts in a row show as text; control characters
  are shown as their escapes.

Why this server: the view reads files and answers small JSON requests; the project already
has a bounded HTTP/1.1 server on Trio (its runtime), written for the fake deployment, so the
view uses the same one (moved from ``testing/`` to a leaf, ``trollout/httpserver.py``, so that
serving a page does not load the test kit). Rejected: ``http.server`` (threads beside Trio
and an index to lock), aiohttp, Starlette or FastAPI (a framework and its dependencies for a
dozen read-only routes), server-sent events or WebSockets for live updates (the page polls a
small summary every 1.5 s while the run is open; a run that is closed is not polled).

Why these assets: one HTML file, one script, one stylesheet, written by hand. Rejected: a
front-end framework or a bundler (a build step at install, and a dependency tree to audit
for a page that lists rows), a CDN (the view must work offline and send nothing anywhere),
rendering HTML on the server (every view would be a page load; the table's sorting, paging
and live updates are simplest against a JSON API), and virtualised scrolling (paging with a
page size is bounded, simpler, and keeps URLs of a page shareable).

Rejected for the index: loading every row (NeMo Gym's reports do; 100,000 rollouts of a few
kilobytes each would not fit the 200 MiB goal), a database file beside the run (a write into
the run folder, or a cache to keep consistent with files still being appended), and holding
prompt and answer text for search (memory grows with the text; a search reads the files
instead, at disk speed, and only when asked).
"""

from __future__ import annotations

__all__: list[str] = []
