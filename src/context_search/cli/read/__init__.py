"""Commands that read an index as a caller (``search``, ``explain``, ``get``, ``list``).

They share one promise: every read goes through the caller's ``--scope`` on the backend's
scoped path, so nothing here may show, count or title a document outside it.
"""
