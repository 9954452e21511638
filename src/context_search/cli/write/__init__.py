"""Commands that change what an index holds (``ingest``, ``reindex``, ``delete``,
``supersede``, ``rescope``, ``gap``).

They share the write-side concerns a reader never meets: validating before writing, who
may see a document after the write, and the job queue that finishes deferred work.
"""
