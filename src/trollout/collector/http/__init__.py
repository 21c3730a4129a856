"""The HTTP client: trollout's own HTTP/1.1 transport for ``POST /run``.

`transport.Http11Transport` keeps a keep-alive pool per endpoint; `exchange` sends and reads
on the socket under one deadline queue per transport; `http11` is the strict codec, `codings`
decodes gzip/deflate bounded, and `replies` is what callers see (`RawResponse` and the typed
errors of an exchange, in httpx's vocabulary).
"""
