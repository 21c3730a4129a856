"""Classification: a reply or an error becomes a `records.Landed` or `records.Failed`.

`outcomes` holds the rules for ``/run`` replies (sentinels, statuses, the echo check, failure
classes and kinds); `episodes` reads episode replies the same way. Pure functions over a
response: nothing here sends, waits or writes.
"""
